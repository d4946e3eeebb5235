/*
 * Ping-pong over every message class, 0 bytes to 16 MiB, each byte checked
 * on both sides; prints one-way latency and bandwidth per size.
 */

#include <sys/time.h>

#include "xmx_test.h"

static const uint32_t sizes[] = {
    0,      1,      31,     32,      33,      127,     128,      129,      1000,
    4095,   4096,   4097,   8192,    32767,   32768,   32769,    65536,    100000,
    262144, 999999, 1 << 20, 4 << 20, 16 << 20};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))
#define MAXLEN (16u << 20)

static int iterations(uint32_t len) { return len >= (1u << 20) ? 3 : 20; }

static double now_us(void) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  return tv.tv_sec * 1e6 + tv.tv_usec;
}

static void exchange(mx_endpoint_t ep, mx_endpoint_addr_t peer, unsigned char *out,
                     unsigned char *in, uint32_t len, uint64_t tag, int send_first) {
  mx_segment_t sseg = {out, len}, rseg = {in, len};
  mx_request_t sreq, rreq;
  mx_status_t s;
  if (send_first) {
    CHECK(mx_isend(ep, &sseg, 1, peer, tag, NULL, &sreq));
    s = test_wait(ep, &sreq);
    EXPECT(s.code == MX_STATUS_SUCCESS, "send status %d", s.code);
  }
  CHECK(mx_irecv(ep, &rseg, 1, tag, MX_MATCH_MASK_NONE, NULL, &rreq));
  s = test_wait(ep, &rreq);
  EXPECT(s.code == MX_STATUS_SUCCESS, "recv status %s", mx_strstatus(s.code));
  EXPECT(s.msg_length == len && s.xfer_length == len, "lengths %u/%u for %u", s.msg_length,
         s.xfer_length, len);
  EXPECT(s.match_info == tag, "match info");
  if (!send_first) {
    CHECK(mx_isend(ep, &sseg, 1, peer, tag, NULL, &sreq));
    s = test_wait(ep, &sreq);
    EXPECT(s.code == MX_STATUS_SUCCESS, "send status %d", s.code);
  }
}

static void active(mx_endpoint_t ep, struct test_opts *o) {
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  unsigned char *out = malloc(MAXLEN), *in = malloc(MAXLEN);
  EXPECT(out && in, "memory");
  printf("%10s %12s %12s\n", "bytes", "latency_us", "MB/s");
  for (unsigned i = 0; i < NSIZES; i++) {
    uint32_t len = sizes[i];
    int n = iterations(len);
    double t0 = now_us();
    for (int k = 0; k < n; k++) {
      test_fill(out, len, len + k);
      exchange(ep, peer, out, in, len, ((uint64_t)i << 32) | (uint32_t)k, 1);
      test_verify(in, len, len + k + 7777, "pong");
    }
    double us = (now_us() - t0) / (2.0 * n);
    printf("%10u %12.2f %12.1f\n", len, us, us > 0 ? len / us : 0.0);
  }
  free(out);
  free(in);
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  unsigned char *out = malloc(MAXLEN), *in = malloc(MAXLEN);
  mx_endpoint_addr_t peer;
  int connected = 0;
  EXPECT(out && in, "memory");
  for (unsigned i = 0; i < NSIZES; i++) {
    uint32_t len = sizes[i];
    for (int k = 0; k < iterations(len); k++) {
      mx_segment_t rseg = {in, len};
      mx_request_t rreq, sreq;
      uint64_t tag = ((uint64_t)i << 32) | (uint32_t)k;
      CHECK(mx_irecv(ep, &rseg, 1, tag, MX_MATCH_MASK_NONE, NULL, &rreq));
      mx_status_t s = test_wait(ep, &rreq);
      EXPECT(s.code == MX_STATUS_SUCCESS && s.xfer_length == len, "ping %u", len);
      test_verify(in, len, len + k, "ping");
      if (!connected) {
        peer = test_connect_back(ep, &s);
        connected = 1;
      }
      test_fill(out, len, len + k + 7777);
      mx_segment_t sseg = {out, len};
      CHECK(mx_isend(ep, &sseg, 1, peer, tag, NULL, &sreq));
      s = test_wait(ep, &sreq);
      EXPECT(s.code == MX_STATUS_SUCCESS, "pong send");
    }
  }
  free(out);
  free(in);
}

int main(int argc, char **argv) { return test_run(argc, argv, active, passive); }
