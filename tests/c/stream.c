/*
 * A one-way stream of many messages posted back to back, every class
 * mixed (more LARGE messages in flight than an endpoint has windows):
 * arrival order, lengths and bytes are checked.
 */

#include "xmx_test.h"

#define COUNT 1500
static const uint32_t lens[] = {0, 17, 200, 5000, 40000};
#define NLENS (sizeof(lens) / sizeof(lens[0]))
#define MAXLEN 40000

static void active(mx_endpoint_t ep, struct test_opts *o) {
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  unsigned char *bufs = malloc((size_t)COUNT * MAXLEN);
  mx_request_t *reqs = calloc(COUNT, sizeof(*reqs));
  EXPECT(bufs && reqs, "memory");
  for (uint32_t i = 0; i < COUNT; i++) {
    uint32_t len = lens[i % NLENS];
    unsigned char *b = bufs + (size_t)i * MAXLEN;
    test_fill(b, len, i);
    mx_segment_t seg = {b, len};
    CHECK(mx_isend(ep, &seg, 1, peer, i, NULL, &reqs[i]));
  }
  for (uint32_t i = 0; i < COUNT; i++) {
    mx_status_t s = test_wait(ep, &reqs[i]);
    EXPECT(s.code == MX_STATUS_SUCCESS, "send %u: %s", i, mx_strstatus(s.code));
  }
  printf("sent %d messages\n", COUNT);
  free(bufs);
  free(reqs);
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  unsigned char *b = malloc(MAXLEN);
  EXPECT(b, "memory");
  for (uint32_t i = 0; i < COUNT; i++) {
    mx_segment_t seg = {b, MAXLEN};
    mx_request_t r;
    CHECK(mx_irecv(ep, &seg, 1, 0, 0, NULL, &r));
    mx_status_t s = test_wait(ep, &r);
    EXPECT(s.code == MX_STATUS_SUCCESS, "recv %u: %s", i, mx_strstatus(s.code));
    EXPECT(s.match_info == i, "message %u arrived in place of %u", (unsigned)s.match_info, i);
    EXPECT(s.xfer_length == lens[i % NLENS], "length of %u", i);
    test_verify(b, s.xfer_length, i, "stream");
  }
  printf("received %d messages in order\n", COUNT);
  free(b);
}

int main(int argc, char **argv) { return test_run(argc, argv, active, passive); }
