/*
 * Sending to oneself: an endpoint sends to the address mx_get_endpoint_addr
 * gives it, without mx_connect (MX connects every endpoint to itself when it
 * opens), at every message-class boundary, through segment lists, with the
 * receive posted first and with the message arriving unexpected, by
 * mx_isend and mx_issend, and with a short receive buffer. Every completion
 * is checked field by field. Both roles do this on their own endpoint.
 */

#include "xmx_test.h"

static const uint32_t sizes[] = {0,     1,     32,    33,    128,   129,   4095,    4096,
                                 4097,  32767, 32768, 32769, 65536, 77777, 1 << 20};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))
#define MAXLEN (1 << 20)

static void one(mx_endpoint_t ep, mx_endpoint_addr_t me, uint64_t nic, uint32_t eid,
                uint32_t len, uint32_t buflen, int sync, int recv_first, uint64_t match,
                unsigned char *sbuf, unsigned char *rbuf) {
  char what[96];
  snprintf(what, sizeof(what), "%u B to self (buffer %u, %s, %s)", len, buflen,
           sync ? "issend" : "isend", recv_first ? "expected" : "unexpected");
  test_fill(sbuf, len, (uint32_t)match);
  memset(rbuf, 0xee, buflen + 1);
  mx_segment_t ss[3], rs[2];
  test_split(sbuf, len, ss, 3);
  test_split(rbuf, buflen, rs, 2);
  mx_request_t sr, rr;
  void *sctx = (void *)(uintptr_t)(0x5000 + len), *rctx = (void *)(uintptr_t)(0x9000 + len);
  if (recv_first) CHECK(mx_irecv(ep, rs, 2, match, MX_MATCH_MASK_NONE, rctx, &rr));
  if (sync)
    CHECK(mx_issend(ep, ss, 3, me, match, sctx, &sr));
  else
    CHECK(mx_isend(ep, ss, 3, me, match, sctx, &sr));
  if (!recv_first) {
    /* The message is in (unexpected) before the receive is posted. */
    mx_status_t ps;
    uint32_t found = 0;
    CHECK(mx_probe(ep, 10000, match, MX_MATCH_MASK_NONE, &ps, &found));
    EXPECT(found == 1, "%s: mx_probe found it", what);
    EXPECT(ps.match_info == match && ps.msg_length == len, "%s: probe %#llx %u", what,
           (unsigned long long)ps.match_info, ps.msg_length);
    CHECK(mx_irecv(ep, rs, 2, match, MX_MATCH_MASK_NONE, rctx, &rr));
  }
  uint32_t taken = len < buflen ? len : buflen;
  mx_status_t r = test_wait(ep, &rr);
  test_status_is(&r, len > buflen ? MX_STATUS_TRUNCATED : MX_STATUS_SUCCESS, nic, eid, match,
                 len, taken, rctx, what);
  mx_status_t s = test_wait(ep, &sr);
  /* A rendezvous send (LARGE or synchronous) reports what the receiver
   * took; an eager one its whole length. */
  int rndv = sync || len > 32768;
  test_status_is(&s, MX_STATUS_SUCCESS, nic, eid, match, len, rndv ? taken : len, sctx, what);
  test_verify(rbuf, taken, (uint32_t)match, what);
  EXPECT(rbuf[taken] == 0xee, "%s: nothing written past the data", what);
}

static void self_role(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  unsigned char *sbuf = malloc(MAXLEN + 1), *rbuf = malloc(MAXLEN + 1);
  EXPECT(sbuf && rbuf, "buffers");
  mx_endpoint_addr_t me;
  uint64_t nic;
  uint32_t eid;
  test_self(ep, &me, &nic, &eid);
  uint64_t match = 0x5e1f0000ull << 32;
  unsigned n = 0;
  for (unsigned i = 0; i < NSIZES; i++) {
    for (int sync = 0; sync < 2; sync++) {
      for (int first = 0; first < 2; first++) {
        one(ep, me, nic, eid, sizes[i], sizes[i], sync, first, match + n, sbuf, rbuf);
        n++;
      }
    }
    /* A receive buffer one third of the message. */
    one(ep, me, nic, eid, sizes[i], sizes[i] / 3, 0, 1, match + n, sbuf, rbuf);
    n++;
  }
  free(sbuf);
  free(rbuf);
  printf("endpoint %u: %u messages to itself checked\n", eid, n);
}

int main(int argc, char **argv) { return test_run(argc, argv, self_role, self_role); }
