/*
 * A synchronous send to a peer whose process was killed must end with an MX
 * status in bounded time, whatever path the peer was reached by (the
 * backend, or a direct channel between co-located guests).
 *
 * The passive side receives one message, prints "got" and waits for ever
 * (the test kills it). The active side connects, waits (bounded) for a
 * direct channel when XMX_TEST_DIRECT=1, sends that message, prints
 * "ready", waits for a line on stdin (the test kills the passive process
 * meanwhile), then posts a 0-byte mx_issend, which completes only when the
 * receiver matched it, and waits for it at most WAIT_MS: it prints
 * "issend: STATUS in N ms" (STATUS is mx_strstatus of the completion, or
 * "no completion" if the wait ran out).
 */

#include "xmx_test.h"

#include <time.h>

#define WAIT_MS 60000

static uint64_t now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000u + (uint64_t)t.tv_nsec / 1000000u;
}

static void active(mx_endpoint_t ep, struct test_opts *o) {
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  const char *d = getenv("XMX_TEST_DIRECT");
  if (d && atoi(d) == 1) {
    test_wait_counter(ep, "Direct channels opened", 1);
  }
  unsigned char msg[64];
  test_fill(msg, sizeof(msg), 1);
  mx_segment_t seg = {msg, sizeof(msg)};
  mx_request_t r;
  CHECK(mx_isend(ep, &seg, 1, peer, 1, NULL, &r));
  mx_status_t s = test_wait(ep, &r);
  EXPECT(s.code == MX_STATUS_SUCCESS, "first send: %s", mx_strstatus(s.code));
  printf("ready\n");
  fflush(stdout);
  char line[16];
  if (fgets(line, sizeof(line), stdin) == NULL) {
    /* stdin closed: go on at once */
  }
  mx_segment_t none = {NULL, 0};
  CHECK(mx_issend(ep, &none, 1, peer, 2, NULL, &r));
  uint64_t t0 = now_ms();
  uint32_t result = 0;
  CHECK(mx_wait(ep, &r, WAIT_MS, &s, &result));
  uint64_t ms = now_ms() - t0;
  if (result) {
    printf("issend: %s in %llu ms\n", mx_strstatus(s.code), (unsigned long long)ms);
  } else {
    printf("issend: no completion in %llu ms\n", (unsigned long long)ms);
  }
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  unsigned char b[64];
  mx_segment_t seg = {b, sizeof(b)};
  mx_request_t r;
  CHECK(mx_irecv(ep, &seg, 1, 1, MX_MATCH_MASK_NONE, NULL, &r));
  mx_status_t s = test_wait(ep, &r);
  EXPECT(s.code == MX_STATUS_SUCCESS, "recv: %s", mx_strstatus(s.code));
  test_verify(b, s.xfer_length, 1, "message");
  printf("got\n");
  fflush(stdout);
  for (;;) {
    pause();
  }
}

int main(int argc, char **argv) { return test_run(argc, argv, active, passive); }
