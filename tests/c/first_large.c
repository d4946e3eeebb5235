/*
 * The first message on a connection is LARGE (64 KiB): the passive side
 * receives it before it ever connected back, then connects back to the
 * sender and answers on that connection. More LARGE and small rounds follow,
 * each byte checked on both sides.
 */

#include "xmx_test.h"

static const uint32_t sizes[] = {65536, 65536, 200000, 1 << 20, 8, 0};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))
#define MAXLEN (1u << 20)

static void active(mx_endpoint_t ep, struct test_opts *o) {
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  unsigned char *out = malloc(MAXLEN), *in = malloc(MAXLEN);
  EXPECT(out && in, "memory");
  for (unsigned i = 0; i < NSIZES; i++) {
    uint32_t len = sizes[i];
    mx_segment_t sseg = {out, len}, rseg = {in, len};
    mx_request_t sreq, rreq;
    test_fill(out, len, 100 + i);
    CHECK(mx_irecv(ep, &rseg, 1, 1000 + i, MX_MATCH_MASK_NONE, NULL, &rreq));
    CHECK(mx_isend(ep, &sseg, 1, peer, i, NULL, &sreq));
    mx_status_t s = test_wait(ep, &sreq);
    EXPECT(s.code == MX_STATUS_SUCCESS, "send of %u: %s", len, mx_strstatus(s.code));
    s = test_wait(ep, &rreq);
    EXPECT(s.code == MX_STATUS_SUCCESS && s.xfer_length == len, "reply of %u: %s, %u bytes",
           len, mx_strstatus(s.code), s.xfer_length);
    test_verify(in, len, 200 + i, "reply");
  }
  printf("first message of %u bytes, %u rounds answered on the connection back\n", sizes[0],
         (unsigned)NSIZES);
  free(out);
  free(in);
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  unsigned char *out = malloc(MAXLEN), *in = malloc(MAXLEN);
  mx_endpoint_addr_t peer;
  EXPECT(out && in, "memory");
  for (unsigned i = 0; i < NSIZES; i++) {
    uint32_t len = sizes[i];
    mx_segment_t rseg = {in, len};
    mx_request_t rreq, sreq;
    CHECK(mx_irecv(ep, &rseg, 1, i, MX_MATCH_MASK_NONE, NULL, &rreq));
    mx_status_t s = test_wait(ep, &rreq);
    EXPECT(s.code == MX_STATUS_SUCCESS && s.xfer_length == len, "message of %u: %s", len,
           mx_strstatus(s.code));
    test_verify(in, len, 100 + i, "message");
    if (i == 0) {
      peer = test_connect_back(ep, &s);
    }
    test_fill(out, len, 200 + i);
    mx_segment_t sseg = {out, len};
    CHECK(mx_isend(ep, &sseg, 1, peer, 1000 + i, NULL, &sreq));
    s = test_wait(ep, &sreq);
    EXPECT(s.code == MX_STATUS_SUCCESS, "reply send of %u: %s", len, mx_strstatus(s.code));
  }
  free(out);
  free(in);
}

int main(int argc, char **argv) { return test_run(argc, argv, active, passive); }
