/*
 * Prints the value of every constant and the size, alignment and field
 * offsets of every type of the MX headers it is compiled against, one
 * "name value" per line; the Rust test compares them with libmx's own
 * definitions. Built against our headers and against Open-MX's.
 */

#include <stddef.h>
#include <stdio.h>

#include "myriexpress.h"
#include "mx_extensions.h"
#include "mx_raw.h"

#define V(name) printf("%s %lld\n", #name, (long long)(name))
#define U(name) printf("%s %llu\n", #name, (unsigned long long)(name))
#define T(type)                                                 \
  printf("sizeof(%s) %zu\n", #type, sizeof(type));              \
  printf("alignof(%s) %zu\n", #type, (size_t)_Alignof(type))
#define F(type, field) printf("offsetof(%s, %s) %zu\n", #type, #field, offsetof(type, field))

int main(void) {
  V(MX_API); V(MX_MAX_STR_LEN); V(MX_SIZEOF_ADDR); U(MX_ANY_NIC); U(MX_ANY_ENDPOINT);
  V(MX_MAX_SEGMENTS); V(MX_INFINITE); U(MX_MATCH_MASK_NONE); V(MX_CONTEXT_ID_BITS_MAX);
  V(MX_MAX_HOSTNAME_LEN);
  V(MX_PARAM_ERROR_HANDLER); V(MX_PARAM_UNEXP_QUEUE_MAX); V(MX_PARAM_CONTEXT_ID);
  V(MX_SPEED_10G); V(MX_NET_ETHER); V(MX_RECV_CONTINUE); V(MX_RECV_FINISHED);
  V(MX_RAW_NO_EVENT); V(MX_RAW_SEND_COMPLETE); V(MX_RAW_RECV_COMPLETE); V(MX__INVALID_HANDLE);

  V(MX_SUCCESS); V(MX_BAD_BAD_BAD); V(MX_FAILURE); V(MX_ALREADY_INITIALIZED);
  V(MX_NOT_INITIALIZED); V(MX_NO_DEV); V(MX_NO_DRIVER); V(MX_NO_PERM); V(MX_BOARD_UNKNOWN);
  V(MX_BAD_ENDPOINT); V(MX_BAD_SEG_LIST); V(MX_BAD_SEG_MEM); V(MX_BAD_SEG_CNT);
  V(MX_BAD_REQUEST); V(MX_BAD_MATCH_MASK); V(MX_NO_RESOURCES); V(MX_BAD_ADDR_LIST);
  V(MX_BAD_ADDR_COUNT); V(MX_BAD_ROOT); V(MX_NOT_COMPLETED); V(MX_BUSY); V(MX_BAD_INFO_KEY);
  V(MX_BAD_INFO_VAL); V(MX_BAD_NIC); V(MX_BAD_PARAM_LIST); V(MX_BAD_PARAM_NAME);
  V(MX_BAD_PARAM_VAL); V(MX_BAD_HOSTNAME_ARGS); V(MX_HOST_NOT_FOUND); V(MX_REQUEST_PENDING);
  V(MX_TIMEOUT); V(MX_NO_MATCH); V(MX_BAD_ENDPOINT_ID); V(MX_CONNECTION_FAILED);
  V(MX_BAD_CONNECTION_KEY); V(MX_BAD_INFO_LENGTH); V(MX_NIC_NOT_FOUND); V(MX_BAD_KERNEL_VERSION);
  V(MX_BAD_LIB_VERSION); V(MX_NIC_DEAD); V(MX_CANCEL_NOT_SUPPORTED); V(MX_CLOSE_IN_HANDLER);
  V(MX_BAD_MATCHING_FOR_CONTEXT_ID_MASK); V(MX_NOT_SUPPORTED_WITH_CONTEXT_ID);

  V(MX_NIC_COUNT); V(MX_NIC_IDS); V(MX_MAX_NATIVE_ENDPOINTS); V(MX_NATIVE_REQUESTS);
  V(MX_COUNTERS_COUNT); V(MX_COUNTERS_LABELS); V(MX_COUNTERS_VALUES); V(MX_PRODUCT_CODE);
  V(MX_PART_NUMBER); V(MX_SERIAL_NUMBER); V(MX_PORT_COUNT); V(MX_PIO_SEND_MAX);
  V(MX_COPY_SEND_MAX); V(MX_NUMA_NODE); V(MX_NET_TYPE); V(MX_LINE_SPEED);

  V(MX_STATUS_SUCCESS); V(MX_STATUS_PENDING); V(MX_STATUS_BUFFERED); V(MX_STATUS_REJECTED);
  V(MX_STATUS_TIMEOUT); V(MX_STATUS_TRUNCATED); V(MX_STATUS_CANCELLED);
  V(MX_STATUS_ENDPOINT_UNKNOWN); V(MX_STATUS_ENDPOINT_CLOSED); V(MX_STATUS_ENDPOINT_UNREACHABLE);
  V(MX_STATUS_BAD_SESSION); V(MX_STATUS_BAD_KEY); V(MX_STATUS_BAD_ENDPOINT);
  V(MX_STATUS_BAD_RDMAWIN); V(MX_STATUS_ABORTED); V(MX_STATUS_EVENTQ_FULL);
  V(MX_STATUS_NO_RESOURCES);

  T(mx_endpoint_addr_t);
  T(mx_segment_t); F(mx_segment_t, segment_ptr); F(mx_segment_t, segment_length);
  T(mx_status_t); F(mx_status_t, code); F(mx_status_t, source); F(mx_status_t, match_info);
  F(mx_status_t, msg_length); F(mx_status_t, xfer_length); F(mx_status_t, context);
  T(mx_param_t); F(mx_param_t, key); F(mx_param_t, val);
  printf("sizeof(mx_param_t.val) %zu\n", sizeof(((mx_param_t *)0)->val));
  printf("offsetof(mx_param_t.val.context_id, shift) %zu\n",
         offsetof(mx_param_t, val.context_id.shift) - offsetof(mx_param_t, val.context_id));
  T(mx_return_t); T(mx_status_code_t); T(mx_error_handler_t); T(mx_endpoint_t); T(mx_request_t);
  return 0;
}
