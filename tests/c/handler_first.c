/*
 * MX shows an unexpected message to the handler as progress meets it, so a
 * receive the handler posts completes within the MX call whose progress met
 * the message. An MPI transport over MX (MPICH's nemesis MX module) relies
 * on it: each poll takes one completion of its control context, then one
 * of its message context. When control packets and then an MPI message
 * arrive together, the poll must see the first control packet before the
 * MPI message that followed it, or the MPI applies the message first (an
 * RMA epoch's puts after the send that announced their end).
 *
 * The passive side posts the receive of the MPI message, keeps the
 * progression thread out (so nothing progresses its endpoint but its own
 * calls), and lets the active side send three control packets and the
 * message. Its first mx_test_any on the control context must return the
 * first control packet.
 *
 * Single-process mode only: the two sides share flags.
 */

#include <sched.h>
#include <time.h>

#include "xmx_test.h"

#define CONTROL (UINT64_C(1) << 63)
#define FULL_MASK UINT64_MAX
#define MESSAGE (UINT64_C(7) << 16)
#define NCONTROL 3
#define CONTROL_LEN 24

static int connected, ready, sent;

struct handler_state {
  mx_endpoint_t ep;
  int posted;
  mx_request_t req[NCONTROL];
  unsigned char buf[NCONTROL][CONTROL_LEN];
};

static mx_unexp_handler_action_t handler(void *context, mx_endpoint_addr_t source,
                                         uint64_t match_value, uint32_t length, void *data) {
  (void)source;
  (void)data;
  struct handler_state *h = context;
  if (match_value & CONTROL) {
    EXPECT(h->posted < NCONTROL, "more control packets than sent");
    int i = h->posted++;
    mx_segment_t seg = {h->buf[i], length};
    CHECK(mx_irecv(h->ep, &seg, 1, match_value, FULL_MASK, &h->req[i], &h->req[i]));
  }
  return MX_RECV_CONTINUE;
}

/* Waits (at most a minute) until another thread sets `*flag`. */
static void await_flag(int *flag, const char *what) {
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (!__atomic_load_n(flag, __ATOMIC_ACQUIRE)) {
    sched_yield();
    clock_gettime(CLOCK_MONOTONIC, &t);
    EXPECT(t.tv_sec - t0.tv_sec < 60, "%s not seen in 60 s", what);
  }
}

static void active(mx_endpoint_t ep, struct test_opts *o) {
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  __atomic_store_n(&connected, 1, __ATOMIC_RELEASE);
  await_flag(&ready, "the passive side's receive");
  static unsigned char control[NCONTROL][CONTROL_LEN];
  static unsigned char message[8];
  mx_request_t r[NCONTROL + 1];
  for (int i = 0; i < NCONTROL; i++) {
    test_fill(control[i], CONTROL_LEN, 100 + (uint32_t)i);
    mx_segment_t seg = {control[i], CONTROL_LEN};
    CHECK(mx_isend(ep, &seg, 1, peer, CONTROL | (uint64_t)i, NULL, &r[i]));
  }
  test_fill(message, sizeof(message), 7);
  mx_segment_t seg = {message, sizeof(message)};
  CHECK(mx_isend(ep, &seg, 1, peer, MESSAGE, NULL, &r[NCONTROL]));
  for (int i = 0; i <= NCONTROL; i++)
    test_wait(ep, &r[i]);
  __atomic_store_n(&sent, 1, __ATOMIC_RELEASE);
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  static struct handler_state h;
  h.ep = ep;
  CHECK(mx_register_unexp_handler(ep, handler, &h));
  static unsigned char message[8];
  mx_segment_t seg = {message, sizeof(message)};
  mx_request_t mreq;
  CHECK(mx_irecv(ep, &seg, 1, MESSAGE, FULL_MASK, &mreq, &mreq));
  /* The active side's connect is answered before the endpoint is left alone. */
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (!__atomic_load_n(&connected, __ATOMIC_ACQUIRE)) {
    CHECK(mx_progress(ep));
    clock_gettime(CLOCK_MONOTONIC, &t);
    EXPECT(t.tv_sec - t0.tv_sec < 60, "the active side did not connect in 60 s");
  }
  mx_disable_progression(ep);
  __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
  await_flag(&sent, "the active side's sends");

  mx_status_t s;
  uint32_t result = 0;
  CHECK(mx_test_any(ep, CONTROL, CONTROL, &s, &result));
  EXPECT(result == 1, "the call that met the control packets returned none of them");
  EXPECT(s.context == &h.req[0] && s.match_info == CONTROL,
         "first control completion: match %llx", (unsigned long long)s.match_info);
  CHECK(mx_test_any(ep, 0, CONTROL, &s, &result));
  EXPECT(result == 1 && s.context == &mreq && s.msg_length == sizeof(message),
         "the MPI message did not complete");
  test_verify(message, sizeof(message), 7, "message");
  for (int i = 1; i < NCONTROL; i++) {
    CHECK(mx_test_any(ep, CONTROL, CONTROL, &s, &result));
    EXPECT(result == 1 && s.context == &h.req[i] && s.match_info == (CONTROL | (uint64_t)i),
           "control completion %d out of order", i);
  }
  for (int i = 0; i < NCONTROL; i++)
    test_verify(h.buf[i], CONTROL_LEN, 100 + (uint32_t)i, "control packet");
  mx_reenable_progression(ep);
  printf("the first poll took the first control packet, then the message\n");
}

int main(int argc, char **argv) {
  struct test_opts o = test_parse(argc, argv);
  EXPECT(o.listen_eid < 0 && !o.host, "single-process mode only");
  test_open_with_context_id(1, 63);
  return test_run(argc, argv, active, passive);
}
