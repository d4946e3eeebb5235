/*
 * A sender's last words: MX completes an eager send once it is buffered, so
 * an application may close its endpoint and exit while its last messages
 * are still on their way. They must arrive all the same.
 *
 * The active side connects and waits (bounded) until its direct channel to
 * the passive side is open, prints "ready" and waits for a line on stdin
 * (the test stops the passive process meanwhile), then posts a burst of
 * messages of every eager class, waits for their completions, prints its
 * direct-channel counter and exits, closing its endpoint. The passive side
 * serves ROUNDS such senders in turn (each a new process): for each, it
 * prints "waiting for burst N" and waits for a line on stdin without
 * touching its endpoint (the test lets it go once its library closed the
 * channel), then receives the burst: every message in order and
 * byte-exact, each wait bounded.
 */

#include "xmx_test.h"

#define BURST 16 /* the send window: all of it leaves at once */
#define MATCH 0x1a00000000ull
static const uint32_t lens[] = {0, 32, 128, 1024, 4096, 12000};
#define NLENS (sizeof(lens) / sizeof(lens[0]))
#define MAXLEN 12000
#define WAIT_MS 10000
#define ROUNDS 3

static void active(mx_endpoint_t ep, struct test_opts *o) {
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  test_wait_counter(ep, "Direct channels opened", 1);
  printf("ready\n");
  fflush(stdout);
  char line[16];
  if (fgets(line, sizeof(line), stdin) == NULL) {
    /* stdin closed: go on at once */
  }
  static unsigned char bufs[BURST][MAXLEN];
  mx_request_t reqs[BURST];
  for (uint32_t i = 0; i < BURST; i++) {
    uint32_t len = lens[i % NLENS];
    test_fill(bufs[i], len, 500 + i);
    mx_segment_t seg = {bufs[i], len};
    CHECK(mx_isend(ep, &seg, 1, peer, MATCH | i, NULL, &reqs[i]));
  }
  for (uint32_t i = 0; i < BURST; i++) {
    mx_status_t s = test_wait(ep, &reqs[i]);
    EXPECT(s.code == MX_STATUS_SUCCESS, "send %u: %s", i, mx_strstatus(s.code));
  }
  printf("burst of %d sent, direct-sent=%u\n", BURST, test_counter("Direct frames sent"));
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  static unsigned char buf[MAXLEN];
  for (int round = 1; round <= ROUNDS; round++) {
    printf("waiting for burst %d\n", round);
    fflush(stdout);
    char line[16];
    if (fgets(line, sizeof(line), stdin) == NULL) {
      /* stdin closed: go on at once */
    }
    for (uint32_t i = 0; i < BURST; i++) {
      mx_segment_t seg = {buf, MAXLEN};
      mx_request_t r;
      /* Any message of the burst: the first to arrive must be the next one. */
      CHECK(mx_irecv(ep, &seg, 1, MATCH, 0xff00000000ull, NULL, &r));
      mx_status_t s;
      uint32_t result = 0;
      CHECK(mx_wait(ep, &r, WAIT_MS, &s, &result));
      EXPECT(result == 1, "burst %d: message %u of %d did not arrive", round, i, BURST);
      EXPECT(s.code == MX_STATUS_SUCCESS, "burst %d: message %u: %s", round, i,
             mx_strstatus(s.code));
      EXPECT(s.match_info == (MATCH | i), "burst %d: message %u came as %llx", round, i,
             (unsigned long long)s.match_info);
      uint32_t len = lens[i % NLENS];
      EXPECT(s.xfer_length == len, "burst %d: message %u: %u bytes, not %u", round, i,
             s.xfer_length, len);
      test_verify(buf, len, 500 + i, "burst");
    }
    printf("received burst %d\n", round);
    fflush(stdout);
  }
}

int main(int argc, char **argv) { return test_run(argc, argv, active, passive); }
