/*
 * mx_iprobe / mx_probe on unexpected messages of each class: found by
 * match info and mask, left in place, then received intact.
 */

#include "xmx_test.h"

static const uint32_t lens[] = {20, 5000, 60000};
#define N 3

static void active(mx_endpoint_t ep, struct test_opts *o) {
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  static unsigned char data[N][60000];
  mx_request_t r[N];
  for (int i = 0; i < N; i++) {
    test_fill(data[i], lens[i], 30 + i);
    mx_segment_t seg = {data[i], lens[i]};
    CHECK(mx_isend(ep, &seg, 1, peer, 0x10 * (i + 1), NULL, &r[i]));
  }
  for (int i = 0; i < N; i++) {
    mx_status_t s = test_wait(ep, &r[i]);
    EXPECT(s.code == MX_STATUS_SUCCESS, "send %d", i);
  }
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  mx_status_t s;
  uint32_t result = 7;
  /* The LARGE one is the last sent: once it is there, all are. */
  CHECK(mx_probe(ep, MX_INFINITE, 0x30, MX_MATCH_MASK_NONE, &s, &result));
  EXPECT(result == 1 && s.match_info == 0x30 && s.msg_length == 60000, "LARGE probed");
  CHECK(mx_iprobe(ep, 0x20, 0xf0, &s, &result));
  EXPECT(result == 1 && s.msg_length == 5000, "MEDIUM probed by mask");
  CHECK(mx_iprobe(ep, 0, 0, &s, &result));
  EXPECT(result == 1 && s.match_info == 0x10 && s.msg_length == 20, "earliest first");
  CHECK(mx_iprobe(ep, 0x40, MX_MATCH_MASK_NONE, &s, &result));
  EXPECT(result == 0, "nothing with 0x40");
  CHECK(mx_probe(ep, 20, 0x40, MX_MATCH_MASK_NONE, &s, &result));
  EXPECT(result == 0, "probe times out");
  mx_error_handler_t old = mx_set_error_handler(MX_ERRORS_RETURN);
  EXPECT(mx_iprobe(ep, 0x3, 0x1, &s, &result) == MX_BAD_MATCH_MASK, "bad mask refused");
  mx_set_error_handler(old);
  static unsigned char buf[60000];
  for (int i = N - 1; i >= 0; i--) {
    mx_segment_t seg = {buf, sizeof(buf)};
    mx_request_t r;
    CHECK(mx_irecv(ep, &seg, 1, 0x10 * (i + 1), MX_MATCH_MASK_NONE, NULL, &r));
    s = test_wait(ep, &r);
    EXPECT(s.code == MX_STATUS_SUCCESS && s.xfer_length == lens[i], "message %d", i);
    test_verify(buf, lens[i], 30 + i, "probed message");
  }
  CHECK(mx_iprobe(ep, 0, 0, &s, &result));
  EXPECT(result == 0, "all received");
  printf("probe and iprobe checked\n");
}

int main(int argc, char **argv) { return test_run(argc, argv, active, passive); }
