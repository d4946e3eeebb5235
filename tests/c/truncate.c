/*
 * Truncation (receive buffers shorter than the message, each class) with
 * scatter/gather segment lists, and a synchronous send (mx_issend) that
 * completes only once the receiver has matched it.
 */

#include "xmx_test.h"

static const uint32_t msg_len[] = {100, 5000, 100000, 100000};
static const uint32_t buf_len[] = {10, 4096, 50000, 200000};
#define N 4

static void active(mx_endpoint_t ep, struct test_opts *o) {
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  static unsigned char data[N][100000];
  for (int i = 0; i < N; i++) {
    test_fill(data[i], msg_len[i], i);
    /* Three segments per message. */
    uint32_t a = msg_len[i] / 3, b = msg_len[i] / 2;
    mx_segment_t segs[3] = {{data[i], a}, {data[i] + a, b - a}, {data[i] + b, msg_len[i] - b}};
    mx_request_t r;
    CHECK(mx_isend(ep, segs, 3, peer, 10 + i, NULL, &r));
    mx_status_t s = test_wait(ep, &r);
    EXPECT(s.code == MX_STATUS_SUCCESS, "send %d: %s", i, mx_strstatus(s.code));
    if (msg_len[i] > 32768)
      EXPECT(s.xfer_length == (msg_len[i] < buf_len[i] ? msg_len[i] : buf_len[i]),
             "LARGE send reports what was taken: %u", s.xfer_length);
  }
  /* issend: not complete while the receiver has not posted a receive. */
  unsigned char small[16];
  test_fill(small, sizeof(small), 77);
  mx_segment_t seg = {small, sizeof(small)};
  mx_request_t sync_req, go;
  mx_status_t s;
  uint32_t result;
  CHECK(mx_issend(ep, &seg, 1, peer, 20, NULL, &sync_req));
  CHECK(mx_wait(ep, &sync_req, 50, &s, &result));
  EXPECT(result == 0, "issend completed before the receiver matched it");
  CHECK(mx_ibuffered(ep, &sync_req, &result));
  EXPECT(result == 0, "a synchronous send is not buffered");
  mx_segment_t none = {NULL, 0};
  CHECK(mx_isend(ep, &none, 1, peer, 21, NULL, &go));
  s = test_wait(ep, &sync_req);
  EXPECT(s.code == MX_STATUS_SUCCESS, "issend: %s", mx_strstatus(s.code));
  test_wait(ep, &go);
  printf("truncations and a synchronous send checked\n");
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  static unsigned char buf[200000];
  for (int i = 0; i < N; i++) {
    memset(buf, 0xee, sizeof(buf));
    /* Two receive segments. */
    uint32_t half = buf_len[i] / 2;
    mx_segment_t segs[2] = {{buf, half}, {buf + half, buf_len[i] - half}};
    mx_request_t r;
    CHECK(mx_irecv(ep, segs, 2, 10 + i, MX_MATCH_MASK_NONE, NULL, &r));
    mx_status_t s = test_wait(ep, &r);
    uint32_t expect = msg_len[i] < buf_len[i] ? msg_len[i] : buf_len[i];
    mx_status_code_t code = msg_len[i] > buf_len[i] ? MX_STATUS_TRUNCATED : MX_STATUS_SUCCESS;
    EXPECT(s.code == code, "message %d: %s", i, mx_strstatus(s.code));
    EXPECT(s.msg_length == msg_len[i] && s.xfer_length == expect, "lengths %u/%u", s.msg_length,
           s.xfer_length);
    test_verify(buf, expect, i, "truncated data");
    EXPECT(buf_len[i] == expect || buf[expect] == 0xee, "nothing written past the data");
  }
  mx_request_t go, r;
  mx_segment_t none = {NULL, 0};
  CHECK(mx_irecv(ep, &none, 1, 21, MX_MATCH_MASK_NONE, NULL, &go));
  test_wait(ep, &go);
  unsigned char small[16];
  mx_segment_t seg = {small, sizeof(small)};
  CHECK(mx_irecv(ep, &seg, 1, 20, MX_MATCH_MASK_NONE, NULL, &r));
  mx_status_t s = test_wait(ep, &r);
  EXPECT(s.code == MX_STATUS_SUCCESS && s.xfer_length == 16, "issend data");
  test_verify(small, 16, 77, "issend data");
}

int main(int argc, char **argv) { return test_run(argc, argv, active, passive); }
