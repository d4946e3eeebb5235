/*
 * LARGE sends a guest can never lend. One of 32 MiB is bigger than the guest can ever
 * register (the test gives guests 5000 grants, under 20 MiB of pages): it waits for a
 * window for a bounded time and then completes with MX_STATUS_NO_RESOURCES, instead of
 * waiting forever. One of 100 MiB is longer than any guest region (96 MiB of pages, what
 * a registration names to the backend): it completes with MX_STATUS_NO_RESOURCES at
 * once. The endpoint goes on working (a message after them is delivered).
 */

#include "xmx_test.h"

static void oversized(mx_endpoint_t ep, mx_endpoint_addr_t peer, uint32_t len) {
  unsigned char *buf = calloc(1, len);
  EXPECT(buf, "memory");
  mx_segment_t seg = {buf, len};
  mx_request_t r;
  CHECK(mx_isend(ep, &seg, 1, peer, 2, NULL, &r));
  mx_status_t s = test_wait(ep, &r);
  EXPECT(s.code == MX_STATUS_NO_RESOURCES, "the %u-byte send: %s", len, mx_strstatus(s.code));
  free(buf);
}

static void active(mx_endpoint_t ep, struct test_opts *o) {
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  oversized(ep, peer, 32u << 20);
  oversized(ep, peer, 100u << 20);
  mx_segment_t none = {NULL, 0};
  mx_request_t r;
  CHECK(mx_isend(ep, &none, 1, peer, 1, NULL, &r));
  mx_status_t s = test_wait(ep, &r);
  EXPECT(s.code == MX_STATUS_SUCCESS, "the send after them: %s", mx_strstatus(s.code));
  printf("sends of %u and %u bytes failed with %s, and the next one went\n", 32u << 20,
         100u << 20, mx_strstatus(MX_STATUS_NO_RESOURCES));
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  mx_segment_t none = {NULL, 0};
  mx_request_t r;
  CHECK(mx_irecv(ep, &none, 1, 1, MX_MATCH_MASK_NONE, NULL, &r));
  mx_status_t s = test_wait(ep, &r);
  EXPECT(s.code == MX_STATUS_SUCCESS, "the message after it: %s", mx_strstatus(s.code));
  printf("the message after the oversized one arrived\n");
}

int main(int argc, char **argv) { return test_run(argc, argv, active, passive); }
