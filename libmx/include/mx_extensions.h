/*
 * mx_extensions.h: the MX calls beyond the base interface, as xmx's
 * libmyriexpress.so provides them.
 */

#ifndef MX_EXTENSIONS_H
#define MX_EXTENSIONS_H

#include "myriexpress.h"

#ifdef __cplusplus
extern "C" {
#endif

/* mx_iconnect takes a match info and a context. */
#define MX_HAS_ICONNECT_V2 1

extern mx_return_t mx_iconnect(mx_endpoint_t endpoint, uint64_t nic_id, uint32_t endpoint_id,
                               uint32_t key, uint64_t match_info, void *context,
                               mx_request_t *request);
extern mx_return_t mx_disconnect(mx_endpoint_t endpoint, mx_endpoint_addr_t addr);

/* What an unexpected-message handler tells the library. */
enum mx_unexp_handler_action {
  /* match the message as usual (the handler may have posted a receive) */
  MX_RECV_CONTINUE = 0,
  /* the handler consumed the message: drop it */
  MX_RECV_FINISHED
};
typedef enum mx_unexp_handler_action mx_unexp_handler_action_t;

/* Called for a message that matches no posted receive, before it is queued;
 * the data is given for messages small enough to be at hand, else NULL. */
typedef mx_unexp_handler_action_t (*mx_unexp_handler_t)(void *context, mx_endpoint_addr_t source,
                                                        uint64_t match_value, uint32_t length,
                                                        void *data_if_available);

extern mx_return_t mx_register_unexp_handler(mx_endpoint_t endpoint, mx_unexp_handler_t handler,
                                             void *context);
extern mx_return_t mx_forget(mx_endpoint_t endpoint, mx_request_t *request);
extern mx_return_t mx_progress(mx_endpoint_t endpoint);
extern mx_return_t mx_set_endpoint_addr_context(mx_endpoint_addr_t endpoint_addr, void *context);
extern mx_return_t mx_get_endpoint_addr_context(mx_endpoint_addr_t endpoint_addr,
                                                void **context);
extern mx_return_t mx_set_request_timeout(mx_endpoint_t endpoint, mx_request_t request,
                                          uint32_t milli_seconds);
extern mx_return_t mx_decompose_endpoint_addr2(mx_endpoint_addr_t endpoint_addr,
                                               uint64_t *nic_id, uint32_t *endpoint_id,
                                               uint32_t *session_id);

#ifdef __cplusplus
}
#endif

#endif /* MX_EXTENSIONS_H */
