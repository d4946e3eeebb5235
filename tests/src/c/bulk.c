/*
 * A one-way stream of BULK_COUNT messages of BULK_SIZE bytes (environment),
 * each byte checked by the receiver, which reports its progress line by line
 * so a test can act in the middle of the transfer:
 *   bulk -l EID            receive: prints "ready", then "received I" per message
 *   bulk -d HOST -e EID    send: prints "sent I" per message
 * With BULK_HOLD=1 the receiver prints "holding" before the last message and
 * waits for a line on its standard input: the stream is in progress until
 * the test lets it end. BULK_TIMEOUT_MS sets each send's request timeout
 * (mx_set_request_timeout): a silent receiver fails it within that bound.
 */

#include "xmx_test.h"

static uint32_t env_u32(const char *name, uint32_t dflt) {
  const char *v = getenv(name);
  return v && *v ? (uint32_t)strtoul(v, NULL, 0) : dflt;
}

static void active(mx_endpoint_t ep, struct test_opts *o) {
  uint32_t count = env_u32("BULK_COUNT", 4), size = env_u32("BULK_SIZE", 1 << 20);
  uint32_t timeout_ms = env_u32("BULK_TIMEOUT_MS", 0);
  mx_endpoint_addr_t peer = test_connect(ep, o->host, o->remote_eid);
  unsigned char *buf = malloc(size ? size : 1);
  EXPECT(buf, "memory");
  for (uint32_t i = 0; i < count; i++) {
    test_fill(buf, size, i);
    mx_segment_t seg = {buf, size};
    mx_request_t r;
    CHECK(mx_isend(ep, &seg, 1, peer, i, NULL, &r));
    if (timeout_ms)
      CHECK(mx_set_request_timeout(ep, r, timeout_ms));
    mx_status_t s = test_wait(ep, &r);
    EXPECT(s.code == MX_STATUS_SUCCESS, "send %u: %s", i, mx_strstatus(s.code));
    printf("sent %u\n", i);
    fflush(stdout);
  }
  free(buf);
}

static void passive(mx_endpoint_t ep, struct test_opts *o) {
  (void)o;
  uint32_t count = env_u32("BULK_COUNT", 4), size = env_u32("BULK_SIZE", 1 << 20);
  unsigned char *buf = malloc(size ? size : 1);
  EXPECT(buf, "memory");
  printf("ready\n");
  fflush(stdout);
  const char *hold = getenv("BULK_HOLD");
  for (uint32_t i = 0; i < count; i++) {
    if (hold && *hold == '1' && i + 1 == count) {
      char line[16];
      printf("holding\n");
      fflush(stdout);
      EXPECT(fgets(line, sizeof(line), stdin) != NULL, "a line to go on");
    }
    memset(buf, 0, size);
    mx_segment_t seg = {buf, size};
    mx_request_t r;
    CHECK(mx_irecv(ep, &seg, 1, i, MX_MATCH_MASK_NONE, NULL, &r));
    mx_status_t s = test_wait(ep, &r);
    EXPECT(s.code == MX_STATUS_SUCCESS, "recv %u: %s", i, mx_strstatus(s.code));
    EXPECT(s.xfer_length == size, "length %u of message %u", s.xfer_length, i);
    test_verify(buf, size, i, "bulk");
    printf("received %u\n", i);
    fflush(stdout);
  }
  free(buf);
}

int main(int argc, char **argv) { return test_run(argc, argv, active, passive); }
