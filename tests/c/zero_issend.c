/*
 * A 0-byte synchronous send (mx_issend) completes once the receiver matched
 * it, and the sends posted after it are not held behind it: each round
 * sends a 0-byte issend followed by eager and LARGE sends, expected and
 * unexpected at the receiver. Every completion is checked field by field.
 */

#include "xmx_test.h"

#define ROUNDS 20
#define BIG 70000

static uint64_t peer_nic(mx_endpoint_addr_t a, uint32_t *eid) {
  uint64_t nic;
  CHECK(mx_decompose_endpoint_addr(a, &nic, eid));
  return nic;
}

static void active(mx_endpoint_t ep, struct test_opts *o) {
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  uint32_t peid;
  uint64_t pnic = peer_nic(peer, &peid);
  static unsigned char big[BIG];
  unsigned char small[100];
  for (int i = 0; i < ROUNDS; i++) {
    uint64_t m = (uint64_t)i << 8;
    mx_request_t z, a, b, z2;
    mx_segment_t none = {NULL, 0};
    test_fill(small, sizeof(small), i);
    test_fill(big, BIG, 1000 + i);
    mx_segment_t sseg = {small, sizeof(small)}, bseg = {big, BIG};
    void *ctx = (void *)(uintptr_t)(i + 1);
    CHECK(mx_issend(ep, &none, 0, peer, m | 1, ctx, &z));
    CHECK(mx_isend(ep, &sseg, 1, peer, m | 2, ctx, &a));
    CHECK(mx_isend(ep, &bseg, 1, peer, m | 3, ctx, &b));
    CHECK(mx_issend(ep, &none, 1, peer, m | 4, ctx, &z2));
    mx_status_t s = test_wait(ep, &z);
    test_status_is(&s, MX_STATUS_SUCCESS, pnic, peid, m | 1, 0, 0, ctx, "0 B issend");
    s = test_wait(ep, &a);
    test_status_is(&s, MX_STATUS_SUCCESS, pnic, peid, m | 2, 100, 100, ctx, "eager after it");
    s = test_wait(ep, &b);
    test_status_is(&s, MX_STATUS_SUCCESS, pnic, peid, m | 3, BIG, BIG, ctx, "LARGE after it");
    s = test_wait(ep, &z2);
    test_status_is(&s, MX_STATUS_SUCCESS, pnic, peid, m | 4, 0, 0, ctx, "second 0 B issend");
  }
  printf("%d rounds of 0 B issends with sends behind them\n", ROUNDS);
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  static unsigned char big[BIG];
  unsigned char small[100];
  mx_endpoint_addr_t from;
  uint32_t feid = 0;
  uint64_t fnic = 0;
  for (int i = 0; i < ROUNDS; i++) {
    uint64_t m = (uint64_t)i << 8;
    mx_request_t z, a, b, z2;
    mx_segment_t none = {NULL, 0}, sseg = {small, sizeof(small)}, bseg = {big, BIG};
    void *ctx = (void *)(uintptr_t)(0x100 + i);
    if (i % 2) {
      /* Odd rounds: everything is in before the receives are posted. */
      mx_status_t ps;
      uint32_t found = 0;
      CHECK(mx_probe(ep, 10000, m | 4, MX_MATCH_MASK_NONE, &ps, &found));
      EXPECT(found == 1, "round %d: the last 0 B issend arrived", i);
    }
    CHECK(mx_irecv(ep, &none, 0, m | 1, MX_MATCH_MASK_NONE, ctx, &z));
    CHECK(mx_irecv(ep, &sseg, 1, m | 2, MX_MATCH_MASK_NONE, ctx, &a));
    CHECK(mx_irecv(ep, &bseg, 1, m | 3, MX_MATCH_MASK_NONE, ctx, &b));
    CHECK(mx_irecv(ep, &none, 1, m | 4, MX_MATCH_MASK_NONE, ctx, &z2));
    mx_status_t s = test_wait(ep, &z);
    if (i == 0) {
      from = s.source;
      fnic = peer_nic(from, &feid);
    }
    test_status_is(&s, MX_STATUS_SUCCESS, fnic, feid, m | 1, 0, 0, ctx, "0 B issend received");
    s = test_wait(ep, &a);
    test_status_is(&s, MX_STATUS_SUCCESS, fnic, feid, m | 2, 100, 100, ctx, "eager received");
    test_verify(small, 100, i, "eager data");
    s = test_wait(ep, &b);
    test_status_is(&s, MX_STATUS_SUCCESS, fnic, feid, m | 3, BIG, BIG, ctx, "LARGE received");
    test_verify(big, BIG, 1000 + i, "LARGE data");
    s = test_wait(ep, &z2);
    test_status_is(&s, MX_STATUS_SUCCESS, fnic, feid, m | 4, 0, 0, ctx, "second 0 B received");
  }
}

int main(int argc, char **argv) { return test_run(argc, argv, active, passive); }
