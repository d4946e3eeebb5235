/*
 * Both sides stream windows of LARGE messages at each other at once, the
 * way a bidirectional bandwidth benchmark (OSU's osu_bibw) does: each round
 * posts a window of receives into one buffer and a window of sends from one
 * buffer (every send of a round lends the same pages), then waits for all of
 * them. So many LARGE messages are outstanding in both directions, every
 * one of them a registration of the same region. Each completion's status
 * and the received bytes are checked.
 *
 * BIBW_LEN (bytes, default 512 KiB), BIBW_WINDOW (default 64) and
 * BIBW_ROUNDS (default 2) size the exchange; OSU runs it at 4 MiB. Each side
 * then prints how many of its pulls went over a direct channel between
 * co-located guests ("direct-pulls=N"); with XMX_EXPECT_DIRECT=1 each side
 * first waits (bounded) until its channel to the other is open, so that
 * every pull of the rounds can take it.
 */

#include "xmx_test.h"

#define M_HELLO 0xb1b00000ull
#define M_DATA 0xb1b10000ull

static void exchange(mx_endpoint_t ep, mx_endpoint_addr_t peer, uint32_t my_seed,
                     uint32_t peer_seed, const char *side) {
  uint32_t len = test_env_or("BIBW_LEN", 512u << 10), window = test_env_or("BIBW_WINDOW", 64),
           rounds = test_env_or("BIBW_ROUNDS", 2);
  unsigned char *sbuf = malloc(len), *rbuf = malloc(len);
  mx_request_t *sr = calloc(window, sizeof(*sr)), *rr = calloc(window, sizeof(*rr));
  EXPECT(sbuf && rbuf && sr && rr, "memory");
  test_fill(sbuf, len, my_seed);
  uint64_t peer_nic;
  uint32_t peer_eid;
  CHECK(mx_decompose_endpoint_addr(peer, &peer_nic, &peer_eid));
  const char *expect_direct = getenv("XMX_EXPECT_DIRECT");
  if (expect_direct && strcmp(expect_direct, "1") == 0)
    test_wait_counter(ep, "Direct channels opened", 1);
  for (uint32_t round = 0; round < rounds; round++) {
    memset(rbuf, 0, len);
    for (uint32_t i = 0; i < window; i++) {
      mx_segment_t seg = {rbuf, len};
      CHECK(mx_irecv(ep, &seg, 1, M_DATA | round, MX_MATCH_MASK_NONE,
                     (void *)(uintptr_t)(i + 1), &rr[i]));
    }
    for (uint32_t i = 0; i < window; i++) {
      mx_segment_t seg = {sbuf, len};
      CHECK(mx_isend(ep, &seg, 1, peer, M_DATA | round, (void *)(uintptr_t)(i + 1), &sr[i]));
    }
    for (uint32_t i = 0; i < window; i++) {
      char what[96];
      snprintf(what, sizeof(what), "%s: round %u, receive %u", side, round, i);
      mx_status_t s = test_wait(ep, &rr[i]);
      test_status_is(&s, MX_STATUS_SUCCESS, peer_nic, peer_eid, M_DATA | round, len, len,
                     (void *)(uintptr_t)(i + 1), what);
    }
    for (uint32_t i = 0; i < window; i++) {
      mx_status_t s = test_wait(ep, &sr[i]);
      EXPECT(s.code == MX_STATUS_SUCCESS && s.msg_length == len &&
                 s.context == (void *)(uintptr_t)(i + 1),
             "%s: round %u, send %u: %s %u", side, round, i, mx_strstatus(s.code), s.msg_length);
    }
    char what[64];
    snprintf(what, sizeof(what), "%s: round %u", side, round);
    test_verify(rbuf, len, peer_seed, what);
  }
  printf("%s: %u rounds of %u x %u bytes each way\n", side, rounds, window, len);
  printf("%s: direct-pulls=%u\n", side, test_counter("Direct LARGE pulls"));
  free(sbuf);
  free(rbuf);
  free(sr);
  free(rr);
}

static void active(mx_endpoint_t ep, struct test_opts *o) {
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  mx_request_t r;
  mx_segment_t none = {NULL, 0};
  CHECK(mx_isend(ep, &none, 1, peer, M_HELLO, NULL, &r));
  test_wait(ep, &r);
  CHECK(mx_irecv(ep, &none, 1, M_HELLO, MX_MATCH_MASK_NONE, NULL, &r));
  test_wait(ep, &r);
  exchange(ep, peer, 1, 2, "active");
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  mx_request_t r;
  mx_segment_t none = {NULL, 0};
  CHECK(mx_irecv(ep, &none, 1, M_HELLO, MX_MATCH_MASK_NONE, NULL, &r));
  mx_status_t s = test_wait(ep, &r);
  mx_endpoint_addr_t peer = test_connect_back(ep, &s);
  CHECK(mx_isend(ep, &none, 1, peer, M_HELLO, NULL, &r));
  test_wait(ep, &r);
  exchange(ep, peer, 2, 1, "passive");
}

int main(int argc, char **argv) { return test_run(argc, argv, active, passive); }
