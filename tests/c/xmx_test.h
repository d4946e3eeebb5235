/*
 * Helpers shared by the xmx C test programs.
 *
 * Every program runs in one of three ways:
 *   prog                  both sides in this process, on two endpoints
 *                         (the passive side in a thread of its own)
 *   prog -l EID           the passive side only, on endpoint EID
 *   prog -d HOST -e EID   the active side only, talking to HOST's endpoint EID
 * so the same program serves the loopback tests and the cross-host runs.
 * Programs print what they checked and exit 0 when every check held.
 */

#ifndef XMX_TEST_H
#define XMX_TEST_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "myriexpress.h"
#include "mx_extensions.h"

#define TEST_KEY 0x5eed1e55u
#define ACTIVE_EID 1
#define PASSIVE_EID 2

#define CHECK(call)                                                               \
  do {                                                                            \
    mx_return_t r_ = (call);                                                      \
    if (r_ != MX_SUCCESS) {                                                       \
      fprintf(stderr, "%s:%d: %s failed: %s (%d)\n", __FILE__, __LINE__, #call,   \
              mx_strerror(r_), (int)r_);                                          \
      exit(1);                                                                    \
    }                                                                             \
  } while (0)

#define EXPECT(cond, ...)                                                         \
  do {                                                                            \
    if (!(cond)) {                                                                \
      fprintf(stderr, "%s:%d: expected %s: ", __FILE__, __LINE__, #cond);         \
      fprintf(stderr, __VA_ARGS__);                                               \
      fprintf(stderr, "\n");                                                      \
      exit(1);                                                                    \
    }                                                                             \
  } while (0)

struct test_opts {
  const char *host;   /* -d: remote host (active side only) */
  uint32_t remote_eid; /* -e */
  int listen_eid;     /* -l: passive side only, or -1 */
};

static inline void test_usage(const char *prog) {
  fprintf(stderr, "usage: %s [-l EID | -d HOST -e EID]\n", prog);
  exit(2);
}

static inline struct test_opts test_parse(int argc, char **argv) {
  struct test_opts o = {NULL, PASSIVE_EID, -1};
  int c;
  while ((c = getopt(argc, argv, "l:d:e:h")) != -1) {
    switch (c) {
    case 'l': o.listen_eid = atoi(optarg); break;
    case 'd': o.host = optarg; break;
    case 'e': o.remote_eid = (uint32_t)atoi(optarg); break;
    default: test_usage(argv[0]);
    }
  }
  return o;
}

/* Parameters test_run's endpoints are opened with (none unless set). */
static mx_param_t *test_open_params;
static uint32_t test_open_nparams;

/* Opens test_run's endpoints with a context id of `bits` bits at `shift`, as MPI's
 * transport does (one bit at shift 63). */
static inline void test_open_with_context_id(uint8_t bits, uint8_t shift) {
  static mx_param_t p;
  p.key = MX_PARAM_CONTEXT_ID;
  p.val.context_id.bits = bits;
  p.val.context_id.shift = shift;
  test_open_params = &p;
  test_open_nparams = 1;
}

static inline mx_endpoint_t test_open(uint32_t eid) {
  mx_endpoint_t ep;
  CHECK(mx_open_endpoint(MX_ANY_NIC, eid, TEST_KEY, test_open_params, test_open_nparams, &ep));
  return ep;
}

static inline mx_endpoint_addr_t test_connect(mx_endpoint_t ep, const char *host, uint32_t eid) {
  uint64_t nic;
  mx_endpoint_addr_t addr;
  if (host) {
    CHECK(mx_hostname_to_nic_id((char *)host, &nic));
  } else {
    CHECK(mx_board_number_to_nic_id(0, &nic));
  }
  CHECK(mx_connect(ep, nic, eid, TEST_KEY, 10000, &addr));
  return addr;
}

/* The passive side connects back to whoever sent `s`, as MPI-style
 * programs do, so that traffic flows on connections opened from both ends. */
static inline mx_endpoint_addr_t test_connect_back(mx_endpoint_t ep, const mx_status_t *s) {
  uint64_t nic;
  uint32_t eid;
  mx_endpoint_addr_t addr;
  CHECK(mx_decompose_endpoint_addr(s->source, &nic, &eid));
  CHECK(mx_connect(ep, nic, eid, TEST_KEY, 10000, &addr));
  return addr;
}

static inline mx_status_t test_wait(mx_endpoint_t ep, mx_request_t *req) {
  mx_status_t s;
  uint32_t result = 0;
  CHECK(mx_wait(ep, req, MX_INFINITE, &s, &result));
  EXPECT(result == 1, "mx_wait(MX_INFINITE) returned without completion");
  EXPECT(*req == NULL, "a completed request is cleared");
  return s;
}

/* The number in environment variable `name` (decimal, or hex with 0x), else `dflt`. */
static inline uint32_t test_env_or(const char *name, uint32_t dflt) {
  const char *v = getenv(name);
  return v && *v ? (uint32_t)strtoul(v, NULL, 0) : dflt;
}

/* mx_get_info counter by label. */
static inline uint32_t test_counter(const char *label) {
  uint32_t n = 0;
  CHECK(mx_get_info(NULL, MX_COUNTERS_COUNT, NULL, 0, &n, sizeof(n)));
  char *labels = calloc(n, MX_MAX_STR_LEN);
  uint32_t *values = calloc(n, sizeof(uint32_t));
  EXPECT(labels && values, "memory");
  CHECK(mx_get_info(NULL, MX_COUNTERS_LABELS, NULL, 0, labels, n * MX_MAX_STR_LEN));
  uint32_t board = 0;
  CHECK(mx_get_info(NULL, MX_COUNTERS_VALUES, &board, sizeof(board), values, n * sizeof(uint32_t)));
  uint32_t v = UINT32_MAX;
  for (uint32_t i = 0; i < n; i++)
    if (strcmp(labels + (size_t)i * MX_MAX_STR_LEN, label) == 0) v = values[i];
  free(labels);
  free(values);
  EXPECT(v != UINT32_MAX, "no counter %s", label);
  return v;
}

/* Waits (progressing the endpoint, at most 20 s) until `label` reaches `n`. */
static inline void test_wait_counter(mx_endpoint_t ep, const char *label, uint32_t n) {
  for (int i = 0; i < 20000 && test_counter(label) < n; i++) {
    uint32_t result;
    mx_status_t st;
    CHECK(mx_iprobe(ep, 0, 0, &st, &result));
    usleep(1000);
  }
  EXPECT(test_counter(label) >= n, "%s stayed below %u", label, n);
}

static inline void test_fill(unsigned char *buf, size_t len, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < len; i++) {
    x = x * 1103515245u + 12345u;
    buf[i] = (unsigned char)(x >> 16);
  }
}

static inline void test_verify(const unsigned char *buf, size_t len, uint32_t seed, const char *what) {
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < len; i++) {
    x = x * 1103515245u + 12345u;
    if (buf[i] != (unsigned char)(x >> 16)) {
      fprintf(stderr, "%s: byte %zu of %zu differs\n", what, i, len);
      exit(1);
    }
  }
}

/* Checks every field of a completion: code, who (NIC id and endpoint id of
 * `source`), match info, both lengths and the context. */
static inline void test_status_is(const mx_status_t *s, mx_status_code_t code, uint64_t nic,
                                  uint32_t eid, uint64_t match, uint32_t msg_length,
                                  uint32_t xfer_length, void *context, const char *what) {
  uint64_t snic = 0;
  uint32_t seid = 0;
  EXPECT(s->code == code, "%s: status %s, expected %s", what, mx_strstatus(s->code),
         mx_strstatus(code));
  CHECK(mx_decompose_endpoint_addr(s->source, &snic, &seid));
  EXPECT(snic == nic && seid == eid, "%s: source %012llx:%u, expected %012llx:%u", what,
         (unsigned long long)snic, seid, (unsigned long long)nic, eid);
  EXPECT(s->match_info == match, "%s: match %#llx, expected %#llx", what,
         (unsigned long long)s->match_info, (unsigned long long)match);
  EXPECT(s->msg_length == msg_length && s->xfer_length == xfer_length,
         "%s: lengths %u/%u, expected %u/%u", what, s->msg_length, s->xfer_length, msg_length,
         xfer_length);
  EXPECT(s->context == context, "%s: context %p, expected %p", what, s->context, context);
}

/* Splits [buf, buf+len) into `n` segments of uneven sizes (some empty when
 * len < n); returns n. */
static inline uint32_t test_split(unsigned char *buf, uint32_t len, mx_segment_t *segs, uint32_t n) {
  uint32_t at = 0;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t end = i + 1 == n ? len : (uint32_t)((uint64_t)len * (2 * i + 1) / (2 * n));
    if (end < at) end = at;
    segs[i].segment_ptr = buf + at;
    segs[i].segment_length = end - at;
    at = end;
  }
  return n;
}

/* This endpoint's own NIC id and endpoint id. */
static inline void test_self(mx_endpoint_t ep, mx_endpoint_addr_t *addr, uint64_t *nic,
                             uint32_t *eid) {
  CHECK(mx_get_endpoint_addr(ep, addr));
  CHECK(mx_decompose_endpoint_addr(*addr, nic, eid));
}

/* Runs `passive` in a thread (single-process mode) or alone (-l), and
 * `active` in this thread (single-process mode or -d). */
typedef void (*test_role_fn)(mx_endpoint_t ep, struct test_opts *o);

struct test_thread_arg {
  test_role_fn fn;
  mx_endpoint_t ep;
  struct test_opts *o;
};

static inline void *test_thread_main(void *p) {
  struct test_thread_arg *a = p;
  a->fn(a->ep, a->o);
  return NULL;
}

static inline int test_run(int argc, char **argv, test_role_fn active, test_role_fn passive) {
  struct test_opts o = test_parse(argc, argv);
  CHECK(mx_init());
  if (o.listen_eid >= 0) {
    mx_endpoint_t ep = test_open((uint32_t)o.listen_eid);
    passive(ep, &o);
    CHECK(mx_close_endpoint(ep));
  } else if (o.host) {
    mx_endpoint_t ep = test_open(MX_ANY_ENDPOINT);
    active(ep, &o);
    CHECK(mx_close_endpoint(ep));
  } else {
    mx_endpoint_t pep = test_open(PASSIVE_EID);
    mx_endpoint_t aep = test_open(ACTIVE_EID);
    pthread_t t;
    struct test_thread_arg a = {passive, pep, &o};
    EXPECT(pthread_create(&t, NULL, test_thread_main, &a) == 0, "thread");
    active(aep, &o);
    pthread_join(t, NULL);
    CHECK(mx_close_endpoint(aep));
    CHECK(mx_close_endpoint(pep));
  }
  CHECK(mx_finalize());
  printf("PASS %s\n", argv[0]);
  return 0;
}

#endif /* XMX_TEST_H */
