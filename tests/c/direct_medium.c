/*
 * A full send window of the largest MEDIUM messages (32 KiB, 8 fragments
 * each) to a co-located peer that takes nothing meanwhile: more than the
 * direct channel's lane holds. What does not fit must go through the
 * backend whole, message by message; a message must never be split between
 * the lane and the backend (the backend sends a MEDIUM only once it has all
 * of its fragments, so a split one would reach the peer incomplete and wait
 * for a retransmission).
 *
 * The active side connects, exchanges one message each way (so that its
 * window is empty and its channel open), prints "ready" and waits for a
 * line on stdin (the test stops the passive process meanwhile). It then
 * posts WINDOW sends, waits until the library handed all their frames to
 * the transport, prints "posted direct-frames=N" (how many of them went
 * onto the channel) and waits for its sends and for the passive side's
 * answer. The passive side, let go by a line on stdin, receives the
 * messages in order and byte-exact, each wait bounded by WAIT_MS: run the
 * active side with a resend delay far longer than that, and a message left
 * incomplete fails the passive side instead of arriving late.
 */

#include "xmx_test.h"

#define WINDOW 16 /* the library's send window: all of it leaves at once */
#define LEN 32768 /* the largest MEDIUM */
#define FRAGS 8
#define MATCH 0x3d00000000ull
#define HELLO 0x3e00000000ull
#define ANSWER 0x3f00000000ull
#define WAIT_MS 20000

static void wait_bounded(mx_endpoint_t ep, mx_request_t *r, const char *what, uint32_t i) {
  mx_status_t s;
  uint32_t result = 0;
  CHECK(mx_wait(ep, r, WAIT_MS, &s, &result));
  EXPECT(result == 1, "%s %u did not complete in %d ms", what, i, WAIT_MS);
  EXPECT(s.code == MX_STATUS_SUCCESS, "%s %u: %s", what, i, mx_strstatus(s.code));
}

static void active(mx_endpoint_t ep, struct test_opts *o) {
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  uint32_t word = 1;
  mx_segment_t ws = {&word, sizeof(word)};
  mx_request_t r;
  CHECK(mx_isend(ep, &ws, 1, peer, HELLO, NULL, &r));
  wait_bounded(ep, &r, "hello", 0);
  CHECK(mx_irecv(ep, &ws, 1, HELLO, ~0ull, NULL, &r));
  wait_bounded(ep, &r, "hello back", 0);
  test_wait_counter(ep, "Direct channels opened", 1);
  printf("ready\n");
  fflush(stdout);
  char line[16];
  EXPECT(fgets(line, sizeof(line), stdin) != NULL, "no go");

  static unsigned char bufs[WINDOW][LEN];
  mx_request_t reqs[WINDOW];
  uint32_t frames = test_counter("Frames sent");
  uint32_t direct = test_counter("Direct frames sent");
  for (uint32_t i = 0; i < WINDOW; i++) {
    test_fill(bufs[i], LEN, 900 + i);
    mx_segment_t seg = {bufs[i], LEN};
    CHECK(mx_isend(ep, &seg, 1, peer, MATCH | i, NULL, &reqs[i]));
  }
  test_wait_counter(ep, "Frames sent", frames + WINDOW * FRAGS);
  printf("posted direct-frames=%u\n", test_counter("Direct frames sent") - direct);
  fflush(stdout);
  for (uint32_t i = 0; i < WINDOW; i++) wait_bounded(ep, &reqs[i], "send", i);
  CHECK(mx_irecv(ep, &ws, 1, ANSWER, ~0ull, NULL, &r));
  wait_bounded(ep, &r, "answer", 0);
  EXPECT(word == WINDOW, "the passive side received %u messages, not %d", word, WINDOW);
  printf("sent %d messages of %d bytes\n", WINDOW, LEN);
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  static unsigned char buf[LEN];
  uint32_t word = 0;
  mx_segment_t ws = {&word, sizeof(word)};
  mx_request_t r;
  CHECK(mx_irecv(ep, &ws, 1, HELLO, ~0ull, NULL, &r));
  mx_status_t s;
  uint32_t result = 0;
  CHECK(mx_wait(ep, &r, WAIT_MS, &s, &result));
  EXPECT(result == 1 && s.code == MX_STATUS_SUCCESS, "hello");
  mx_endpoint_addr_t back = test_connect_back(ep, &s);
  CHECK(mx_isend(ep, &ws, 1, back, HELLO, NULL, &r));
  wait_bounded(ep, &r, "hello back", 0);
  printf("ready\n");
  fflush(stdout);
  char line[16];
  EXPECT(fgets(line, sizeof(line), stdin) != NULL, "no go");
  for (uint32_t i = 0; i < WINDOW; i++) {
    mx_segment_t seg = {buf, LEN};
    /* Any message of the window: the first to arrive must be the next one. */
    CHECK(mx_irecv(ep, &seg, 1, MATCH, 0xff00000000ull, NULL, &r));
    result = 0;
    CHECK(mx_wait(ep, &r, WAIT_MS, &s, &result));
    EXPECT(result == 1, "message %u of %d did not arrive in %d ms", i, WINDOW, WAIT_MS);
    EXPECT(s.code == MX_STATUS_SUCCESS, "message %u: %s", i, mx_strstatus(s.code));
    EXPECT(s.match_info == (MATCH | i), "message %u came as %llx", i,
           (unsigned long long)s.match_info);
    EXPECT(s.xfer_length == LEN, "message %u: %u bytes", i, s.xfer_length);
    test_verify(buf, LEN, 900 + i, "medium");
  }
  word = WINDOW;
  CHECK(mx_isend(ep, &ws, 1, back, ANSWER, NULL, &r));
  wait_bounded(ep, &r, "answer", 0);
  printf("received %d messages in order\n", WINDOW);
}

int main(int argc, char **argv) { return test_run(argc, argv, active, passive); }
