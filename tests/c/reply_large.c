/*
 * The passive side answers with a LARGE message to the address a received
 * message came from, without connecting back (MX allows replying to
 * status.source).
 */

#include "xmx_test.h"

#define LEN 100000

static void active(mx_endpoint_t ep, struct test_opts *o) {
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  static unsigned char in[LEN];
  mx_segment_t none = {NULL, 0}, rseg = {in, LEN};
  mx_request_t s, r;
  CHECK(mx_irecv(ep, &rseg, 1, 2, MX_MATCH_MASK_NONE, NULL, &r));
  CHECK(mx_isend(ep, &none, 1, peer, 1, NULL, &s));
  test_wait(ep, &s);
  mx_status_t st = test_wait(ep, &r);
  EXPECT(st.code == MX_STATUS_SUCCESS && st.xfer_length == LEN, "LARGE reply: %s",
         mx_strstatus(st.code));
  test_verify(in, LEN, 2, "LARGE reply");
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  static unsigned char out[LEN];
  mx_segment_t none = {NULL, 0}, sseg = {out, LEN};
  mx_request_t r;
  CHECK(mx_irecv(ep, &none, 1, 1, MX_MATCH_MASK_NONE, NULL, &r));
  mx_status_t st = test_wait(ep, &r);
  test_fill(out, LEN, 2);
  CHECK(mx_isend(ep, &sseg, 1, st.source, 2, NULL, &r));
  test_wait(ep, &r);
}

int main(int argc, char **argv) { return test_run(argc, argv, active, passive); }
