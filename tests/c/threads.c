/*
 * Several threads share one endpoint: each exchanges its own messages
 * (told apart by match info) with the peer, concurrently.
 */

#include "xmx_test.h"

#define THREADS 4
#define ROUNDS 300
#define THREAD_MASK 0xffffffff00000000ull

struct worker {
  mx_endpoint_t ep;
  mx_endpoint_addr_t peer;
  uint64_t id;
};

static void *work(void *p) {
  struct worker *w = p;
  unsigned char out[3000], in[3000];
  for (uint32_t i = 0; i < ROUNDS; i++) {
    uint32_t len = (i * 37 + (uint32_t)w->id * 11) % sizeof(out);
    uint64_t tag = (w->id << 32) | i;
    test_fill(out, len, (uint32_t)tag);
    mx_segment_t sseg = {out, len}, rseg = {in, sizeof(in)};
    mx_request_t sreq, rreq;
    CHECK(mx_irecv(w->ep, &rseg, 1, tag, MX_MATCH_MASK_NONE, NULL, &rreq));
    CHECK(mx_isend(w->ep, &sseg, 1, w->peer, tag, NULL, &sreq));
    mx_status_t s = test_wait(w->ep, &rreq);
    EXPECT(s.xfer_length == len && s.match_info == tag, "echo of %llx", (unsigned long long)tag);
    test_verify(in, len, (uint32_t)tag, "echo");
    test_wait(w->ep, &sreq);
  }
  return NULL;
}

static void active(mx_endpoint_t ep, struct test_opts *o) {
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  /* Announce ourselves so that the echo side connects back. */
  mx_segment_t none = {NULL, 0};
  mx_request_t r;
  CHECK(mx_isend(ep, &none, 1, peer, ~0ull, NULL, &r));
  test_wait(ep, &r);
  pthread_t t[THREADS];
  struct worker w[THREADS];
  for (int i = 0; i < THREADS; i++) {
    w[i] = (struct worker){ep, peer, (uint64_t)i + 1};
    EXPECT(pthread_create(&t[i], NULL, work, &w[i]) == 0, "thread");
  }
  for (int i = 0; i < THREADS; i++)
    pthread_join(t[i], NULL);
  printf("%d threads x %d round trips on one endpoint\n", THREADS, ROUNDS);
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  unsigned char buf[3000];
  mx_segment_t none = {NULL, 0};
  mx_request_t r;
  CHECK(mx_irecv(ep, &none, 1, ~0ull, MX_MATCH_MASK_NONE, NULL, &r));
  mx_status_t s = test_wait(ep, &r);
  mx_endpoint_addr_t peer = test_connect_back(ep, &s);
  for (int k = 0; k < THREADS * ROUNDS; k++) {
    mx_segment_t seg = {buf, sizeof(buf)};
    CHECK(mx_irecv(ep, &seg, 1, 0, 0, NULL, &r));
    s = test_wait(ep, &r);
    mx_segment_t back = {buf, s.xfer_length};
    CHECK(mx_isend(ep, &back, 1, peer, s.match_info, NULL, &r));
    test_wait(ep, &r);
  }
}

int main(int argc, char **argv) { return test_run(argc, argv, active, passive); }
