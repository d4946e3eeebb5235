/*
 * Library and board information: init checks, mx_get_info keys, NIC id /
 * hostname / board lookups, addresses and their contexts, the raw
 * interface, and calls MX leaves unimplemented. Needs no peer.
 */

#include "xmx_test.h"
#include "mx_raw.h"

int main(int argc, char **argv) {
  (void)argc;
  mx_return_t r;
  EXPECT(mx_set_error_handler(MX_ERRORS_RETURN) == MX_ERRORS_ARE_FATAL, "fatal by default");
  r = mx__init_api(0x201);
  EXPECT(r == MX_BAD_LIB_VERSION, "older API refused: %s", mx_strerror(r));
  mx_endpoint_t ep;
  r = mx_open_endpoint(0, 1, 0, NULL, 0, &ep);
  EXPECT(r == MX_NOT_INITIALIZED, "open before init: %s", mx_strerror(r));
  CHECK(mx_init());
  r = mx_init();
  EXPECT(r == MX_ALREADY_INITIALIZED, "second init: %s", mx_strerror(r));
  EXPECT(strcmp(mx_strerror(MX_SUCCESS), "Success") == 0, "strerror");
  EXPECT(strstr(mx_strstatus(MX_STATUS_TRUNCATED), "runcated") != NULL, "strstatus");

  uint32_t v = 0;
  CHECK(mx_get_info(NULL, MX_NIC_COUNT, NULL, 0, &v, sizeof(v)));
  EXPECT(v == 1, "one board");
  uint64_t ids[2] = {7, 7};
  CHECK(mx_get_info(NULL, MX_NIC_IDS, NULL, 0, ids, sizeof(ids)));
  EXPECT(ids[0] != 0 && ids[1] == 0, "NIC ids, zero-terminated");
  r = mx_get_info(NULL, MX_NIC_IDS, NULL, 0, ids, sizeof(uint64_t));
  EXPECT(r == MX_BAD_INFO_LENGTH, "short NIC id buffer: %s", mx_strerror(r));
  r = mx_get_info(NULL, 99, NULL, 0, &v, sizeof(v));
  EXPECT(r == MX_BAD_INFO_KEY, "unknown key: %s", mx_strerror(r));
  CHECK(mx_get_info(NULL, MX_MAX_NATIVE_ENDPOINTS, NULL, 0, &v, sizeof(v)));
  EXPECT(v == 256, "endpoints per board: %u", v);
  CHECK(mx_get_info(NULL, MX_PIO_SEND_MAX, NULL, 0, &v, sizeof(v)));
  EXPECT(v == 128, "PIO send max");
  CHECK(mx_get_info(NULL, MX_COPY_SEND_MAX, NULL, 0, &v, sizeof(v)));
  EXPECT(v == 32768, "copy send max");
  CHECK(mx_get_info(NULL, MX_LINE_SPEED, NULL, 0, &v, sizeof(v)));
  EXPECT(v == MX_SPEED_10G, "line speed");
  CHECK(mx_get_info(NULL, MX_NET_TYPE, NULL, 0, &v, sizeof(v)));
  EXPECT(v == MX_NET_ETHER, "net type");
  char text[64];
  CHECK(mx_get_info(NULL, MX_PRODUCT_CODE, NULL, 0, text, sizeof(text)));
  EXPECT(strlen(text) > 0, "product code");
  uint32_t ncounters;
  CHECK(mx_get_info(NULL, MX_COUNTERS_COUNT, NULL, 0, &ncounters, sizeof(ncounters)));
  char *labels = calloc(ncounters, MX_MAX_STR_LEN);
  CHECK(mx_get_info(NULL, MX_COUNTERS_LABELS, NULL, 0, labels, ncounters * MX_MAX_STR_LEN));
  EXPECT(strlen(labels) > 0, "first counter label");
  free(labels);

  uint64_t nic, nic2;
  uint32_t board;
  char host[MX_MAX_HOSTNAME_LEN];
  CHECK(mx_board_number_to_nic_id(0, &nic));
  EXPECT(nic == ids[0], "board 0 NIC");
  CHECK(mx_nic_id_to_board_number(nic, &board));
  EXPECT(board == 0, "board number");
  CHECK(mx_nic_id_to_hostname(nic, host));
  CHECK(mx_hostname_to_nic_id(host, &nic2));
  EXPECT(nic2 == nic, "hostname round trip (%s)", host);
  r = mx_hostname_to_nic_id("no-such-host:0", &nic2);
  EXPECT(r == MX_HOST_NOT_FOUND, "unknown host: %s", mx_strerror(r));
  r = mx_board_number_to_nic_id(5, &nic2);
  EXPECT(r == MX_BOARD_UNKNOWN, "unknown board: %s", mx_strerror(r));

  /* Endpoints, addresses, contexts. */
  mx_param_t bad = {.key = 9};
  r = mx_open_endpoint(0, 3, TEST_KEY, &bad, 1, &ep);
  EXPECT(r == MX_BAD_PARAM_NAME, "unknown parameter: %s", mx_strerror(r));
  mx_param_t ctx = {.key = MX_PARAM_CONTEXT_ID, .val.context_id = {.bits = 8, .shift = 56}};
  CHECK(mx_open_endpoint(0, 3, TEST_KEY, &ctx, 1, &ep));
  mx_endpoint_t ep2;
  r = mx_open_endpoint(0, 3, TEST_KEY, NULL, 0, &ep2);
  EXPECT(r == MX_BUSY, "endpoint 3 twice: %s", mx_strerror(r));
  mx_endpoint_addr_t me;
  CHECK(mx_get_endpoint_addr(ep, &me));
  uint32_t eid, session;
  CHECK(mx_decompose_endpoint_addr2(me, &nic2, &eid, &session));
  EXPECT(nic2 == nic && eid == 3, "own address");
  CHECK(mx_set_endpoint_addr_context(me, (void *)0xfeed));
  void *c = NULL;
  CHECK(mx_get_endpoint_addr_context(me, &c));
  EXPECT(c == (void *)0xfeed, "address context");
  char b[4];
  mx_segment_t seg = {b, 4};
  mx_request_t req;
  r = mx_irecv(ep, &seg, 1, 0, 0x00ffffffffffffffull, NULL, &req);
  EXPECT(r == MX_BAD_MATCHING_FOR_CONTEXT_ID_MASK, "context-id bits masked: %s", mx_strerror(r));
  r = mx_irecv(ep, &seg, MX_MAX_SEGMENTS + 1, 0, ~0ull, NULL, &req);
  EXPECT(r == MX_BAD_SEG_CNT, "too many segments: %s", mx_strerror(r));
  r = mx_irecv(ep, NULL, 2, 0, ~0ull, NULL, &req);
  EXPECT(r == MX_BAD_SEG_LIST, "NULL segment list: %s", mx_strerror(r));
  mx_request_t bogus = (mx_request_t)(uintptr_t)0x12345;
  mx_status_t bogus_status;
  r = mx_test(ep, &bogus, &bogus_status, &v);
  EXPECT(r == MX_BAD_REQUEST, "bogus request: %s", mx_strerror(r));
  r = mx_close_endpoint((mx_endpoint_t)(uintptr_t)0xdead);
  EXPECT(r == MX_BAD_ENDPOINT, "bogus endpoint: %s", mx_strerror(r));
  r = mx_iput(ep, b, 4, me, 0, NULL, &req);
  EXPECT(r != MX_SUCCESS, "mx_iput is not implemented");

  /* The raw interface: frames between raw endpoints, peers named. */
  mx_raw_endpoint_t raw1, raw2;
  CHECK(mx_raw_open_endpoint(0, NULL, 0, &raw1));
  CHECK(mx_raw_open_endpoint(0, NULL, 0, &raw2));
  char frame[] = "host query";
  CHECK(mx_raw_send(raw1, 0, NULL, 0, frame, sizeof(frame), (void *)0x51));
  uint32_t port, bytes;
  void *rc = NULL;
  mx_raw_status_t st;
  char in[64];
  bytes = sizeof(in);
  CHECK(mx_raw_next_event(raw1, &port, &rc, in, &bytes, 0, &st));
  EXPECT(st == MX_RAW_SEND_COMPLETE && rc == (void *)0x51, "raw send completion");
  bytes = sizeof(in);
  CHECK(mx_raw_next_event(raw2, &port, &rc, in, &bytes, 1000, &st));
  EXPECT(st == MX_RAW_RECV_COMPLETE && bytes == sizeof(frame) && strcmp(in, frame) == 0,
         "raw frame received");
  bytes = sizeof(in);
  CHECK(mx_raw_next_event(raw2, &port, &rc, in, &bytes, 0, &st));
  EXPECT(st == MX_RAW_NO_EVENT, "no more raw events");
  CHECK(mx_raw_set_peer_name(raw1, 0x02aabbccddeeull, "far-away:0"));
  CHECK(mx_hostname_to_nic_id("far-away:0", &nic2));
  EXPECT(nic2 == 0x02aabbccddeeull, "peer named by the mapper");
  mx_endpoint_addr_t far;
  r = mx_connect(ep, nic2, 0, TEST_KEY, 30, &far);
  EXPECT(r == MX_TIMEOUT, "unreachable peer: %s", mx_strerror(r));
  CHECK(mx_raw_remove_peer(raw1, nic2));
  r = mx_hostname_to_nic_id("far-away:0", &nic2);
  EXPECT(r == MX_HOST_NOT_FOUND, "peer removed: %s", mx_strerror(r));
  CHECK(mx_raw_close_endpoint(raw1));
  CHECK(mx_raw_close_endpoint(raw2));

  CHECK(mx_close_endpoint(ep));
  CHECK(mx_finalize());
  /* The library can start again. */
  CHECK(mx_init());
  CHECK(mx_finalize());
  printf("PASS %s\n", argv[0]);
  return 0;
}
