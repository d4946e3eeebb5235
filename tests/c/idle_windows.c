/*
 * One process's unused registrations must not starve another endpoint of the guest.
 * The passive side opens a second endpoint (PASSIVE_EID + 1, "the other rank"); its
 * first endpoint receives N LARGE messages into N buffers, one at a time, and stays
 * open, its registration cache holding their windows; then the second endpoint
 * receives one LARGE message. Run where the guest's grants hold fewer windows than
 * that (the test gives guests 5000 grants: two 8 MiB windows), the second receive
 * completes once the first endpoint's unused windows are given back.
 */

#include "xmx_test.h"

#define N 2
#define LEN (8u << 20)

static void active(mx_endpoint_t ep, struct test_opts *o) {
  mx_endpoint_addr_t first = test_connect(ep, o->host, o->remote_eid);
  mx_endpoint_addr_t second = test_connect(ep, o->host, o->remote_eid + 1);
  unsigned char *buf = malloc(LEN);
  EXPECT(buf, "memory");
  test_fill(buf, LEN, 11);
  mx_segment_t seg = {buf, LEN};
  mx_request_t r;
  for (int i = 0; i < N; i++) {
    CHECK(mx_isend(ep, &seg, 1, first, (uint64_t)i, NULL, &r));
    mx_status_t s = test_wait(ep, &r);
    EXPECT(s.code == MX_STATUS_SUCCESS, "send %d: %s", i, mx_strstatus(s.code));
  }
  CHECK(mx_isend(ep, &seg, 1, second, 0, NULL, &r));
  mx_status_t s = test_wait(ep, &r);
  EXPECT(s.code == MX_STATUS_SUCCESS, "send to the second endpoint: %s", mx_strstatus(s.code));
  printf("%d messages of %u bytes to one endpoint, then one to another\n", N, LEN);
  free(buf);
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  mx_endpoint_t other = test_open((uint32_t)o->listen_eid + 1);
  unsigned char *bufs = calloc(N + 1, LEN);
  EXPECT(bufs, "memory");
  mx_request_t r;
  for (int i = 0; i < N; i++) {
    mx_segment_t seg = {bufs + (size_t)i * LEN, LEN};
    CHECK(mx_irecv(ep, &seg, 1, (uint64_t)i, MX_MATCH_MASK_NONE, NULL, &r));
    mx_status_t s = test_wait(ep, &r);
    EXPECT(s.code == MX_STATUS_SUCCESS && s.xfer_length == LEN, "recv %d: %s", i,
           mx_strstatus(s.code));
    test_verify(bufs + (size_t)i * LEN, LEN, 11, "idle_windows first endpoint");
  }
  mx_segment_t seg = {bufs + (size_t)N * LEN, LEN};
  CHECK(mx_irecv(other, &seg, 1, 0, MX_MATCH_MASK_NONE, NULL, &r));
  mx_status_t s = test_wait(other, &r);
  EXPECT(s.code == MX_STATUS_SUCCESS && s.xfer_length == LEN, "recv on the second endpoint: %s",
         mx_strstatus(s.code));
  test_verify(bufs + (size_t)N * LEN, LEN, 11, "idle_windows second endpoint");
  printf("the second endpoint received while the first kept its windows\n");
  CHECK(mx_close_endpoint(other));
  free(bufs);
}

int main(int argc, char **argv) { return test_run(argc, argv, active, passive); }
