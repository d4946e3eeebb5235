/*
 * A stream of MEDIUM messages of the largest MEDIUM size, sent back to back
 * with up to SEND_DEPTH in flight: a full send window of them is more than
 * a direct channel's ring holds, so a sender outrunning its receiver finds
 * the ring full in the middle of a message. The passive side checks every
 * message's order, length and bytes, with each wait bounded, and prints the
 * elapsed time and how many frames came over a direct channel. The whole
 * stream fits in a receiver's unexpected-message memory (64 MiB), so no
 * message is refused however far the sender runs ahead.
 */

#include <time.h>

#include "xmx_test.h"

#define COUNT 1500
#define LEN 32768 /* the largest MEDIUM */
#define SEND_DEPTH 64
#define RECV_DEPTH 8
#define WAIT_MS 30000

static mx_status_t wait_bounded(mx_endpoint_t ep, mx_request_t *req, const char *what, uint32_t i) {
  mx_status_t s;
  uint32_t result = 0;
  CHECK(mx_wait(ep, req, WAIT_MS, &s, &result));
  if (!result) {
    /* Which path lost the message: the lane, the backend, or a post that found no room. */
    const char *labels[] = {"Frames sent", "Frames received", "Direct frames sent",
                            "Direct frames received", "Sends dropped for lack of room"};
    for (size_t k = 0; k < sizeof(labels) / sizeof(labels[0]); k++)
      fprintf(stderr, "%s: %u\n", labels[k], test_counter(labels[k]));
  }
  EXPECT(result, "%s %u not done within %d ms", what, i, WAIT_MS);
  EXPECT(s.code == MX_STATUS_SUCCESS, "%s %u: %s", what, i, mx_strstatus(s.code));
  return s;
}

static void active(mx_endpoint_t ep, struct test_opts *o) {
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  /* The stream is about the channel: sent before it opens (a loaded host), the
   * first messages would go through the backend, where a receive queue the
   * sender outruns drops fragments and only a retransmission brings them. */
  test_wait_counter(ep, "Direct channels opened", 1);
  unsigned char *bufs = malloc((size_t)SEND_DEPTH * LEN);
  mx_request_t reqs[SEND_DEPTH];
  EXPECT(bufs, "memory");
  for (uint32_t i = 0; i < COUNT + SEND_DEPTH; i++) {
    uint32_t slot = i % SEND_DEPTH;
    if (i >= SEND_DEPTH) wait_bounded(ep, &reqs[slot], "send", i - SEND_DEPTH);
    if (i >= COUNT) continue;
    unsigned char *b = bufs + (size_t)slot * LEN;
    test_fill(b, LEN, i);
    mx_segment_t seg = {b, LEN};
    CHECK(mx_isend(ep, &seg, 1, peer, i, NULL, &reqs[slot]));
  }
  printf("sent %d messages\n", COUNT);
  free(bufs);
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  unsigned char *bufs = malloc((size_t)RECV_DEPTH * LEN);
  mx_request_t reqs[RECV_DEPTH];
  EXPECT(bufs, "memory");
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (uint32_t i = 0; i < RECV_DEPTH; i++) {
    mx_segment_t seg = {bufs + (size_t)i * LEN, LEN};
    CHECK(mx_irecv(ep, &seg, 1, 0, 0, NULL, &reqs[i]));
  }
  for (uint32_t i = 0; i < COUNT; i++) {
    uint32_t slot = i % RECV_DEPTH;
    mx_status_t s = wait_bounded(ep, &reqs[slot], "receive", i);
    EXPECT(s.match_info == i, "message %u arrived in place of %u", (unsigned)s.match_info, i);
    EXPECT(s.xfer_length == LEN, "length of %u: %u", i, s.xfer_length);
    test_verify(bufs + (size_t)slot * LEN, LEN, i, "medium stream");
    if (i + RECV_DEPTH < COUNT) {
      mx_segment_t seg = {bufs + (size_t)slot * LEN, LEN};
      CHECK(mx_irecv(ep, &seg, 1, 0, 0, NULL, &reqs[slot]));
    }
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
  printf("received %d messages in order in %.0f ms direct-received=%u\n", COUNT, ms,
         test_counter("Direct frames received"));
  free(bufs);
}

int main(int argc, char **argv) { return test_run(argc, argv, active, passive); }
