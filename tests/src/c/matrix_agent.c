/*
 * One guest's part of the isolation matrix: an MX endpoint that receives
 * from anyone and sends where it is told, driven line by line.
 *
 *   matrix_agent -i ME
 *
 * Opens endpoint 2 and prints "ready". A receiving thread keeps a receive
 * posted and reports every message as "got FROM K LEN ok|bad": the sender
 * and the size index come from the match information, and every byte is
 * checked against the pattern the sender wrote for (FROM, ME, K).
 *
 * Commands on standard input:
 *   send TO HOSTNAME NIC_ID   look HOSTNAME up, connect to NIC_ID (hex)
 *                             endpoint 2, and if connected send one message
 *                             of each size; prints
 *                             "result TO LOOKUP CONNECT S0 S1 S2" (mx_return_t
 *                             of the lookup and the connect, mx_status_code_t
 *                             of each send, -1 for sends not made)
 *   count                     prints "count N": messages received so far
 *   quit                      stops receiving, closes, prints "PASS"
 */

#include <inttypes.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "myriexpress.h"

#define KEY 0x150a7e5u
#define EID 2
#define CONNECT_TIMEOUT_MS 10000
#define SEND_TIMEOUT_MS 60000
#define NSIZES 3
static const uint32_t sizes[NSIZES] = {16, 4000, 100000};
#define MAXLEN 100000

static mx_endpoint_t ep;
static uint32_t me;
static volatile int stopping;
static unsigned received;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void say(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&out_lock);
  vprintf(fmt, ap);
  fflush(stdout);
  pthread_mutex_unlock(&out_lock);
  va_end(ap);
}

static unsigned char pattern(uint32_t from, uint32_t to, uint32_t k, uint32_t i) {
  return (unsigned char)(i * 131u + from * 17u + to * 29u + k * 7u + (i >> 8));
}

static uint64_t match_of(uint32_t from, uint32_t to, uint32_t k) {
  return ((uint64_t)from << 32) | ((uint64_t)to << 16) | k;
}

static void *receiver(void *arg) {
  (void)arg;
  unsigned char *buf = malloc(MAXLEN);
  if (!buf) {
    fprintf(stderr, "memory\n");
    exit(1);
  }
  while (!stopping) {
    mx_segment_t seg = {buf, MAXLEN};
    mx_request_t req;
    mx_return_t r = mx_irecv(ep, &seg, 1, 0, 0, NULL, &req);
    if (r != MX_SUCCESS) {
      fprintf(stderr, "mx_irecv: %s\n", mx_strerror(r));
      exit(1);
    }
    for (;;) {
      mx_status_t s;
      uint32_t done = 0;
      r = mx_wait(ep, &req, 100, &s, &done);
      if (r != MX_SUCCESS) {
        fprintf(stderr, "mx_wait: %s\n", mx_strerror(r));
        exit(1);
      }
      if (done) {
        uint32_t from = (uint32_t)(s.match_info >> 32);
        uint32_t to = (uint32_t)(s.match_info >> 16) & 0xffff;
        uint32_t k = (uint32_t)s.match_info & 0xffff;
        int ok = s.code == MX_STATUS_SUCCESS && to == me && k < NSIZES &&
                 s.xfer_length == sizes[k] && s.msg_length == sizes[k];
        for (uint32_t i = 0; ok && i < s.xfer_length; i++)
          ok = buf[i] == pattern(from, to, k, i);
        __atomic_add_fetch(&received, 1, __ATOMIC_SEQ_CST);
        say("got %u %u %u %s\n", from, k, s.xfer_length, ok ? "ok" : "bad");
        break;
      }
      if (stopping) {
        uint32_t cancelled = 0;
        mx_cancel(ep, &req, &cancelled);
        if (cancelled) {
          free(buf);
          return NULL;
        }
      }
    }
  }
  free(buf);
  return NULL;
}

static void send_to(uint32_t to, const char *host, uint64_t nic) {
  uint64_t found = 0;
  mx_return_t lookup = mx_hostname_to_nic_id((char *)host, &found);
  mx_endpoint_addr_t addr;
  mx_return_t conn = mx_connect(ep, nic, EID, KEY, CONNECT_TIMEOUT_MS, &addr);
  int status[NSIZES] = {-1, -1, -1};
  if (conn == MX_SUCCESS) {
    unsigned char *buf = malloc(MAXLEN);
    if (!buf) {
      fprintf(stderr, "memory\n");
      exit(1);
    }
    for (uint32_t k = 0; k < NSIZES; k++) {
      for (uint32_t i = 0; i < sizes[k]; i++) buf[i] = pattern(me, to, k, i);
      mx_segment_t seg = {buf, sizes[k]};
      mx_request_t req;
      mx_return_t r = mx_isend(ep, &seg, 1, addr, match_of(me, to, k), NULL, &req);
      if (r != MX_SUCCESS) {
        fprintf(stderr, "mx_isend to %s: %s\n", host, mx_strerror(r));
        break;
      }
      mx_status_t s;
      uint32_t done = 0;
      r = mx_wait(ep, &req, SEND_TIMEOUT_MS, &s, &done);
      if (r != MX_SUCCESS || !done) {
        fprintf(stderr, "send %u to %s did not complete: %s\n", k, host, mx_strerror(r));
        break;
      }
      status[k] = (int)s.code;
    }
    free(buf);
  }
  say("result %u %d %d %d %d %d\n", to, (int)lookup, (int)conn, status[0], status[1],
      status[2]);
}

int main(int argc, char **argv) {
  int c;
  int have_me = 0;
  while ((c = getopt(argc, argv, "i:")) != -1) {
    if (c == 'i') {
      me = (uint32_t)strtoul(optarg, NULL, 10);
      have_me = 1;
    } else {
      fprintf(stderr, "usage: %s -i ME\n", argv[0]);
      return 2;
    }
  }
  if (!have_me) {
    fprintf(stderr, "usage: %s -i ME\n", argv[0]);
    return 2;
  }
  mx_return_t r = mx_init();
  if (r != MX_SUCCESS) {
    fprintf(stderr, "mx_init: %s\n", mx_strerror(r));
    return 1;
  }
  mx_set_error_handler(MX_ERRORS_RETURN);
  r = mx_open_endpoint(MX_ANY_NIC, EID, KEY, NULL, 0, &ep);
  if (r != MX_SUCCESS) {
    fprintf(stderr, "mx_open_endpoint: %s\n", mx_strerror(r));
    return 1;
  }
  pthread_t rx;
  if (pthread_create(&rx, NULL, receiver, NULL) != 0) {
    fprintf(stderr, "pthread_create\n");
    return 1;
  }
  say("ready\n");
  char line[512];
  while (fgets(line, sizeof line, stdin)) {
    char host[MX_MAX_HOSTNAME_LEN + 1];
    char nic[32];
    unsigned to;
    if (sscanf(line, "send %u %64s %31s", &to, host, nic) == 3) {
      send_to(to, host, strtoull(nic, NULL, 16));
    } else if (strncmp(line, "count", 5) == 0) {
      say("count %u\n", __atomic_load_n(&received, __ATOMIC_SEQ_CST));
    } else if (strncmp(line, "quit", 4) == 0) {
      break;
    } else {
      fprintf(stderr, "unknown command: %s", line);
      return 2;
    }
  }
  stopping = 1;
  pthread_join(rx, NULL);
  mx_close_endpoint(ep);
  mx_finalize();
  say("PASS\n");
  return 0;
}
