/*
 * Background progression, from a single thread: an endpoint answers
 * connects and acks while the program waits on another endpoint, unless its
 * progression is disabled. Needs no peer.
 */

#include "xmx_test.h"

int main(int argc, char **argv) {
  (void)argc;
  CHECK(mx_init());
  mx_endpoint_t a = test_open(ACTIVE_EID), b = test_open(PASSIVE_EID);
  uint64_t nic;
  mx_endpoint_addr_t addr;
  CHECK(mx_board_number_to_nic_id(0, &nic));

  /* Nobody progresses b: the connect cannot be answered. */
  CHECK(mx_disable_progression(b));
  mx_error_handler_t old = mx_set_error_handler(MX_ERRORS_RETURN);
  mx_return_t r = mx_connect(a, nic, PASSIVE_EID, TEST_KEY, 50, &addr);
  EXPECT(r == MX_TIMEOUT, "connect to a stalled endpoint: %s", mx_strerror(r));
  mx_set_error_handler(old);

  /* The background answers for b once allowed. */
  CHECK(mx_reenable_progression(b));
  CHECK(mx_connect(a, nic, PASSIVE_EID, TEST_KEY, MX_INFINITE, &addr));

  /* A LARGE message completes on b while only b is waited on: a's side
   * (the pull's notification and its ack) progresses in the background. */
  static unsigned char out[300000], in[300000];
  test_fill(out, sizeof(out), 5);
  mx_segment_t sseg = {out, sizeof(out)}, rseg = {in, sizeof(in)};
  mx_request_t sreq, rreq;
  CHECK(mx_irecv(b, &rseg, 1, 9, MX_MATCH_MASK_NONE, NULL, &rreq));
  CHECK(mx_isend(a, &sseg, 1, addr, 9, NULL, &sreq));
  mx_status_t s = test_wait(b, &rreq);
  EXPECT(s.code == MX_STATUS_SUCCESS && s.xfer_length == sizeof(in), "LARGE received");
  test_verify(in, sizeof(in), 5, "LARGE data");
  s = test_wait(a, &sreq);
  EXPECT(s.code == MX_STATUS_SUCCESS, "LARGE sent");

  /* An explicit mx_progress works while background progression is off. */
  CHECK(mx_disable_progression(b));
  mx_segment_t tiny = {out, 8};
  CHECK(mx_irecv(b, &rseg, 1, 10, MX_MATCH_MASK_NONE, NULL, &rreq));
  CHECK(mx_isend(a, &tiny, 1, addr, 10, NULL, &sreq));
  uint32_t result = 0;
  while (!result) {
    CHECK(mx_progress(b));
    CHECK(mx_test(b, &rreq, &s, &result));
  }
  EXPECT(s.xfer_length == 8, "received through mx_progress");
  test_wait(a, &sreq);
  CHECK(mx_reenable_progression(b));

  CHECK(mx_close_endpoint(a));
  CHECK(mx_close_endpoint(b));
  CHECK(mx_finalize());
  printf("PASS %s\n", argv[0]);
  return 0;
}
