/*
 * LARGE messages both ways at once from and into distinct buffers, as MPI ranks
 * exchanging big arrays do: each side posts N receives into N buffers, then N sends
 * from N other buffers, and checks every byte. Several pairs of these run at once
 * between two guests (ranks of one job), so together they want many times the
 * grants a guest has: windows must be shared out so that every exchange completes,
 * with no pair left waiting for grants the others hold.
 *
 * RANKS_N (default 8) and RANKS_LEN (bytes, default 16 MiB) size the exchange.
 */

#include "xmx_test.h"

#define M_HELLO 0xfffeull
#define M_GO 0xfff0ull

static void exchange(mx_endpoint_t ep, mx_endpoint_addr_t peer, uint32_t seed_out,
                     uint32_t seed_in, const char *side) {
  uint32_t n = test_env_or("RANKS_N", 8), len = test_env_or("RANKS_LEN", 16u << 20);
  unsigned char *out = malloc((size_t)n * len), *in = calloc(n, len);
  mx_request_t *sends = calloc(n, sizeof(*sends)), *recvs = calloc(n, sizeof(*recvs));
  EXPECT(out && in && sends && recvs, "memory");
  for (uint32_t i = 0; i < n; i++) test_fill(out + (size_t)i * len, len, seed_out + i);
  for (uint32_t i = 0; i < n; i++) {
    mx_segment_t seg = {in + (size_t)i * len, len};
    CHECK(mx_irecv(ep, &seg, 1, i, MX_MATCH_MASK_NONE, NULL, &recvs[i]));
  }
  /* Both sides have posted their receives before either sends. */
  mx_segment_t none = {NULL, 0};
  mx_request_t go_in, go_out;
  CHECK(mx_irecv(ep, &none, 1, M_GO, MX_MATCH_MASK_NONE, NULL, &go_in));
  CHECK(mx_isend(ep, &none, 1, peer, M_GO, NULL, &go_out));
  test_wait(ep, &go_out);
  test_wait(ep, &go_in);
  for (uint32_t i = 0; i < n; i++) {
    mx_segment_t seg = {out + (size_t)i * len, len};
    CHECK(mx_isend(ep, &seg, 1, peer, i, NULL, &sends[i]));
  }
  for (uint32_t i = 0; i < n; i++) {
    mx_status_t s = test_wait(ep, &recvs[i]);
    EXPECT(s.code == MX_STATUS_SUCCESS && s.xfer_length == len, "recv %u: %s", i,
           mx_strstatus(s.code));
    test_verify(in + (size_t)i * len, len, seed_in + i, "ranks_large");
  }
  for (uint32_t i = 0; i < n; i++) {
    mx_status_t s = test_wait(ep, &sends[i]);
    EXPECT(s.code == MX_STATUS_SUCCESS, "send %u: %s", i, mx_strstatus(s.code));
  }
  printf("%s: %u x %u bytes each way\n", side, n, len);
  free(out);
  free(in);
  free(sends);
  free(recvs);
}

static void active(mx_endpoint_t ep, struct test_opts *o) {
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  mx_segment_t none = {NULL, 0};
  mx_request_t r;
  CHECK(mx_isend(ep, &none, 1, peer, M_HELLO, NULL, &r));
  test_wait(ep, &r);
  exchange(ep, peer, 100, 200, "active");
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  mx_segment_t none = {NULL, 0};
  mx_request_t r;
  CHECK(mx_irecv(ep, &none, 1, M_HELLO, MX_MATCH_MASK_NONE, NULL, &r));
  mx_status_t s = test_wait(ep, &r);
  mx_endpoint_addr_t peer = test_connect_back(ep, &s);
  exchange(ep, peer, 200, 100, "passive");
}

int main(int argc, char **argv) { return test_run(argc, argv, active, passive); }
