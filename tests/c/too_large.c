/*
 * A LARGE send bigger than the guest can ever register (the test gives guests 5000
 * grants, under 20 MiB of pages; the message is 32 MiB) waits for a window for a
 * bounded time and then completes with MX_STATUS_NO_RESOURCES, instead of waiting
 * forever; the endpoint goes on working (a message after it is delivered).
 */

#include "xmx_test.h"

#define LEN (32u << 20)

static void active(mx_endpoint_t ep, struct test_opts *o) {
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  unsigned char *buf = calloc(1, LEN);
  EXPECT(buf, "memory");
  mx_segment_t seg = {buf, LEN};
  mx_request_t r;
  CHECK(mx_isend(ep, &seg, 1, peer, 2, NULL, &r));
  mx_status_t s = test_wait(ep, &r);
  EXPECT(s.code == MX_STATUS_NO_RESOURCES, "the oversized send: %s", mx_strstatus(s.code));
  mx_segment_t none = {NULL, 0};
  CHECK(mx_isend(ep, &none, 1, peer, 1, NULL, &r));
  s = test_wait(ep, &r);
  EXPECT(s.code == MX_STATUS_SUCCESS, "the send after it: %s", mx_strstatus(s.code));
  printf("a %u-byte send failed with %s, and the next one went\n", LEN,
         mx_strstatus(MX_STATUS_NO_RESOURCES));
  free(buf);
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
