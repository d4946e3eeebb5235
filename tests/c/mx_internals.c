/*
 * MX's internal symbols that Open MPI's MX support links against:
 * mx_open_board, mx__get_mapper_state and mx__regcache_clean. With the
 * registration cache on (MX_RCACHE=1), a LARGE buffer sent, unmapped,
 * cleaned, and mapped again with other contents is sent with its new
 * contents.
 */

#include <sys/mman.h>

#include "mx_io.h"
#include "xmx_test.h"

/* Open MPI declares these itself; MX's public headers do not. */
extern mx_return_t mx_open_board(int i, mx_endpt_handle_t *handle);
extern mx_return_t mx__get_mapper_state(mx_endpt_handle_t handle, mx_mapper_state_t *p);
extern int mx__regcache_clean(void *ptr, size_t len);

#define LEN (256 * 1024)

static void send_mapped(mx_endpoint_t ep, mx_endpoint_addr_t me, uint64_t nic, uint32_t eid,
                        uint32_t seed) {
  unsigned char *buf = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  EXPECT(buf != MAP_FAILED, "mmap");
  unsigned char *in = malloc(LEN);
  EXPECT(in != NULL, "malloc");
  for (int round = 0; round < 2; round++) {
    test_fill(buf, LEN, seed + round);
    mx_segment_t s = {buf, LEN}, r = {in, LEN};
    mx_request_t sr, rr;
    CHECK(mx_irecv(ep, &r, 1, seed + round, MX_MATCH_MASK_NONE, NULL, &rr));
    CHECK(mx_isend(ep, &s, 1, me, seed + round, NULL, &sr));
    mx_status_t st = test_wait(ep, &rr);
    test_status_is(&st, MX_STATUS_SUCCESS, nic, eid, seed + round, LEN, LEN, NULL, "LARGE");
    test_verify(in, LEN, seed + round, "LARGE data from a mapped buffer");
    test_wait(ep, &sr);
  }
  EXPECT(mx__regcache_clean(buf, LEN) == 0, "mx__regcache_clean returns 0");
  EXPECT(munmap(buf, LEN) == 0, "munmap");
  free(in);
}

int main(void) {
  setenv("MX_RCACHE", "1", 1);
  CHECK(mx_init());
  mx_set_error_handler(MX_ERRORS_RETURN);
  mx_endpt_handle_t h = -1;
  CHECK(mx_open_board(0, &h));
  EXPECT(h == 0, "board 0's handle is %d", h);
  EXPECT(mx_open_board(7, &h) == MX_BOARD_UNKNOWN, "no board 7");
  mx_mapper_state_t ms;
  memset(&ms, 0xaa, sizeof(ms));
  CHECK(mx__get_mapper_state(h, &ms));
  static const uint8_t none[6] = {0};
  EXPECT(ms.board_number == 0 && ms.network_configured == 1 && ms.routes_valid == 1 &&
             ms.num_hosts >= 1 && memcmp(ms.mapper_mac, none, 6) != 0,
         "mapper state: board %u configured %u routes %u hosts %u", ms.board_number,
         ms.network_configured, ms.routes_valid, ms.num_hosts);
  EXPECT(mx__get_mapper_state(9, &ms) == MX_BAD_ENDPOINT, "no board handle 9");
  EXPECT(mx__regcache_clean(NULL, 0) == 0, "cleaning nothing");

  mx_endpoint_t ep = test_open(MX_ANY_ENDPOINT);
  mx_endpoint_addr_t me;
  uint64_t nic;
  uint32_t eid;
  test_self(ep, &me, &nic, &eid);
  /* The second mapping likely reuses the first one's addresses. */
  send_mapped(ep, me, nic, eid, 100);
  send_mapped(ep, me, nic, eid, 200);
  CHECK(mx_close_endpoint(ep));
  CHECK(mx_finalize());
  EXPECT(mx__regcache_clean(NULL, 4096) == 0, "cleaning after finalize");
  printf("mx_open_board, mx__get_mapper_state, mx__regcache_clean checked\n");
  printf("PASS mx_internals\n");
  return 0;
}
