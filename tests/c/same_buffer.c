/*
 * LARGE sends of one buffer with several in flight at once, as a stream or a
 * broadcast tree sends them: every copy carries the buffer's bytes as they were
 * when it was posted. Two rounds of eight sends of one 1 MiB buffer; the buffer
 * changes between the rounds, once every send of the first has completed, and
 * the second round must carry the new bytes.
 */

#include "xmx_test.h"

#define LEN (1u << 20)
#define ROUNDS 2
#define IN_FLIGHT 8

static void active(mx_endpoint_t ep, struct test_opts *o) {
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  unsigned char *b = malloc(LEN);
  EXPECT(b, "memory");
  for (uint32_t round = 0; round < ROUNDS; round++) {
    test_fill(b, LEN, 1000 + round);
    mx_request_t reqs[IN_FLIGHT];
    mx_segment_t seg = {b, LEN};
    for (uint32_t i = 0; i < IN_FLIGHT; i++)
      CHECK(mx_isend(ep, &seg, 1, peer, round * IN_FLIGHT + i, NULL, &reqs[i]));
    for (uint32_t i = 0; i < IN_FLIGHT; i++) {
      mx_status_t s = test_wait(ep, &reqs[i]);
      EXPECT(s.code == MX_STATUS_SUCCESS, "send %u of round %u: %s", i, round,
             mx_strstatus(s.code));
    }
  }
  printf("%d rounds of %d sends of one buffer\n", ROUNDS, IN_FLIGHT);
  free(b);
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  unsigned char *b = malloc(LEN);
  EXPECT(b, "memory");
  for (uint32_t n = 0; n < ROUNDS * IN_FLIGHT; n++) {
    mx_segment_t seg = {b, LEN};
    mx_request_t r;
    memset(b, 0, LEN);
    CHECK(mx_irecv(ep, &seg, 1, n, MX_MATCH_MASK_NONE, NULL, &r));
    mx_status_t s = test_wait(ep, &r);
    EXPECT(s.code == MX_STATUS_SUCCESS, "recv %u: %s", n, mx_strstatus(s.code));
    EXPECT(s.xfer_length == LEN, "length of %u", n);
    test_verify(b, LEN, 1000 + n / IN_FLIGHT, "same buffer");
  }
  printf("received %d copies, each as sent\n", ROUNDS * IN_FLIGHT);
  free(b);
}

int main(int argc, char **argv) { return test_run(argc, argv, active, passive); }
