/*
 * mx_cancel (a pending receive is withdrawn; a matched one is not; a send
 * cannot be cancelled), mx_forget, mx_context, mx_ipeek and mx_peek.
 */

#include "xmx_test.h"

static void active(mx_endpoint_t ep, struct test_opts *o) {
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  char buf[64];
  mx_segment_t seg = {buf, sizeof(buf)};
  mx_request_t r, r2;
  uint32_t result = 7;
  mx_status_t s;

  /* A receive nothing matched yet is withdrawn and freed. */
  CHECK(mx_irecv(ep, &seg, 1, 100, MX_MATCH_MASK_NONE, (void *)0x1234, &r));
  void *ctx = NULL;
  CHECK(mx_context(&r, &ctx));
  EXPECT(ctx == (void *)0x1234, "context of a pending request");
  CHECK(mx_cancel(ep, &r, &result));
  EXPECT(result == 1 && r == NULL, "pending receive cancelled");

  /* Sends cannot be cancelled; forgetting one is fine. */
  mx_error_handler_t old = mx_set_error_handler(MX_ERRORS_RETURN);
  CHECK(mx_issend(ep, &seg, 1, peer, 200, NULL, &r2));
  EXPECT(mx_cancel(ep, &r2, &result) == MX_CANCEL_NOT_SUPPORTED, "send cancel refused");
  CHECK(mx_forget(ep, &r2));
  EXPECT(r2 == NULL, "forgotten request cleared");
  mx_set_error_handler(old);

  /* A matched receive is too late to cancel. Sends below are forgotten
   * at once (mx_forget), so the first completion peeked is the receive. */
  CHECK(mx_irecv(ep, &seg, 1, 101, MX_MATCH_MASK_NONE, NULL, &r));
  mx_segment_t none = {NULL, 0};
  mx_request_t sent;
  CHECK(mx_isend(ep, &none, 1, peer, 1, NULL, &sent));
  CHECK(mx_forget(ep, &sent));
  mx_request_t peeked = NULL;
  CHECK(mx_peek(ep, MX_INFINITE, &peeked, &result));
  EXPECT(result == 1 && peeked == r, "peek finds the completed receive");
  CHECK(mx_ipeek(ep, &peeked, &result));
  EXPECT(result == 1 && peeked == r, "ipeek leaves it in place");
  CHECK(mx_cancel(ep, &r, &result));
  EXPECT(result == 0 && r != NULL, "completed receive not cancelled");
  CHECK(mx_test(ep, &r, &s, &result));
  EXPECT(result == 1 && s.code == MX_STATUS_SUCCESS && s.xfer_length == 5, "receive data");
  EXPECT(memcmp(buf, "hello", 5) == 0, "bytes");
  CHECK(mx_ipeek(ep, &peeked, &result));
  EXPECT(result == 0, "nothing left to peek");
  printf("cancel, forget, context, peek checked\n");
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  char buf[64];
  mx_segment_t seg = {buf, sizeof(buf)};
  mx_request_t r;
  CHECK(mx_irecv(ep, &seg, 1, 1, MX_MATCH_MASK_NONE, NULL, &r));
  mx_status_t s = test_wait(ep, &r);
  mx_endpoint_addr_t peer = test_connect_back(ep, &s);
  /* The forgotten issend of the other side is taken here. */
  CHECK(mx_irecv(ep, &seg, 1, 200, MX_MATCH_MASK_NONE, NULL, &r));
  test_wait(ep, &r);
  mx_segment_t hello = {"hello", 5};
  CHECK(mx_isend(ep, &hello, 1, peer, 101, NULL, &r));
  test_wait(ep, &r);
}

int main(int argc, char **argv) { return test_run(argc, argv, active, passive); }
