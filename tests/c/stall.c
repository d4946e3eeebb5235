/*
 * A wait that makes no progress: a receive nobody sends to, waited for
 * with a bound. Run with XMX_STALL_REPORT_MS shorter than the bound, the
 * library reports the stalled endpoint on its standard error.
 */

#include "xmx_test.h"

int main(int argc, char **argv) {
  (void)argc;
  CHECK(mx_init());
  mx_endpoint_t ep = test_open(PASSIVE_EID);
  static unsigned char buf[64];
  mx_segment_t seg = {buf, sizeof(buf)};
  mx_request_t r;
  CHECK(mx_irecv(ep, &seg, 1, 0x57a11, MX_MATCH_MASK_NONE, NULL, &r));
  mx_status_t s;
  uint32_t result = 7;
  CHECK(mx_wait(ep, &r, 1500, &s, &result));
  EXPECT(result == 0, "nothing completes the receive");
  uint32_t cancelled = 0;
  CHECK(mx_cancel(ep, &r, &cancelled));
  EXPECT(cancelled == 1, "the receive is cancelled");
  CHECK(mx_close_endpoint(ep));
  CHECK(mx_finalize());
  printf("PASS %s\n", argv[0]);
  return 0;
}
