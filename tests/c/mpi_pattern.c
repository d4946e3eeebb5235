/*
 * How an MPI transport over MX (MPICH's ch3:nemesis:mx) uses the library:
 * endpoints opened with a one-bit context id at shift 63 (set: control
 * packets, clear: MPI messages), an unexpected handler that posts the
 * receive of every control packet itself and lets MPI messages wait in the
 * unexpected queue, completions taken with mx_test_any per context.
 *
 * Phase 1: messages of one match info, a LARGE one first, arrive before any
 * receive for them is posted; the receives posted afterwards must take them
 * in arrival order (MPI's non-overtaking rule), with every status field
 * exact. Phase 2: both sides send LARGE and small messages of one match
 * info to each other at once, then receive them (an allreduce step).
 */

#include <time.h>

#include "xmx_test.h"

#define CONTROL (UINT64_C(1) << 63)
#define CONTEXT_MASK CONTROL
#define FULL_MASK UINT64_MAX
#define DIRECT(tag) ((uint64_t)(tag) << 16)
#define ROUNDS 4
#define NMSG 4
#define CONTROL_LEN 24

static const uint32_t lengths[NMSG] = {262147, 4, 20000, 65536};

struct control_slot {
  mx_request_t req;
  unsigned char buf[CONTROL_LEN];
};

struct handler_state {
  mx_endpoint_t ep;
  int posted;
  struct control_slot slots[ROUNDS * 2];
};

static mx_unexp_handler_action_t handler(void *context, mx_endpoint_addr_t source,
                                         uint64_t match_value, uint32_t length, void *data) {
  (void)source;
  (void)data;
  struct handler_state *h = context;
  if (match_value & CONTROL) {
    EXPECT(h->posted < ROUNDS * 2, "more control packets than sent");
    EXPECT(length == CONTROL_LEN, "control packet of %u bytes", length);
    struct control_slot *slot = &h->slots[h->posted++];
    mx_segment_t seg = {slot->buf, length};
    CHECK(mx_irecv(h->ep, &seg, 1, match_value, FULL_MASK, slot, &slot->req));
  }
  return MX_RECV_CONTINUE;
}

/* Polls mx_test_any on one context until a request completes (at most a
 * minute). */
static mx_status_t test_any(mx_endpoint_t ep, uint64_t context) {
  mx_status_t s;
  uint32_t result = 0;
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (!result) {
    CHECK(mx_test_any(ep, context, CONTEXT_MASK, &s, &result));
    clock_gettime(CLOCK_MONOTONIC, &t);
    EXPECT(result || t.tv_sec - t0.tv_sec < 60, "no completion on context %llx in 60 s",
           (unsigned long long)context);
  }
  return s;
}

static void same_peer(mx_endpoint_addr_t a, mx_endpoint_addr_t b, const char *what) {
  uint64_t na, nb;
  uint32_t ea, eb;
  CHECK(mx_decompose_endpoint_addr(a, &na, &ea));
  CHECK(mx_decompose_endpoint_addr(b, &nb, &eb));
  EXPECT(na == nb && ea == eb, "%s: source %llx:%u, peer %llx:%u", what, (unsigned long long)na,
         ea, (unsigned long long)nb, eb);
}

struct incoming {
  unsigned char *buf[NMSG];
  mx_request_t req[NMSG];
  int done[NMSG];
};

struct outgoing {
  unsigned char *buf[NMSG];
  mx_request_t req[NMSG];
};

/* Posts the receives of the NMSG messages of `match`, one per capacity of
 * `lengths`, each with its own context. */
static void post_receives(mx_endpoint_t ep, uint64_t match, struct incoming *in) {
  for (int i = 0; i < NMSG; i++) {
    in->buf[i] = malloc(lengths[i]);
    in->done[i] = 0;
    mx_segment_t seg = {in->buf[i], lengths[i]};
    CHECK(mx_irecv(ep, &seg, 1, match, FULL_MASK, &in->req[i], &in->req[i]));
  }
}

/* Checks a receive completion: receive i must have taken message i. */
static void received(const mx_status_t *s, struct incoming *in, mx_endpoint_addr_t peer,
                     uint64_t match, uint32_t seed, const char *what) {
  mx_request_t *req = s->context;
  EXPECT(req >= in->req && req < in->req + NMSG, "%s: completion of an unknown request", what);
  int i = (int)(req - in->req);
  EXPECT(!in->done[i], "%s: receive %d completed twice", what, i);
  in->done[i] = 1;
  EXPECT(s->code == MX_STATUS_SUCCESS, "%s: receive %d ended with %s", what, i,
         mx_strstatus(s->code));
  EXPECT(s->match_info == match, "%s: receive %d match %llx", what, i,
         (unsigned long long)s->match_info);
  EXPECT(s->msg_length == lengths[i] && s->xfer_length == lengths[i],
         "%s: receive %d of capacity %u took a message of %u bytes (%u transferred): out of "
         "order",
         what, i, lengths[i], s->msg_length, s->xfer_length);
  same_peer(s->source, peer, what);
  test_verify(in->buf[i], lengths[i], seed + (uint32_t)i, what);
  free(in->buf[i]);
}

static void send_all(mx_endpoint_t ep, mx_endpoint_addr_t peer, uint64_t match, uint32_t seed,
                     struct outgoing *o) {
  for (int i = 0; i < NMSG; i++) {
    o->buf[i] = malloc(lengths[i]);
    test_fill(o->buf[i], lengths[i], seed + (uint32_t)i);
    mx_segment_t seg = {o->buf[i], lengths[i]};
    CHECK(mx_isend(ep, &seg, 1, peer, match, &o->req[i], &o->req[i]));
  }
}

/* Checks a send completion; returns 0 if it is not one of `o`. */
static int sent(const mx_status_t *s, struct outgoing *o, uint64_t match) {
  mx_request_t *req = s->context;
  if (req < o->req || req >= o->req + NMSG)
    return 0;
  int i = (int)(req - o->req);
  EXPECT(s->code == MX_STATUS_SUCCESS && s->match_info == match && s->msg_length == lengths[i],
         "send %d: %s, match %llx, %u bytes", i, mx_strstatus(s->code),
         (unsigned long long)s->match_info, s->msg_length);
  free(o->buf[i]);
  return 1;
}

/* Takes NMSG completions of `o` (if given) and of `in` (if given) with
 * mx_test_any on the MPI context, in whatever order they come. */
static void complete(mx_endpoint_t ep, struct outgoing *o, struct incoming *in,
                     mx_endpoint_addr_t peer, uint64_t match, uint32_t seed, const char *what) {
  int left = (o ? NMSG : 0) + (in ? NMSG : 0);
  for (; left > 0; left--) {
    mx_status_t s = test_any(ep, 0);
    if (!(o && sent(&s, o, match)))
      received(&s, in, peer, match, seed, what);
  }
}

static void send_control(mx_endpoint_t ep, mx_endpoint_addr_t peer, uint32_t round) {
  unsigned char pkt[CONTROL_LEN];
  test_fill(pkt, sizeof(pkt), 1000 + round);
  mx_segment_t seg = {pkt, sizeof(pkt)};
  mx_request_t r;
  CHECK(mx_isend(ep, &seg, 1, peer, CONTROL, &r, &r));
  mx_status_t s = test_any(ep, CONTROL);
  EXPECT(s.context == &r && s.code == MX_STATUS_SUCCESS, "control send");
}

static void take_control(mx_endpoint_t ep, struct handler_state *h, uint32_t round) {
  mx_status_t s = test_any(ep, CONTROL);
  struct control_slot *slot = s.context;
  EXPECT(slot == &h->slots[round], "control packet %u completed out of order", round);
  EXPECT(s.code == MX_STATUS_SUCCESS && s.match_info == CONTROL && s.msg_length == CONTROL_LEN &&
             s.xfer_length == CONTROL_LEN,
         "control status");
  test_verify(slot->buf, CONTROL_LEN, 1000 + round, "control packet");
}

static void active(mx_endpoint_t ep, struct test_opts *o) {
  static struct handler_state h;
  h.ep = ep;
  CHECK(mx_register_unexp_handler(ep, handler, &h));
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  for (uint32_t round = 0; round < ROUNDS; round++) {
    struct outgoing out;
    send_all(ep, peer, DIRECT(1), 10 * round, &out);
    /* Sent after them: when it arrives, they all have. */
    send_control(ep, peer, round);
    complete(ep, &out, NULL, peer, DIRECT(1), 0, "phase 1 sends");
  }
  for (uint32_t round = 0; round < ROUNDS; round++) {
    struct outgoing out;
    struct incoming in;
    post_receives(ep, DIRECT(2), &in);
    send_all(ep, peer, DIRECT(2), 100 + 10 * round, &out);
    complete(ep, &out, &in, peer, DIRECT(2), 200 + 10 * round, "exchange, active side");
  }
  printf("sent %d rounds of LARGE and small messages, exchanged %d more\n", ROUNDS, ROUNDS);
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  static struct handler_state h;
  h.ep = ep;
  CHECK(mx_register_unexp_handler(ep, handler, &h));
  mx_endpoint_addr_t peer;
  memset(&peer, 0, sizeof(peer));
  for (uint32_t round = 0; round < ROUNDS; round++) {
    take_control(ep, &h, round);
    mx_status_t s;
    uint32_t result;
    CHECK(mx_iprobe(ep, DIRECT(1), FULL_MASK, &s, &result));
    EXPECT(result == 1, "the messages sent before the control packet are queued");
    EXPECT(s.msg_length == lengths[0], "the first queued message has %u bytes, not %u",
           s.msg_length, lengths[0]);
    /* MPI takes a probed message's size from xfer_length. */
    EXPECT(s.code == MX_STATUS_SUCCESS && s.match_info == DIRECT(1) &&
               s.xfer_length == lengths[0],
           "iprobe status: %s, match %llx, xfer_length %u", mx_strstatus(s.code),
           (unsigned long long)s.match_info, s.xfer_length);
    CHECK(mx_probe(ep, MX_INFINITE, DIRECT(1), FULL_MASK, &s, &result));
    EXPECT(result == 1 && s.msg_length == lengths[0] && s.xfer_length == lengths[0],
           "probe status: %u bytes, xfer_length %u", s.msg_length, s.xfer_length);
    if (round == 0)
      peer = test_connect_back(ep, &s);
    struct incoming in;
    post_receives(ep, DIRECT(1), &in);
    complete(ep, NULL, &in, peer, DIRECT(1), 10 * round, "unexpected, in arrival order");
  }
  for (uint32_t round = 0; round < ROUNDS; round++) {
    struct outgoing out;
    struct incoming in;
    send_all(ep, peer, DIRECT(2), 200 + 10 * round, &out);
    post_receives(ep, DIRECT(2), &in);
    complete(ep, &out, &in, peer, DIRECT(2), 100 + 10 * round, "exchange, passive side");
  }
  printf("received %d rounds in arrival order, exchanged %d more\n", ROUNDS, ROUNDS);
}

int main(int argc, char **argv) {
  test_open_with_context_id(1, 63);
  return test_run(argc, argv, active, passive);
}
