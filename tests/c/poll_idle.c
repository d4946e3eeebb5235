/*
 * An application that polls with mx_test / mx_test_any / mx_iprobe in a tight
 * loop while nothing arrives is never put to sleep by those calls, however
 * long nothing moves (an MPI progress engine polls MX between looks at its
 * shared memory, which the library never sees), and a message that then
 * arrives is found by the polling. A sleep is a voluntary context switch; a
 * yield or a preemption is not.
 */

#define _GNU_SOURCE /* RUSAGE_THREAD */
#include <sys/resource.h>

#include "xmx_test.h"

#define IDLE_NS 300000000ull /* how long the passive side polls in vain */
#define DATA_LEN 3000

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static long voluntary_switches(void) {
  struct rusage ru;
  EXPECT(getrusage(RUSAGE_THREAD, &ru) == 0, "getrusage");
  return ru.ru_nvcsw;
}

static void active(mx_endpoint_t ep, struct test_opts *o) {
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  mx_segment_t none = {NULL, 0};
  mx_request_t r;
  /* Hello (so the passive side can connect back), then wait for its word
   * that its idle polling is over. */
  CHECK(mx_isend(ep, &none, 1, peer, 0x50, NULL, &r));
  EXPECT(test_wait(ep, &r).code == MX_STATUS_SUCCESS, "hello sent");
  CHECK(mx_irecv(ep, &none, 1, 0x60, MX_MATCH_MASK_NONE, NULL, &r));
  mx_status_t s = test_wait(ep, &r);
  EXPECT(s.code == MX_STATUS_SUCCESS, "go received");
  static unsigned char data[DATA_LEN];
  test_fill(data, DATA_LEN, 77);
  mx_segment_t seg = {data, DATA_LEN};
  CHECK(mx_isend(ep, &seg, 1, peer, 0x77, NULL, &r));
  s = test_wait(ep, &r);
  EXPECT(s.code == MX_STATUS_SUCCESS, "data sent");
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  static unsigned char buf[DATA_LEN];
  mx_segment_t none = {NULL, 0};
  mx_request_t r;
  CHECK(mx_irecv(ep, &none, 1, 0x50, MX_MATCH_MASK_NONE, NULL, &r));
  mx_status_t s = test_wait(ep, &r);
  EXPECT(s.code == MX_STATUS_SUCCESS, "hello received");
  mx_endpoint_addr_t peer = test_connect_back(ep, &s);
  mx_segment_t seg = {buf, DATA_LEN};
  uint32_t result = 0;
  CHECK(mx_irecv(ep, &seg, 1, 0x77, MX_MATCH_MASK_NONE, NULL, &r));
  long before = voluntary_switches();
  uint64_t calls = 0, start = mono_ns();
  while (mono_ns() - start < IDLE_NS) {
    CHECK(mx_test(ep, &r, &s, &result));
    EXPECT(result == 0, "nothing was sent yet");
    CHECK(mx_test_any(ep, 0x99, MX_MATCH_MASK_NONE, &s, &result));
    EXPECT(result == 0, "no request matches 0x99");
    CHECK(mx_iprobe(ep, 0x99, MX_MATCH_MASK_NONE, &s, &result));
    EXPECT(result == 0, "no message matches 0x99");
    calls += 3;
  }
  long sleeps = voluntary_switches() - before;
  /* A nap in idle calls made nearly every call after the first few
   * microseconds a sleep; what is left are rare waits for the endpoint's lock
   * while a background thread holds it. */
  EXPECT(calls >= 1000 && sleeps * 10 < (long)calls,
         "idle nonblocking calls slept %ld times in %llu calls", sleeps,
         (unsigned long long)calls);
  /* Tell the active side to send, then find the message by polling. */
  mx_request_t go;
  CHECK(mx_isend(ep, &none, 1, peer, 0x60, NULL, &go));
  s = test_wait(ep, &go);
  EXPECT(s.code == MX_STATUS_SUCCESS, "go sent");
  result = 0;
  while (!result) CHECK(mx_test(ep, &r, &s, &result));
  EXPECT(s.code == MX_STATUS_SUCCESS && s.xfer_length == DATA_LEN, "data received");
  test_verify(buf, DATA_LEN, 77, "polled message");
  printf("idle polling slept %ld times in %llu calls, then found the message\n", sleeps,
         (unsigned long long)calls);
}

int main(int argc, char **argv) { return test_run(argc, argv, active, passive); }
