/*
 * What an MPI transport over MX relies on (MPICH's nemesis MX module does
 * this for every packet): its unexpected handler takes a request from a
 * free list the application refills between MX calls, with progression
 * disabled around the refill. MX calls the handler either inside the
 * application's MX calls or from its progression thread, never while
 * progression is disabled. The passive side keeps re-entering such a
 * section while a stream of small messages arrives unexpected; the handler
 * checks it never runs inside one, posts a receive for each message, and
 * every message is checked.
 *
 * SECTION_MESSAGES (default 20000) sets the stream's length.
 */

#include "xmx_test.h"

#define M_DATA 0x5ec0000000000000ull
#define WINDOW 16

struct passive_state {
  mx_endpoint_t ep;
  int in_section;
  int violations;
  int handled;
  uint32_t n;
  uint32_t *slot;
};

static mx_unexp_handler_action_t handler(void *context, mx_endpoint_addr_t source,
                                         uint64_t match_value, uint32_t length, void *data) {
  (void)source;
  (void)data;
  struct passive_state *s = context;
  if (__atomic_load_n(&s->in_section, __ATOMIC_SEQ_CST))
    __atomic_add_fetch(&s->violations, 1, __ATOMIC_SEQ_CST);
  uint32_t i = (uint32_t)match_value;
  if ((match_value & ~0xffffffffull) != M_DATA || length != sizeof(uint32_t) || i >= s->n)
    return MX_RECV_CONTINUE;
  mx_segment_t seg = {&s->slot[i], sizeof(uint32_t)};
  mx_request_t r;
  CHECK(mx_irecv(s->ep, &seg, 1, match_value, MX_MATCH_MASK_NONE, (void *)(uintptr_t)(i + 1), &r));
  __atomic_add_fetch(&s->handled, 1, __ATOMIC_SEQ_CST);
  return MX_RECV_CONTINUE;
}

static void active(mx_endpoint_t ep, struct test_opts *o) {
  uint32_t n = test_env_or("SECTION_MESSAGES", 20000);
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  static uint32_t payload[WINDOW];
  mx_request_t r[WINDOW];
  for (uint32_t i = 0; i < n; i++) {
    uint32_t k = i % WINDOW;
    if (i >= WINDOW)
      test_wait(ep, &r[k]);
    payload[k] = i;
    mx_segment_t seg = {&payload[k], sizeof(uint32_t)};
    CHECK(mx_isend(ep, &seg, 1, peer, M_DATA | i, NULL, &r[k]));
  }
  for (uint32_t i = n > WINDOW ? n - WINDOW : 0; i < n; i++)
    test_wait(ep, &r[i % WINDOW]);
  printf("active: %u messages sent\n", n);
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  uint32_t n = test_env_or("SECTION_MESSAGES", 20000);
  static struct passive_state s;
  s.ep = ep;
  s.n = n;
  s.slot = calloc(n, sizeof(uint32_t));
  EXPECT(s.slot, "memory");
  CHECK(mx_register_unexp_handler(ep, handler, &s));
  uint32_t received = 0;
  while (received < n) {
    /* Work outside MX with progression allowed: the progression thread
     * may start on an arrival here and still be at it when the section
     * below begins. */
    for (volatile int spin = 0; spin < 2000; spin++) {
    }
    CHECK(mx_disable_progression(ep));
    __atomic_store_n(&s.in_section, 1, __ATOMIC_SEQ_CST);
    /* The refill: long enough for the progression thread to find work. */
    for (volatile int spin = 0; spin < 2000; spin++) {
    }
    __atomic_store_n(&s.in_section, 0, __ATOMIC_SEQ_CST);
    CHECK(mx_reenable_progression(ep));
    mx_status_t st;
    uint32_t result = 0;
    CHECK(mx_test_any(ep, M_DATA, 0xffffffff00000000ull, &st, &result));
    if (!result)
      continue;
    uint32_t i = (uint32_t)(uintptr_t)st.context - 1;
    EXPECT(st.code == MX_STATUS_SUCCESS && st.xfer_length == sizeof(uint32_t) &&
               st.match_info == (M_DATA | i),
           "message %u: %s, %u bytes, match %llx", i, mx_strstatus(st.code), st.xfer_length,
           (unsigned long long)st.match_info);
    EXPECT(i < n && s.slot[i] == i, "message %u carried %u", i, i < n ? s.slot[i] : 0);
    received++;
  }
  EXPECT(s.violations == 0, "the handler ran %d times while progression was disabled",
         s.violations);
  printf("passive: %u messages, the handler never inside a disabled section\n", received);
}

int main(int argc, char **argv) { return test_run(argc, argv, active, passive); }
