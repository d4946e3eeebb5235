/*
 * A two-way stream across a migration: the active side sends COUNT messages
 * (every class, LARGE included) with WINDOW of them in flight, the passive
 * side answers each with a reply of another class. Both sides check that
 * every message arrives once, in order, with its length and bytes, so a
 * message lost, duplicated or damaged while one side moves to another host
 * fails the run. The passive side reports its progress ("received N") so a
 * test can move it in the middle, and at the end the longest gap between two
 * messages it received (what a move costs the application). COUNT is XMX_TEST_COUNT (default 4000);
 * XMX_TEST_LARGE=0 makes the largest messages 32 KiB (MEDIUM) instead of
 * 40000 bytes (LARGE). With XMX_TEST_DIRECT=1 the passive side waits,
 * after its first reply, until a direct channel to its co-located peer is up.
 * At the end each side prints what went by direct channels.
 */

#include "xmx_test.h"

#include <time.h>

static uint64_t now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000u + (uint64_t)t.tv_nsec / 1000u;
}

#define WINDOW 8
#define MAXLEN 40000
#define REPLY_SEED 1000003u
static uint32_t lens[] = {0, 17, 200, 5000, 40000};
static uint32_t reply_lens[] = {40000, 5000, 3, 100, 0};
#define NLENS (sizeof(lens) / sizeof(lens[0]))

/* With XMX_TEST_LARGE=0, no LARGE message: the biggest become MEDIUM. */
static void choose_lengths(void) {
  const char *v = getenv("XMX_TEST_LARGE");
  if (v && atoi(v) == 0) {
    lens[NLENS - 1] = 32768;
    reply_lens[0] = 32768;
  }
}

/* XMX_TEST_DIRECT=1: the two start co-located and talk over a direct
   channel before anything moves (the passive side waits for it). */
static int direct_wanted(void) {
  const char *v = getenv("XMX_TEST_DIRECT");
  return v && atoi(v) == 1;
}

static uint32_t count(void) {
  choose_lengths();
  const char *v = getenv("XMX_TEST_COUNT");
  long n = v ? atol(v) : 4000;
  EXPECT(n > 0 && n <= 1000000, "XMX_TEST_COUNT=%s", v ? v : "");
  return (uint32_t)n;
}

static void check_reply(const mx_status_t *s, const unsigned char *b, uint32_t i) {
  EXPECT(s->code == MX_STATUS_SUCCESS, "reply %u: %s", i, mx_strstatus(s->code));
  EXPECT(s->match_info == i, "reply %u arrived in place of %u", (unsigned)s->match_info, i);
  EXPECT(s->xfer_length == reply_lens[i % NLENS], "length of reply %u", i);
  test_verify(b, s->xfer_length, i + REPLY_SEED, "reply");
}

static void active(mx_endpoint_t ep, struct test_opts *o) {
  uint32_t n = count();
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  unsigned char *out = malloc((size_t)WINDOW * MAXLEN);
  unsigned char *in = malloc((size_t)WINDOW * MAXLEN);
  mx_request_t sends[WINDOW], recvs[WINDOW];
  EXPECT(out && in, "memory");
  for (uint32_t i = 0; i < n + WINDOW; i++) {
    if (i >= WINDOW) {
      uint32_t j = i - WINDOW, k = j % WINDOW;
      mx_status_t s = test_wait(ep, &sends[k]);
      EXPECT(s.code == MX_STATUS_SUCCESS, "send %u: %s", j, mx_strstatus(s.code));
      s = test_wait(ep, &recvs[k]);
      check_reply(&s, in + (size_t)k * MAXLEN, j);
    }
    if (i >= n) {
      continue;
    }
    uint32_t k = i % WINDOW;
    mx_segment_t rseg = {in + (size_t)k * MAXLEN, MAXLEN};
    CHECK(mx_irecv(ep, &rseg, 1, i, MX_MATCH_MASK_NONE, NULL, &recvs[k]));
    uint32_t len = lens[i % NLENS];
    test_fill(out + (size_t)k * MAXLEN, len, i);
    mx_segment_t seg = {out + (size_t)k * MAXLEN, len};
    CHECK(mx_isend(ep, &seg, 1, peer, i, NULL, &sends[k]));
  }
  printf("sent %u messages, %u replies checked\n", n, n);
  free(out);
  free(in);
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  uint32_t n = count();
  unsigned char *b = malloc(MAXLEN);
  unsigned char *out = malloc((size_t)WINDOW * MAXLEN);
  mx_request_t sends[WINDOW];
  mx_endpoint_addr_t peer;
  uint64_t last = 0, longest = 0;
  EXPECT(b && out, "memory");
  for (uint32_t i = 0; i < n; i++) {
    mx_segment_t seg = {b, MAXLEN};
    mx_request_t r;
    CHECK(mx_irecv(ep, &seg, 1, 0, 0, NULL, &r));
    mx_status_t s = test_wait(ep, &r);
    EXPECT(s.code == MX_STATUS_SUCCESS, "recv %u: %s", i, mx_strstatus(s.code));
    EXPECT(s.match_info == i, "message %u arrived in place of %u", (unsigned)s.match_info, i);
    EXPECT(s.xfer_length == lens[i % NLENS], "length of %u", i);
    test_verify(b, s.xfer_length, i, "stream");
    uint64_t t = now_us();
    if (i > 0 && t - last > longest) {
      longest = t - last;
    }
    last = t;
    if (i == 0) {
      peer = test_connect_back(ep, &s);
    }
    uint32_t k = i % WINDOW;
    if (i >= WINDOW) {
      mx_status_t d = test_wait(ep, &sends[k]);
      EXPECT(d.code == MX_STATUS_SUCCESS, "reply %u: %s", i - WINDOW, mx_strstatus(d.code));
    }
    uint32_t len = reply_lens[i % NLENS];
    test_fill(out + (size_t)k * MAXLEN, len, i + REPLY_SEED);
    mx_segment_t rs = {out + (size_t)k * MAXLEN, len};
    CHECK(mx_isend(ep, &rs, 1, peer, i, NULL, &sends[k]));
    if (i == 0 && direct_wanted()) {
      /* The first reply offered the channel (or the peer's first message did). */
      test_wait_counter(ep, "Direct channels opened", 1);
      printf("direct channel up\n");
      fflush(stdout);
    }
    if ((i + 1) % 250 == 0) {
      printf("received %u\n", i + 1);
      fflush(stdout);
    }
  }
  for (uint32_t i = n > WINDOW ? n - WINDOW : 0; i < n; i++) {
    mx_status_t d = test_wait(ep, &sends[i % WINDOW]);
    EXPECT(d.code == MX_STATUS_SUCCESS, "reply %u: %s", i, mx_strstatus(d.code));
  }
  printf("received %u messages in order, every reply sent\n", n);
  printf("longest gap %llu us\n", (unsigned long long)longest);
  free(b);
  free(out);
}

/* What went by a direct channel to a co-located peer, and how many channels
   came and went (a move must end a channel before the guests part). */
static void report_direct(void) {
  printf("direct: %u frames sent, %u received, %u channels opened, %u closed\n",
         test_counter("Direct frames sent"), test_counter("Direct frames received"),
         test_counter("Direct channels opened"), test_counter("Direct channels closed"));
}

static void active_then_report(mx_endpoint_t ep, struct test_opts *o) {
  active(ep, o);
  report_direct();
}

static void passive_then_report(mx_endpoint_t ep, struct test_opts *o) {
  /* Whoever starts the sender waits for this: a connect to an endpoint not open yet is
     refused at once, as MX's is. */
  printf("listening\n");
  fflush(stdout);
  passive(ep, o);
  report_direct();
}

int main(int argc, char **argv) {
  return test_run(argc, argv, active_then_report, passive_then_report);
}
