/*
 * Bad arguments get MX's error codes, through the error handler, and lose
 * nothing: a NULL request to mx_isend/mx_issend/mx_irecv (MX_BAD_REQUEST,
 * nothing sent or posted), a NULL status or result to mx_test/mx_wait and
 * their relatives (MX_BAD_INFO_VAL, the request left pending and testable),
 * an address the library never made to mx_decompose_endpoint_addr
 * (MX_BAD_ENDPOINT), and a second mx_finalize (MX_NOT_INITIALIZED). With
 * MX_ERRORS_ARE_FATAL the same failure ends the process.
 */

#include <sys/wait.h>

#include "xmx_test.h"

static int handled;
static mx_return_t last_code;

static mx_return_t counting_handler(char *msg, mx_return_t code) {
  (void)msg;
  handled++;
  last_code = code;
  return code;
}

#define EXPECT_CODE(call, want)                                                   \
  do {                                                                            \
    int before_ = handled;                                                        \
    mx_return_t got_ = (call);                                                    \
    EXPECT(got_ == (want), "%s returned %s (%d)", #call, mx_strerror(got_), got_); \
    EXPECT(handled == before_ + 1 && last_code == (want), "%s went through the handler", #call); \
  } while (0)

int main(void) {
  /* MX_ERRORS_ARE_FATAL (the default) ends the process on a failure. */
  pid_t child = fork();
  EXPECT(child >= 0, "fork");
  if (child == 0) {
    mx_set_error_handler(MX_ERRORS_ARE_FATAL);
    mx_finalize(); /* not initialized */
    _exit(0);
  }
  int ws = 0;
  EXPECT(waitpid(child, &ws, 0) == child, "waitpid");
  EXPECT(WIFEXITED(ws) && WEXITSTATUS(ws) == 255, "a fatal failure exits with 255 (status %#x)", ws);

  mx_set_error_handler(counting_handler);
  CHECK(mx_init());
  mx_endpoint_t ep = test_open(MX_ANY_ENDPOINT);
  mx_endpoint_addr_t me;
  uint64_t nic;
  uint32_t eid;
  test_self(ep, &me, &nic, &eid);
  unsigned char data[100], buf[100];
  test_fill(data, sizeof(data), 5);
  mx_segment_t seg = {data, sizeof(data)}, rseg = {buf, sizeof(buf)};

  /* NULL requests: refused, nothing sent, nothing posted. */
  EXPECT_CODE(mx_isend(ep, &seg, 1, me, 1, NULL, NULL), MX_BAD_REQUEST);
  EXPECT_CODE(mx_issend(ep, &seg, 1, me, 1, NULL, NULL), MX_BAD_REQUEST);
  EXPECT_CODE(mx_irecv(ep, &rseg, 1, 2, MX_MATCH_MASK_NONE, NULL, NULL), MX_BAD_REQUEST);
  mx_request_t sr, rr;
  CHECK(mx_isend(ep, &seg, 1, me, 2, NULL, &sr));
  mx_status_t s;
  s = test_wait(ep, &sr);
  /* Messages to oneself keep their order: had match 1 been sent, it would
   * be in before match 2. */
  uint32_t result = 7;
  CHECK(mx_probe(ep, 10000, 2, MX_MATCH_MASK_NONE, &s, &result));
  EXPECT(result == 1, "match 2 arrived");
  CHECK(mx_iprobe(ep, 1, MX_MATCH_MASK_NONE, &s, &result));
  EXPECT(result == 0, "nothing was sent by the refused calls");

  /* NULL status or result: refused before a completion is taken. */
  CHECK(mx_irecv(ep, &rseg, 1, 2, MX_MATCH_MASK_NONE, (void *)0x77, &rr));
  EXPECT_CODE(mx_test(ep, &rr, NULL, &result), MX_BAD_INFO_VAL);
  EXPECT_CODE(mx_test(ep, &rr, &s, NULL), MX_BAD_INFO_VAL);
  EXPECT_CODE(mx_wait(ep, &rr, MX_INFINITE, NULL, &result), MX_BAD_INFO_VAL);
  EXPECT_CODE(mx_wait(ep, &rr, MX_INFINITE, &s, NULL), MX_BAD_INFO_VAL);
  EXPECT_CODE(mx_test_any(ep, 0, 0, NULL, &result), MX_BAD_INFO_VAL);
  EXPECT_CODE(mx_wait_any(ep, MX_INFINITE, 0, 0, &s, NULL), MX_BAD_INFO_VAL);
  EXPECT_CODE(mx_iprobe(ep, 0, 0, NULL, &result), MX_BAD_INFO_VAL);
  EXPECT_CODE(mx_probe(ep, MX_INFINITE, 0, 0, &s, NULL), MX_BAD_INFO_VAL);
  EXPECT(rr != NULL, "the request is still there");
  s = test_wait(ep, &rr);
  test_status_is(&s, MX_STATUS_SUCCESS, nic, eid, 2, 100, 100, (void *)0x77, "receive after");
  test_verify(buf, sizeof(buf), 5, "receive after");

  /* Addresses the library never made. */
  mx_endpoint_addr_t zero, ones;
  memset(&zero, 0, sizeof(zero));
  memset(&ones, 0xff, sizeof(ones));
  uint64_t n = 1;
  uint32_t e = 1, sess = 1;
  EXPECT_CODE(mx_decompose_endpoint_addr(zero, &n, &e), MX_BAD_ENDPOINT);
  EXPECT_CODE(mx_decompose_endpoint_addr(ones, &n, &e), MX_BAD_ENDPOINT);
  EXPECT_CODE(mx_decompose_endpoint_addr2(zero, &n, &e, &sess), MX_BAD_ENDPOINT);
  EXPECT(n == 1 && e == 1 && sess == 1, "nothing written for garbage");
  CHECK(mx_decompose_endpoint_addr(me, &n, &e));
  EXPECT(n == nic && e == eid, "a real address still decomposes");

  /* An address of a board that left the peer table since it was connected (its
   * guest destroyed): the send is taken and fails with a status, not a fatal
   * error. The NIC id is the low 48 bits of the first word (the library's
   * layout, which nothing but a test may rely on). */
  mx_endpoint_addr_t gone = me;
  gone.stuff[0] ^= 0x0000010000000000ull;
  mx_request_t gr;
  int before = handled;
  CHECK(mx_isend(ep, &seg, 1, gone, 3, NULL, &gr));
  s = test_wait(ep, &gr);
  EXPECT(s.code == MX_STATUS_ENDPOINT_UNREACHABLE, "a send to a vanished board: %s",
         mx_strstatus(s.code));
  EXPECT(handled == before, "no error for it");

  CHECK(mx_close_endpoint(ep));
  CHECK(mx_finalize());
  EXPECT_CODE(mx_finalize(), MX_NOT_INITIALIZED);
  printf("bad arguments refused with MX's codes (%d failures handled)\n", handled);
  printf("PASS bad_args\n");
  return 0;
}
