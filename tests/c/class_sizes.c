/*
 * Every message-class boundary (0, 1, 32, 33, 128, 129, 4095..4097,
 * 32767..32769, 65536, odd lengths, 1 MiB), each sent through a list of
 * three segments into a list of two, with a receive buffer that fits
 * exactly, one that is too short (truncation) and one that is longer.
 * Every completion's status is checked field by field on both sides
 * (code, source, match info, msg_length, xfer_length, context): a message
 * that fits never reports xfer_length != msg_length, a truncated one
 * reports min(msg_length, buffer) and MX_STATUS_TRUNCATED. Sends and
 * receives are both posted ahead, so messages meet expected and
 * unexpected receives alike.
 */

#include "xmx_test.h"

static const uint32_t sizes[] = {0,     1,     32,    33,    128,   129,   4095,  4096,   4097,
                                 12345, 32767, 32768, 32769, 65536, 65537, 99999, 1 << 20};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))
#define VARIANTS 3

static uint32_t buf_len(uint32_t len, int v) {
  switch (v) {
  case 0: return len;             /* fits exactly */
  case 1: return len / 2;         /* truncated (nothing for 0 and 1 B) */
  default: return len + 100;      /* longer than the message */
  }
}

static uint64_t match_of(unsigned i, int v) { return 0xc1a5500000000000ull | (uint64_t)i << 8 | v; }

static void active(mx_endpoint_t ep, struct test_opts *o) {
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  uint64_t pnic;
  uint32_t peid;
  CHECK(mx_decompose_endpoint_addr(peer, &pnic, &peid));
  unsigned char *data = malloc((1 << 20) + 1);
  EXPECT(data != NULL, "buffer");
  for (unsigned i = 0; i < NSIZES; i++) {
    for (int v = 0; v < VARIANTS; v++) {
      uint32_t len = sizes[i], taken = len < buf_len(len, v) ? len : buf_len(len, v);
      uint64_t m = match_of(i, v);
      test_fill(data, len, (uint32_t)m);
      mx_segment_t segs[3];
      test_split(data, len, segs, 3);
      mx_request_t r;
      void *ctx = (void *)(uintptr_t)(m & 0xffff);
      CHECK(mx_isend(ep, segs, 3, peer, m, ctx, &r));
      mx_status_t s = test_wait(ep, &r);
      char what[64];
      snprintf(what, sizeof(what), "send of %u B (variant %d)", len, v);
      /* A LARGE send reports what the receiver took. */
      test_status_is(&s, MX_STATUS_SUCCESS, pnic, peid, m, len, len > 32768 ? taken : len, ctx,
                     what);
    }
  }
  free(data);
  printf("%u sizes x %d buffers sent and checked\n", (unsigned)NSIZES, VARIANTS);
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  unsigned char *buf = malloc((1 << 20) + 101);
  EXPECT(buf != NULL, "buffer");
  uint64_t anic = 0;
  uint32_t aeid = 0;
  for (unsigned i = 0; i < NSIZES; i++) {
    for (int v = 0; v < VARIANTS; v++) {
      uint32_t len = sizes[i], bl = buf_len(len, v), taken = len < bl ? len : bl;
      uint64_t m = match_of(i, v);
      memset(buf, 0xee, bl + 1);
      mx_segment_t segs[2];
      test_split(buf, bl, segs, 2);
      mx_request_t r;
      void *ctx = (void *)(uintptr_t)(0x10000 + (m & 0xffff));
      CHECK(mx_irecv(ep, segs, 2, m, MX_MATCH_MASK_NONE, ctx, &r));
      mx_status_t s = test_wait(ep, &r);
      if (i == 0 && v == 0) CHECK(mx_decompose_endpoint_addr(s.source, &anic, &aeid));
      char what[64];
      snprintf(what, sizeof(what), "receive of %u B into %u B", len, bl);
      test_status_is(&s, len > bl ? MX_STATUS_TRUNCATED : MX_STATUS_SUCCESS, anic, aeid, m, len,
                     taken, ctx, what);
      test_verify(buf, taken, (uint32_t)m, what);
      EXPECT(buf[taken] == 0xee, "%s: nothing written past %u B", what, taken);
    }
  }
  free(buf);
  printf("%u sizes x %d buffers received and checked\n", (unsigned)NSIZES, VARIANTS);
}

int main(int argc, char **argv) { return test_run(argc, argv, active, passive); }
