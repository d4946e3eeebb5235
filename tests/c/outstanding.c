/*
 * Many requests outstanding at once on both sides: receives posted before
 * the messages exist, sends posted before any is waited for, completions
 * waited for in an order unrelated to posting.
 */

#include "xmx_test.h"

#define N 1000
static uint32_t len_of(uint32_t i) { return (i * 7919u) % 3 == 0 ? 70000 : (i * 131u) % 9000; }
#define MAXLEN 70000

static void active(mx_endpoint_t ep, struct test_opts *o) {
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  unsigned char *bufs = malloc((size_t)N * MAXLEN);
  mx_request_t *reqs = calloc(N, sizeof(*reqs));
  EXPECT(bufs && reqs, "memory");
  /* Wait for the go: every receive is posted on the other side. */
  mx_request_t go;
  mx_segment_t none = {NULL, 0};
  CHECK(mx_irecv(ep, &none, 1, 0xffff, MX_MATCH_MASK_NONE, NULL, &go));
  test_wait(ep, &go);
  for (int i = N - 1; i >= 0; i--) {
    unsigned char *b = bufs + (size_t)i * MAXLEN;
    test_fill(b, len_of(i), i);
    mx_segment_t seg = {b, len_of(i)};
    CHECK(mx_isend(ep, &seg, 1, peer, (uint64_t)i, NULL, &reqs[i]));
  }
  for (int i = 0; i < N; i++) {
    mx_status_t s = test_wait(ep, &reqs[i]);
    EXPECT(s.code == MX_STATUS_SUCCESS, "send %d: %s", i, mx_strstatus(s.code));
  }
  printf("%d sends outstanding at once\n", N);
  free(bufs);
  free(reqs);
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  unsigned char *bufs = malloc((size_t)N * MAXLEN);
  mx_request_t *reqs = calloc(N, sizeof(*reqs));
  EXPECT(bufs && reqs, "memory");
  for (int i = 0; i < N; i++) {
    mx_segment_t seg = {bufs + (size_t)i * MAXLEN, MAXLEN};
    CHECK(mx_irecv(ep, &seg, 1, (uint64_t)i, MX_MATCH_MASK_NONE, NULL, &reqs[i]));
  }
  /* The go message: the first one tells who the sender is. */
  mx_request_t hello;
  mx_segment_t none = {NULL, 0};
  CHECK(mx_irecv(ep, &none, 1, 0xfffe, MX_MATCH_MASK_NONE, NULL, &hello));
  mx_status_t s = test_wait(ep, &hello);
  mx_endpoint_addr_t peer = test_connect_back(ep, &s);
  mx_request_t go;
  CHECK(mx_isend(ep, &none, 1, peer, 0xffff, NULL, &go));
  test_wait(ep, &go);
  /* Odd indexes first, then even ones. */
  for (int pass = 1; pass >= 0; pass--) {
    for (int i = pass; i < N; i += 2) {
      s = test_wait(ep, &reqs[i]);
      EXPECT(s.code == MX_STATUS_SUCCESS && s.xfer_length == len_of(i), "recv %d", i);
      test_verify(bufs + (size_t)i * MAXLEN, len_of(i), i, "outstanding");
    }
  }
  printf("%d receives outstanding at once\n", N);
  free(bufs);
  free(reqs);
}

static void active_hello(mx_endpoint_t ep, struct test_opts *o) {
  /* Announce ourselves, then run the active side. */
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  mx_segment_t none = {NULL, 0};
  mx_request_t r;
  CHECK(mx_isend(ep, &none, 1, peer, 0xfffe, NULL, &r));
  test_wait(ep, &r);
  active(ep, o);
}

int main(int argc, char **argv) { return test_run(argc, argv, active_hello, passive); }
