/*
 * Co-located guests on a direct channel, revoked and offered again midway:
 * three phases of messages of every class (TINY to LARGE), each checked for
 * order, length and bytes by the passive side, which answers each phase.
 * The active side waits for a line on stdin between phases (the test
 * revokes the channel, then offers it again, meanwhile) and prints the
 * library's direct-channel counters after each phase.
 *
 * XMX_EXPECT_DIRECT=1: each phase first waits (bounded) until the channel
 * state it expects is reached: open before phase 1, closed at least once
 * before phase 2, open a second time before phase 3.
 */

#include <unistd.h>

#include "xmx_test.h"

#define PER_PHASE 300
#define PHASES 3
static const uint32_t lens[] = {0, 17, 32, 100, 128, 1000, 4096, 5000, 32768, 40000, 200000};
#define NLENS (sizeof(lens) / sizeof(lens[0]))
#define MAXLEN 200000
#define REPLY_MATCH 0xfeed0000ull

static void report(const char *what) {
  printf("%s direct-sent=%u direct-received=%u opened=%u closed=%u broken=%u pulls=%u stalled=%u\n",
         what,
         test_counter("Direct frames sent"), test_counter("Direct frames received"),
         test_counter("Direct channels opened"), test_counter("Direct channels closed"),
         test_counter("Direct channels broken by the peer"), test_counter("Direct LARGE pulls"),
         test_counter("Direct LARGE pulls stalled"));
  fflush(stdout);
}

static int expect_direct(void) {
  const char *e = getenv("XMX_EXPECT_DIRECT");
  return e && strcmp(e, "1") == 0;
}

static void active(mx_endpoint_t ep, struct test_opts *o) {
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  unsigned char *bufs = malloc((size_t)PER_PHASE * MAXLEN);
  mx_request_t *reqs = calloc(PER_PHASE, sizeof(*reqs));
  EXPECT(bufs && reqs, "memory");
  char line[64];
  for (uint32_t phase = 0; phase < PHASES; phase++) {
    if (phase > 0) {
      EXPECT(fgets(line, sizeof(line), stdin) != NULL, "no go for phase %u", phase + 1);
    }
    if (expect_direct()) {
      if (phase == 0) test_wait_counter(ep, "Direct channels opened", 1);
      if (phase == 1) test_wait_counter(ep, "Direct channels closed", 1);
      if (phase == 2) test_wait_counter(ep, "Direct channels opened", 2);
    }
    for (uint32_t k = 0; k < PER_PHASE; k++) {
      uint32_t i = phase * PER_PHASE + k;
      uint32_t len = lens[i % NLENS];
      unsigned char *b = bufs + (size_t)k * MAXLEN;
      test_fill(b, len, i);
      mx_segment_t seg = {b, len};
      CHECK(mx_isend(ep, &seg, 1, peer, i, NULL, &reqs[k]));
    }
    printf("posted phase %u\n", phase + 1);
    fflush(stdout);
    for (uint32_t k = 0; k < PER_PHASE; k++) {
      mx_status_t s = test_wait(ep, &reqs[k]);
      EXPECT(s.code == MX_STATUS_SUCCESS, "send %u: %s", k, mx_strstatus(s.code));
    }
    uint32_t answer = 0;
    mx_segment_t seg = {&answer, sizeof(answer)};
    mx_request_t r;
    CHECK(mx_irecv(ep, &seg, 1, REPLY_MATCH | phase, ~0ull, NULL, &r));
    mx_status_t s = test_wait(ep, &r);
    EXPECT(s.code == MX_STATUS_SUCCESS && answer == (phase + 1) * PER_PHASE, "answer to phase %u",
           phase + 1);
    char what[32];
    snprintf(what, sizeof(what), "phase %u", phase + 1);
    report(what);
  }
  printf("sent %d messages in %d phases\n", PER_PHASE * PHASES, PHASES);
  free(bufs);
  free(reqs);
}

/* Messages of every class to this endpoint itself, checked. */
static void survive(mx_endpoint_t ep) {
  mx_endpoint_addr_t self;
  uint64_t nic;
  uint32_t eid;
  test_self(ep, &self, &nic, &eid);
  unsigned char *out = malloc(MAXLEN), *in = malloc(MAXLEN);
  EXPECT(out && in, "memory");
  for (uint32_t k = 0; k < NLENS; k++) {
    uint32_t len = lens[k];
    test_fill(out, len, 7000 + k);
    mx_segment_t so = {out, len}, si = {in, MAXLEN};
    mx_request_t rs, rr;
    CHECK(mx_irecv(ep, &si, 1, 0x5e1f0000ull | k, ~0ull, NULL, &rr));
    CHECK(mx_isend(ep, &so, 1, self, 0x5e1f0000ull | k, NULL, &rs));
    mx_status_t s = test_wait(ep, &rr);
    EXPECT(s.code == MX_STATUS_SUCCESS && s.xfer_length == len, "self message %u", k);
    test_verify(in, len, 7000 + k, "self");
    s = test_wait(ep, &rs);
    EXPECT(s.code == MX_STATUS_SUCCESS, "self send %u", k);
  }
  printf("endpoint works after the peer went\n");
  fflush(stdout);
  /* The test looks at this process's mappings before it ends. */
  char line[16];
  if (fgets(line, sizeof(line), stdin) == NULL) {
    /* stdin closed: nothing to wait for */
  }
  free(out);
  free(in);
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  unsigned char *b = malloc(MAXLEN);
  EXPECT(b, "memory");
  mx_endpoint_addr_t back;
  for (uint32_t i = 0; i < PER_PHASE * PHASES; i++) {
    mx_segment_t seg = {b, MAXLEN};
    mx_request_t r;
    CHECK(mx_irecv(ep, &seg, 1, 0, 0xffff0000ull, NULL, &r));
    mx_status_t s = test_wait(ep, &r);
    if (s.code != MX_STATUS_SUCCESS && getenv("XMX_SURVIVE_PEER")) {
      /* The peer is gone (destroyed): this endpoint must still work. */
      printf("lost message %u: %s\n", i, mx_strstatus(s.code));
      report("passive");
      survive(ep);
      free(b);
      return;
    }
    EXPECT(s.code == MX_STATUS_SUCCESS, "recv %u: %s", i, mx_strstatus(s.code));
    EXPECT(s.match_info == i, "message %u arrived in place of %u", (unsigned)s.match_info, i);
    EXPECT(s.xfer_length == lens[i % NLENS], "length of %u", i);
    test_verify(b, s.xfer_length, i, "direct");
    if ((i + 1) % PER_PHASE == 0) {
      uint32_t answer = i + 1;
      if (i + 1 == PER_PHASE) back = test_connect_back(ep, &s);
      mx_segment_t a = {&answer, sizeof(answer)};
      mx_request_t sr;
      CHECK(mx_isend(ep, &a, 1, back, REPLY_MATCH | (i / PER_PHASE), NULL, &sr));
      mx_status_t ss = test_wait(ep, &sr);
      EXPECT(ss.code == MX_STATUS_SUCCESS, "answer %u", i);
    }
  }
  printf("received %d messages in order\n", PER_PHASE * PHASES);
  report("passive");
  free(b);
}

int main(int argc, char **argv) { return test_run(argc, argv, active, passive); }
