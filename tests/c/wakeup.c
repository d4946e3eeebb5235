/*
 * mx_wakeup from another thread ends a blocked mx_wait / mx_wait_any /
 * mx_peek / mx_probe with result 0; a finite timeout ends one too. Needs no
 * peer.
 */

#include <time.h>

#include "xmx_test.h"

enum { WAIT, WAIT_ANY, PEEK, PROBE, NKINDS };
static const char *names[] = {"mx_wait", "mx_wait_any", "mx_peek", "mx_probe"};

struct blocked {
  mx_endpoint_t ep;
  mx_request_t req;
  int kind;
  uint32_t result;
  mx_return_t ret;
  int returned;
  pthread_mutex_t lock;
  pthread_cond_t cond;
};

static void *blocker(void *p) {
  struct blocked *b = p;
  mx_status_t s;
  mx_request_t peeked;
  uint32_t result = 7;
  switch (b->kind) {
  case WAIT: b->ret = mx_wait(b->ep, &b->req, MX_INFINITE, &s, &result); break;
  case WAIT_ANY: b->ret = mx_wait_any(b->ep, MX_INFINITE, 0x77, MX_MATCH_MASK_NONE, &s, &result); break;
  case PEEK: b->ret = mx_peek(b->ep, MX_INFINITE, &peeked, &result); break;
  default: b->ret = mx_probe(b->ep, MX_INFINITE, 0x99, MX_MATCH_MASK_NONE, &s, &result); break;
  }
  pthread_mutex_lock(&b->lock);
  b->result = result;
  b->returned = 1;
  pthread_cond_signal(&b->cond);
  pthread_mutex_unlock(&b->lock);
  return NULL;
}

int main(int argc, char **argv) {
  (void)argc;
  CHECK(mx_init());
  mx_endpoint_t ep = test_open(MX_ANY_ENDPOINT);
  char buf[8];
  mx_segment_t seg = {buf, sizeof(buf)};
  for (int kind = 0; kind < NKINDS; kind++) {
    struct blocked b = {.ep = ep, .kind = kind};
    pthread_mutex_init(&b.lock, NULL);
    pthread_cond_init(&b.cond, NULL);
    CHECK(mx_irecv(ep, &seg, 1, 0x1234, MX_MATCH_MASK_NONE, NULL, &b.req));
    pthread_t t;
    EXPECT(pthread_create(&t, NULL, blocker, &b) == 0, "thread");
    /* A wakeup only ends calls blocked at that moment: ring until the
     * blocked thread reports that it returned. */
    pthread_mutex_lock(&b.lock);
    while (!b.returned) {
      CHECK(mx_wakeup(ep));
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += 2000000;
      if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
      }
      pthread_cond_timedwait(&b.cond, &b.lock, &ts);
    }
    pthread_mutex_unlock(&b.lock);
    pthread_join(t, NULL);
    EXPECT(b.ret == MX_SUCCESS && b.result == 0, "%s woken: ret %d result %u", names[kind],
           b.ret, b.result);
    printf("%s returned on mx_wakeup\n", names[kind]);
    uint32_t r;
    CHECK(mx_cancel(ep, &b.req, &r));
    EXPECT(r == 1 && b.req == NULL, "the receive was still pending");
  }
  /* A finite timeout ends a wait that nothing completes. */
  mx_request_t req;
  mx_status_t s;
  uint32_t result = 7;
  CHECK(mx_irecv(ep, &seg, 1, 0x4321, MX_MATCH_MASK_NONE, NULL, &req));
  CHECK(mx_wait(ep, &req, 20, &s, &result));
  EXPECT(result == 0 && req != NULL, "timeout leaves the request pending");
  CHECK(mx_close_endpoint(ep));
  CHECK(mx_finalize());
  printf("PASS %s\n", argv[0]);
  return 0;
}
