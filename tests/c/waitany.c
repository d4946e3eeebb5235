/*
 * mx_wait_any / mx_test_any over many requests: completions are picked by
 * match info and mask, each exactly once, whatever order they finish in.
 */

#include "xmx_test.h"

#define N 64
#define GROUP_A 0xab00000000ull
#define GROUP_B 0xcd00000000ull
#define GROUP_MASK 0xff00000000ull

static void active(mx_endpoint_t ep, struct test_opts *o) {
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  static uint32_t data[2 * N];
  /* Reverse order, the two groups interleaved. */
  for (int i = N - 1; i >= 0; i--) {
    for (int g = 0; g < 2; g++) {
      uint64_t group = g ? GROUP_B : GROUP_A;
      data[g * N + i] = (uint32_t)(group >> 32) + (uint32_t)i;
      mx_segment_t seg = {&data[g * N + i], sizeof(uint32_t)};
      mx_request_t r;
      CHECK(mx_isend(ep, &seg, 1, peer, group | (uint64_t)i, (void *)(uintptr_t)(g * N + i), &r));
    }
  }
  /* Every send completes once, found through wait_any with a zero mask. */
  int seen[2 * N] = {0};
  for (int k = 0; k < 2 * N; k++) {
    mx_status_t s;
    uint32_t result;
    CHECK(mx_wait_any(ep, MX_INFINITE, 0, 0, &s, &result));
    EXPECT(result == 1, "send completion");
    int idx = (int)(uintptr_t)s.context;
    EXPECT(idx >= 0 && idx < 2 * N && !seen[idx], "send context %d", idx);
    seen[idx] = 1;
  }
  mx_status_t s;
  uint32_t result;
  CHECK(mx_test_any(ep, 0, 0, &s, &result));
  EXPECT(result == 0, "nothing left to complete");
  printf("%d sends completed through mx_wait_any\n", 2 * N);
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  static uint32_t bufs[2 * N];
  mx_request_t reqs[2 * N];
  for (int g = 0; g < 2; g++) {
    for (int i = 0; i < N; i++) {
      mx_segment_t seg = {&bufs[g * N + i], sizeof(uint32_t)};
      uint64_t group = g ? GROUP_B : GROUP_A;
      CHECK(mx_irecv(ep, &seg, 1, group | (uint64_t)i, MX_MATCH_MASK_NONE,
                     (void *)(uintptr_t)(g * N + i), &reqs[g * N + i]));
    }
  }
  mx_status_t s;
  uint32_t result;
  /* A mask whose match info lies outside it is refused. */
  mx_error_handler_t old = mx_set_error_handler(MX_ERRORS_RETURN);
  EXPECT(mx_test_any(ep, 1, 0, &s, &result) == MX_BAD_MATCH_MASK, "bad mask refused");
  mx_set_error_handler(old);
  /* Group A first, by group mask only. */
  int seen[2 * N] = {0};
  for (int k = 0; k < N; k++) {
    CHECK(mx_wait_any(ep, MX_INFINITE, GROUP_A, GROUP_MASK, &s, &result));
    EXPECT(result == 1, "group A completion");
    int idx = (int)(uintptr_t)s.context;
    EXPECT(idx < N && !seen[idx], "group A context %d", idx);
    EXPECT((s.match_info & GROUP_MASK) == GROUP_A, "match info");
    EXPECT(bufs[idx] == (uint32_t)(GROUP_A >> 32) + (uint32_t)idx, "data of %d", idx);
    seen[idx] = 1;
  }
  CHECK(mx_test_any(ep, GROUP_A, GROUP_MASK, &s, &result));
  EXPECT(result == 0, "group A drained");
  /* Then one exact match from group B, then the rest in any order. */
  CHECK(mx_wait_any(ep, MX_INFINITE, GROUP_B | 5, MX_MATCH_MASK_NONE, &s, &result));
  EXPECT(result == 1 && (int)(uintptr_t)s.context == N + 5, "exact match");
  seen[N + 5] = 1;
  for (int k = 0; k < N - 1; k++) {
    CHECK(mx_wait_any(ep, MX_INFINITE, 0, 0, &s, &result));
    int idx = (int)(uintptr_t)s.context;
    EXPECT(result == 1 && idx >= N && !seen[idx], "group B context %d", idx);
    EXPECT(bufs[idx] == (uint32_t)(GROUP_B >> 32) + (uint32_t)(idx - N), "data of %d", idx);
    seen[idx] = 1;
  }
  printf("%d receives completed through mx_wait_any\n", 2 * N);
}

int main(int argc, char **argv) { return test_run(argc, argv, active, passive); }
