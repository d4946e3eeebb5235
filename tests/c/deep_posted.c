/*
 * More LARGE messages in flight at once than one guest can register together:
 * N receives of 8 MiB posted into N buffers before any message exists (an MPI
 * bandwidth test's window), and N sends of one 8 MiB buffer posted before any is
 * waited for (a send lends the same registration every time; each receive needs
 * its own). Every message arrives whole into its own buffer and every request
 * completes with success: a receive whose pull finds no room to register waits for
 * an earlier pull to give its room back.
 */

#include "xmx_test.h"

#define N 24
#define LEN (8u << 20)

static void active(mx_endpoint_t ep, struct test_opts *o) {
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  unsigned char *buf = malloc(LEN);
  mx_request_t reqs[N];
  EXPECT(buf, "memory");
  test_fill(buf, LEN, 7);
  mx_segment_t none = {NULL, 0};
  mx_request_t r;
  CHECK(mx_isend(ep, &none, 1, peer, 0xfffe, NULL, &r));
  test_wait(ep, &r);
  /* Wait for the go: every receive is posted on the other side. */
  CHECK(mx_irecv(ep, &none, 1, 0xffff, MX_MATCH_MASK_NONE, NULL, &r));
  test_wait(ep, &r);
  mx_segment_t seg = {buf, LEN};
  for (int i = 0; i < N; i++) CHECK(mx_isend(ep, &seg, 1, peer, (uint64_t)i, NULL, &reqs[i]));
  for (int i = 0; i < N; i++) {
    mx_status_t s = test_wait(ep, &reqs[i]);
    EXPECT(s.code == MX_STATUS_SUCCESS, "send %d: %s", i, mx_strstatus(s.code));
  }
  printf("%d sends of %u bytes outstanding at once\n", N, LEN);
  free(buf);
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  /* Zeroed: a message pulled into the wrong buffer leaves its own one short. */
  unsigned char *bufs = calloc(N, LEN);
  mx_request_t reqs[N];
  EXPECT(bufs, "memory");
  for (int i = 0; i < N; i++) {
    mx_segment_t seg = {bufs + (size_t)i * LEN, LEN};
    CHECK(mx_irecv(ep, &seg, 1, (uint64_t)i, MX_MATCH_MASK_NONE, NULL, &reqs[i]));
  }
  mx_request_t r;
  mx_segment_t none = {NULL, 0};
  CHECK(mx_irecv(ep, &none, 1, 0xfffe, MX_MATCH_MASK_NONE, NULL, &r));
  mx_status_t s = test_wait(ep, &r);
  mx_endpoint_addr_t peer = test_connect_back(ep, &s);
  CHECK(mx_isend(ep, &none, 1, peer, 0xffff, NULL, &r));
  test_wait(ep, &r);
  for (int i = 0; i < N; i++) {
    s = test_wait(ep, &reqs[i]);
    EXPECT(s.code == MX_STATUS_SUCCESS && s.xfer_length == LEN, "recv %d: %s, %u bytes", i,
           mx_strstatus(s.code), s.xfer_length);
    test_verify(bufs + (size_t)i * LEN, LEN, 7, "deep_posted");
  }
  printf("%d receives of %u bytes posted at once\n", N, LEN);
  free(bufs);
}

int main(int argc, char **argv) { return test_run(argc, argv, active, passive); }
