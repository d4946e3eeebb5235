/*
 * What an MPI's MX transport does: endpoints opened with a context id
 * (MX_PARAM_CONTEXT_ID, one bit at shift 63); an unexpected handler that
 * posts receives itself for control messages and lets data messages go on
 * (MX_RECV_CONTINUE) to wait as unexpected; a LARGE data message that
 * arrives before its receive is posted while other messages are
 * outstanding; completions collected per context with masked
 * mx_wait_any/mx_test_any. Every completion is checked field by field.
 */

#include "xmx_test.h"

#define CTX_BIT (1ull << 63)
#define TAG_CTRL 0xc0ull
#define NDATA 8
#define NCTRL 4
#define BIG 200003

static uint64_t data_match(int i) { return (i % 2 ? CTX_BIT : 0) | (0x200ull + i) << 8; }
static uint64_t ctrl_match(int i) { return (uint64_t)i << 8 | TAG_CTRL; }
static uint32_t data_len(int i) { return i == 0 ? BIG : 17u * (uint32_t)i + 1; }

struct ctrl_state {
  mx_endpoint_t ep;
  unsigned char buf[NCTRL][64];
  mx_request_t req[NCTRL];
  int posted, data_seen;
  mx_endpoint_addr_t source;
};

static mx_unexp_handler_action_t handler(void *context, mx_endpoint_addr_t source,
                                         uint64_t match, uint32_t length, void *data) {
  (void)data;
  struct ctrl_state *c = context;
  c->source = source;
  if ((match & 0xff) == TAG_CTRL) {
    int i = (int)(match >> 8);
    EXPECT(i >= 0 && i < NCTRL && length == 10 + (uint32_t)i, "control %d of %u B", i, length);
    mx_segment_t seg = {c->buf[i], sizeof(c->buf[i])};
    CHECK(mx_irecv(c->ep, &seg, 1, match, MX_MATCH_MASK_NONE, (void *)(uintptr_t)(0xc000 + i),
                   &c->req[i]));
    c->posted++;
  } else {
    c->data_seen++;
  }
  return MX_RECV_CONTINUE;
}

static void active(mx_endpoint_t ep, struct test_opts *o) {
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  unsigned char *data = malloc(BIG);
  EXPECT(data != NULL, "buffer");
  mx_request_t dr[NDATA], cr[NCTRL];
  /* The LARGE one first, then small data and control messages behind it,
   * all outstanding at once. */
  for (int i = 0; i < NDATA; i++) {
    static unsigned char small[NDATA][200];
    unsigned char *b = i == 0 ? data : small[i];
    test_fill(b, data_len(i), (uint32_t)i);
    mx_segment_t seg = {b, data_len(i)};
    CHECK(mx_isend(ep, &seg, 1, peer, data_match(i), NULL, &dr[i]));
    if (i == NDATA / 2) {
      for (int k = 0; k < NCTRL; k++) {
        static unsigned char cbuf[NCTRL][64];
        test_fill(cbuf[k], 10 + k, 100 + k);
        mx_segment_t cs = {cbuf[k], 10 + (uint32_t)k};
        CHECK(mx_isend(ep, &cs, 1, peer, ctrl_match(k), NULL, &cr[k]));
      }
    }
  }
  for (int k = 0; k < NCTRL; k++) test_wait(ep, &cr[k]);
  for (int i = 0; i < NDATA; i++) {
    mx_status_t s = test_wait(ep, &dr[i]);
    EXPECT(s.code == MX_STATUS_SUCCESS && s.match_info == data_match(i) &&
               s.msg_length == data_len(i) && s.xfer_length == data_len(i),
           "data send %d: %s %u/%u", i, mx_strstatus(s.code), s.msg_length, s.xfer_length);
  }
  free(data);
  printf("data and control messages sent with context ids\n");
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  static struct ctrl_state c;
  c.ep = ep;
  CHECK(mx_register_unexp_handler(ep, handler, &c));
  /* The control messages come in through the receives the handler posted. */
  uint64_t nic = 0;
  uint32_t eid = 0;
  for (int k = 0; k < NCTRL; k++) {
    while (c.req[k] == NULL) {
      /* The handler runs during progression: a probe progresses and waits
       * for the next arrival of anything. */
      mx_status_t ps;
      uint32_t found;
      CHECK(mx_probe(ep, 200, ctrl_match(k), ~0ull, &ps, &found));
    }
    mx_status_t s = test_wait(ep, &c.req[k]);
    if (k == 0) CHECK(mx_decompose_endpoint_addr(s.source, &nic, &eid));
    test_status_is(&s, MX_STATUS_SUCCESS, nic, eid, ctrl_match(k), 10 + k, 10 + k,
                   (void *)(uintptr_t)(0xc000 + k), "control message");
    test_verify(c.buf[k], 10 + k, 100 + k, "control data");
  }
  /* Every data message waits unexpected (on a lossy link the last ones may
   * still be on their way: wait for each, so that all of them went past
   * the handler); then post their receives, the LARGE one last, in reverse
   * order of sending. */
  for (int i = 0; i < NDATA; i++) {
    uint32_t found = 0;
    for (int tries = 0; !found && tries < 150; tries++) {
      mx_status_t ps;
      CHECK(mx_probe(ep, 200, data_match(i), ~0ull, &ps, &found));
    }
    EXPECT(found, "data message %d unexpected within 30 s", i);
  }
  static unsigned char bufs[NDATA][BIG + 1];
  mx_request_t r[NDATA];
  for (int i = NDATA - 1; i >= 0; i--) {
    memset(bufs[i], 0xee, data_len(i) + 1);
    mx_segment_t seg = {bufs[i], data_len(i) + 1};
    CHECK(mx_irecv(ep, &seg, 1, data_match(i), ~0ull, (void *)(uintptr_t)(0xd000 + i), &r[i]));
  }
  /* Completions of context 1 first, then of context 0. */
  for (int ctx = 1; ctx >= 0; ctx--) {
    int got = 0;
    while (got < NDATA / 2) {
      mx_status_t s;
      uint32_t result = 0;
      CHECK(mx_wait_any(ep, 30000, ctx ? CTX_BIT : 0, CTX_BIT, &s, &result));
      EXPECT(result == 1, "a completion of context %d within 30 s", ctx);
      int i = (int)(((s.match_info & ~CTX_BIT) >> 8) - 0x200);
      EXPECT(i >= 0 && i < NDATA && (i % 2) == ctx, "context %d completion: match %#llx", ctx,
             (unsigned long long)s.match_info);
      test_status_is(&s, MX_STATUS_SUCCESS, nic, eid, data_match(i), data_len(i), data_len(i),
                     (void *)(uintptr_t)(0xd000 + i), "data message");
      test_verify(bufs[i], data_len(i), (uint32_t)i, "data");
      EXPECT(bufs[i][data_len(i)] == 0xee, "nothing past data %d", i);
      r[i] = NULL;
      got++;
    }
    mx_status_t s;
    uint32_t result = 1;
    CHECK(mx_test_any(ep, ctx ? CTX_BIT : 0, CTX_BIT, &s, &result));
    EXPECT(result == 0, "no more completions of context %d", ctx);
  }
  EXPECT(c.posted == NCTRL && c.data_seen == NDATA, "handler saw %d control, %d data", c.posted,
         c.data_seen);
  printf("context ids, handler-posted receives and masked completions checked\n");
}

int main(int argc, char **argv) {
  test_open_with_context_id(1, 63);
  return test_run(argc, argv, active, passive);
}
