/*
 * An unexpected-message handler: called for messages no receive matches,
 * in order; it may post a receive and continue, drop the message, or leave
 * it queued for a later receive. A LARGE message is shown when it arrives,
 * without data: it is pulled once a receive takes it.
 */

#include "xmx_test.h"

struct seen {
  mx_endpoint_t ep;
  int calls;
  uint64_t match[8];
  uint32_t length[8];
  int had_data[8];
  unsigned char buf[200];
  mx_request_t posted;
};

static mx_unexp_handler_action_t handler(void *context, mx_endpoint_addr_t source,
                                         uint64_t match_value, uint32_t length, void *data) {
  (void)source;
  struct seen *s = context;
  if (s->calls < 8) {
    s->match[s->calls] = match_value;
    s->length[s->calls] = length;
    s->had_data[s->calls] = data != NULL;
  }
  __atomic_add_fetch(&s->calls, 1, __ATOMIC_SEQ_CST);
  if (match_value == 1) {
    mx_segment_t seg = {s->buf, sizeof(s->buf)};
    CHECK(mx_irecv(s->ep, &seg, 1, 1, MX_MATCH_MASK_NONE, NULL, &s->posted));
    return MX_RECV_CONTINUE;
  }
  return match_value == 2 ? MX_RECV_FINISHED : MX_RECV_CONTINUE;
}

static void active(mx_endpoint_t ep, struct test_opts *o) {
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  static unsigned char big[40000];
  unsigned char small[100];
  test_fill(small, sizeof(small), 1);
  test_fill(big, sizeof(big), 3);
  mx_segment_t segs[4] = {{small, 100}, {small, 50}, {big, 40000}, {NULL, 0}};
  mx_request_t r[4];
  for (int i = 0; i < 4; i++)
    CHECK(mx_isend(ep, &segs[i], 1, peer, i + 1, NULL, &r[i]));
  for (int i = 0; i < 4; i++)
    test_wait(ep, &r[i]);
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  static struct seen seen;
  seen.ep = ep;
  mx_request_t last;
  mx_segment_t none = {NULL, 0};
  CHECK(mx_irecv(ep, &none, 1, 4, MX_MATCH_MASK_NONE, NULL, &last));
  CHECK(mx_register_unexp_handler(ep, handler, &seen));
  test_wait(ep, &last);
  mx_status_t s;
  uint32_t result;
  CHECK(mx_probe(ep, MX_INFINITE, 3, MX_MATCH_MASK_NONE, &s, &result));
  EXPECT(result == 1 && s.msg_length == 40000, "continued message kept");
  /* The handler may still run on the background thread. */
  for (int spins = 0; __atomic_load_n(&seen.calls, __ATOMIC_SEQ_CST) < 3 && spins < 1000000; spins++)
    CHECK(mx_progress(ep));
  EXPECT(seen.calls == 3, "handler calls: %d", seen.calls);
  EXPECT(seen.match[0] == 1 && seen.match[1] == 2 && seen.match[2] == 3, "in order");
  EXPECT(seen.length[0] == 100 && seen.length[1] == 50 && seen.length[2] == 40000, "lengths");
  EXPECT(seen.had_data[0] && seen.had_data[1] && !seen.had_data[2], "data given for eager only");
  s = test_wait(ep, &seen.posted);
  EXPECT(s.xfer_length == 100, "receive posted by the handler");
  test_verify(seen.buf, 100, 1, "handler's receive");
  CHECK(mx_iprobe(ep, 2, MX_MATCH_MASK_NONE, &s, &result));
  EXPECT(result == 0, "finished message dropped");
  static unsigned char big[40000];
  mx_segment_t seg = {big, sizeof(big)};
  mx_request_t r;
  CHECK(mx_irecv(ep, &seg, 1, 3, MX_MATCH_MASK_NONE, NULL, &r));
  s = test_wait(ep, &r);
  EXPECT(s.xfer_length == 40000, "kept message received");
  test_verify(big, 40000, 3, "kept message");
  CHECK(mx_register_unexp_handler(ep, NULL, NULL));
  printf("unexpected handler checked\n");
}

int main(int argc, char **argv) { return test_run(argc, argv, active, passive); }
