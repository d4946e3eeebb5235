/*
 * Connection refusals: a wrong key (mx_connect returns
 * MX_BAD_CONNECTION_KEY, mx_iconnect completes with MX_STATUS_BAD_KEY), an
 * endpoint that is not open (MX_CONNECTION_FAILED), a NIC not in the peer
 * table (MX_NIC_NOT_FOUND). With -f the default handler is left in place:
 * the refused connect must end the process (exit status 255) with a message.
 */

#include "xmx_test.h"

static int fatal_mode;

static void active(mx_endpoint_t ep, struct test_opts *o) {
  uint64_t nic;
  mx_endpoint_addr_t addr;
  if (o->host) {
    CHECK(mx_hostname_to_nic_id((char *)o->host, &nic));
  } else {
    CHECK(mx_board_number_to_nic_id(0, &nic));
  }
  if (fatal_mode) {
    mx_connect(ep, nic, o->remote_eid, TEST_KEY + 1, 10000, &addr);
    fprintf(stderr, "the default error handler returned\n");
    exit(1);
  }
  mx_error_handler_t old = mx_set_error_handler(MX_ERRORS_RETURN);
  EXPECT(old == MX_ERRORS_ARE_FATAL, "errors are fatal by default");
  mx_return_t r = mx_connect(ep, nic, o->remote_eid, TEST_KEY + 1, 10000, &addr);
  EXPECT(r == MX_BAD_CONNECTION_KEY, "wrong key: %s", mx_strerror(r));

  mx_request_t req;
  CHECK(mx_iconnect(ep, nic, o->remote_eid, TEST_KEY ^ 0xff, 0x42, (void *)0x99, &req));
  mx_status_t s = test_wait(ep, &req);
  EXPECT(s.code == MX_STATUS_BAD_KEY, "iconnect status %s", mx_strstatus(s.code));
  EXPECT(s.match_info == 0x42 && s.context == (void *)0x99, "iconnect status fields");

  r = mx_connect(ep, nic, 200, TEST_KEY, 10000, &addr);
  EXPECT(r == MX_CONNECTION_FAILED, "closed endpoint: %s", mx_strerror(r));
  r = mx_connect(ep, 0x0123456789ull, 0, TEST_KEY, 10000, &addr);
  EXPECT(r == MX_NIC_NOT_FOUND, "unknown NIC: %s", mx_strerror(r));
  r = mx_connect(ep, nic, 300, TEST_KEY, 10000, &addr);
  EXPECT(r == MX_BAD_ENDPOINT_ID, "endpoint id out of range: %s", mx_strerror(r));

  /* The right key still works, and the peer hears from us. */
  CHECK(mx_connect(ep, nic, o->remote_eid, TEST_KEY, 10000, &addr));
  uint64_t n2;
  uint32_t e2, session;
  CHECK(mx_decompose_endpoint_addr2(addr, &n2, &e2, &session));
  EXPECT(n2 == nic && e2 == o->remote_eid, "decomposed address");
  mx_segment_t none = {NULL, 0};
  CHECK(mx_isend(ep, &none, 1, addr, 1, NULL, &req));
  test_wait(ep, &req);
  mx_set_error_handler(old);
  printf("refusals: bad key, closed endpoint, unknown NIC, bad id\n");
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  if (fatal_mode)
    return;
  mx_segment_t none = {NULL, 0};
  mx_request_t r;
  CHECK(mx_irecv(ep, &none, 1, 1, MX_MATCH_MASK_NONE, NULL, &r));
  test_wait(ep, &r);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "-f") == 0) {
    fatal_mode = 1;
    argv[1] = argv[0];
    argc--;
    argv++;
  }
  return test_run(argc, argv, active, passive);
}
