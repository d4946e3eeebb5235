/*
 * The measuring program of the bench's MX setups (xmx native, later the guest
 * setups): the same ping-pong and stream as the bench's other agents, through the
 * MX API of libmyriexpress, printing the same one-line JSON report.
 *
 *   mx_bench -i                          open an endpoint and close it (probe)
 *   mx_bench -l EID  -t TEST -s SIZE -w WARMUP -n ITERS    server side
 *   mx_bench -d HOST -e EID -t TEST ...                     client side
 *   mx_bench -t TEST ...                 both sides in this process (two endpoints)
 *   -g DIR (server of a stream)          start the measured phase together with other
 *                                        servers: write a byte to the FIFO DIR/arrive,
 *                                        then wait for end-of-file on the FIFO DIR/gate
 *
 * TEST is pingpong or stream. The server prints "ready" once its endpoint is
 * open. Streams keep up to STREAM_WINDOW sends in flight; the server posts one
 * receive at a time, or keeps N posted with MX_BENCH_RECV_WINDOW=N in its
 * environment (MX's own mx_stream keeps eight; docs/performance.md compares the
 * two). Every wait spins and
 * blocks inside the library as its settings say, or, with MX_BENCH_POLL=1 in
 * the environment, polls with mx_test in a loop as MPI progress engines do.
 */

#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "myriexpress.h"

#define BENCH_KEY 0x5eedb0b0u
#define CLIENT_EID 1
#define SERVER_EID 2
#define STREAM_WINDOW 16

struct opts {
  const char *host;
  const char *gate;
  uint32_t eid;
  int listen;
  int info;
  int stream;
  uint32_t size;
  uint64_t warmup, iters;
};

#define CHECK(call)                                                             \
  do {                                                                          \
    mx_return_t r_ = (call);                                                    \
    if (r_ != MX_SUCCESS) {                                                     \
      fprintf(stderr, "%s: %s\n", #call, mx_strerror(r_));                      \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t cpu_ns(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) * 1000000000u +
         ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000u;
}

/* "progress K/N" on stderr at most once a second, checked every 64
 * iterations, as the bench's other agents report theirs. */
static void progress(uint64_t done, uint64_t total) {
  static uint64_t last;
  if (done % 64 != 0) return;
  uint64_t t = now_ns();
  if (last == 0) last = t;
  if (t - last < 1000000000u) return;
  last = t;
  fprintf(stderr, "progress %llu/%llu\n", (unsigned long long)done, (unsigned long long)total);
}

static int poll_mode;

static void wait_done(mx_endpoint_t ep, mx_request_t *req, mx_status_t *s) {
  uint32_t result = 0;
  if (poll_mode)
    while (!result) CHECK(mx_test(ep, req, s, &result));
  else
    CHECK(mx_wait(ep, req, MX_INFINITE, s, &result));
  if (!result || s->code != MX_STATUS_SUCCESS) {
    fprintf(stderr, "request failed: %s\n", mx_strstatus(s->code));
    exit(1);
  }
}

static void send_msg(mx_endpoint_t ep, mx_endpoint_addr_t to, void *buf, uint32_t len) {
  mx_segment_t seg = {buf, len};
  mx_request_t r;
  mx_status_t s;
  CHECK(mx_isend(ep, &seg, 1, to, 0, NULL, &r));
  wait_done(ep, &r, &s);
}

static uint32_t recv_msg(mx_endpoint_t ep, void *buf, uint32_t len, mx_status_t *s) {
  mx_segment_t seg = {buf, len};
  mx_request_t r;
  CHECK(mx_irecv(ep, &seg, 1, 0, 0, NULL, &r));
  wait_done(ep, &r, s);
  if (s->msg_length != len) {
    fprintf(stderr, "received %u bytes, expected %u\n", s->msg_length, len);
    exit(1);
  }
  return s->xfer_length;
}

/* How many receives the server of a stream keeps posted. */
static uint32_t recv_window(void) {
  const char *env = getenv("MX_BENCH_RECV_WINDOW");
  return env && atoi(env) > 0 ? (uint32_t)atoi(env) : 1;
}

/* Receives `iters` messages of `len` bytes with `window` receives posted at once,
 * each into a buffer of its own, telling `peer` to start (an empty message from
 * `go`) once the first are posted; returns the bytes received. */
static uint64_t recv_stream(mx_endpoint_t ep, uint32_t len, uint64_t iters, uint32_t window,
                            mx_endpoint_addr_t peer, void *go) {
  mx_request_t *reqs = calloc(window, sizeof(*reqs));
  unsigned char *bufs = malloc((size_t)window * len + 1);
  if (!reqs || !bufs) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  uint64_t posted = 0, bytes = 0;
  for (; posted < iters && posted < window; posted++) {
    mx_segment_t seg = {bufs + (size_t)posted * len, len};
    CHECK(mx_irecv(ep, &seg, 1, 0, 0, NULL, &reqs[posted]));
  }
  send_msg(ep, peer, go, 0);
  for (uint64_t done = 0; done < iters; done++) {
    mx_status_t s;
    uint32_t slot = (uint32_t)(done % window);
    wait_done(ep, &reqs[slot], &s);
    if (s.msg_length != len) {
      fprintf(stderr, "received %u bytes, expected %u\n", s.msg_length, len);
      exit(1);
    }
    bytes += s.xfer_length;
    if (posted < iters) {
      mx_segment_t seg = {bufs + (size_t)slot * len, len};
      CHECK(mx_irecv(ep, &seg, 1, 0, 0, NULL, &reqs[slot]));
      posted++;
    }
  }
  free(bufs);
  free(reqs);
  return bytes;
}

static void report(const uint64_t *rt, uint64_t nrt, uint64_t messages, uint64_t bytes,
                   uint64_t elapsed, uint64_t cpu, uint64_t start) {
  printf("{\"round_trips_ns\":[");
  for (uint64_t i = 0; i < nrt; i++) printf(i ? ",%llu" : "%llu", (unsigned long long)rt[i]);
  printf("],\"messages\":%llu,\"bytes\":%llu,\"elapsed_ns\":%llu,\"cpu_ns\":%llu,"
         "\"start_ns\":%llu}\n",
         (unsigned long long)messages, (unsigned long long)bytes, (unsigned long long)elapsed,
         (unsigned long long)cpu, (unsigned long long)start);
  fflush(stdout);
}

static void *alloc(uint32_t len) {
  unsigned char *b = malloc(len ? len : 1);
  if (!b) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  for (uint32_t i = 0; i < len; i++) b[i] = (unsigned char)(i % 251);
  return b;
}

static void client(mx_endpoint_t ep, const struct opts *o) {
  uint64_t nic;
  mx_endpoint_addr_t peer;
  mx_status_t s;
  if (o->host)
    CHECK(mx_hostname_to_nic_id((char *)o->host, &nic));
  else
    CHECK(mx_board_number_to_nic_id(0, &nic));
  CHECK(mx_connect(ep, nic, o->eid, BENCH_KEY, 10000, &peer));
  unsigned char *out = alloc(o->size), *in = alloc(o->size);
  uint64_t cpu0 = cpu_ns();
  if (!o->stream) {
    uint64_t *rt = calloc(o->iters ? o->iters : 1, sizeof(*rt));
    if (!rt) exit(1);
    for (uint64_t i = 0; i < o->warmup + o->iters; i++) {
      if (i == o->warmup) cpu0 = cpu_ns();
      uint64_t t0 = now_ns();
      send_msg(ep, peer, out, o->size);
      recv_msg(ep, in, o->size, &s);
      if (i >= o->warmup) rt[i - o->warmup] = now_ns() - t0;
      progress(i + 1, o->warmup + o->iters);
    }
    report(rt, o->iters, o->iters, o->iters * o->size, 0, cpu_ns() - cpu0, 0);
    free(rt);
  } else {
    mx_request_t reqs[STREAM_WINDOW];
    mx_segment_t seg = {out, o->size};
    for (uint64_t i = 0; i < o->warmup; i++) send_msg(ep, peer, out, o->size);
    recv_msg(ep, in, 0, &s);
    cpu0 = cpu_ns();
    for (uint64_t i = 0; i < o->iters; i++) {
      if (i >= STREAM_WINDOW) wait_done(ep, &reqs[i % STREAM_WINDOW], &s);
      CHECK(mx_isend(ep, &seg, 1, peer, 0, NULL, &reqs[i % STREAM_WINDOW]));
      progress(i + 1, o->iters);
    }
    uint64_t first = o->iters > STREAM_WINDOW ? o->iters - STREAM_WINDOW : 0;
    for (uint64_t i = first; i < o->iters; i++) wait_done(ep, &reqs[i % STREAM_WINDOW], &s);
    recv_msg(ep, in, 0, &s);
    report(NULL, 0, o->iters, o->iters * o->size, 0, cpu_ns() - cpu0, 0);
  }
  free(out);
  free(in);
}

/* The driver holds both FIFOs open for writing, so these opens do not block; the
 * gate is opened before arriving is announced, so closing it after the last
 * arrival reaches every waiter as end-of-file. */
static void pass_gate(const char *dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/gate", dir);
  int gate = open(path, O_RDONLY | O_CLOEXEC);
  snprintf(path, sizeof path, "%s/arrive", dir);
  int arrive = open(path, O_WRONLY | O_CLOEXEC);
  if (gate < 0 || arrive < 0) {
    perror("opening the start gate");
    exit(1);
  }
  char c = 1, buf[16];
  if (write(arrive, &c, 1) != 1) {
    perror("announcing arrival at the gate");
    exit(1);
  }
  close(arrive);
  while (read(gate, buf, sizeof buf) > 0) {
  }
  close(gate);
}

static void server(mx_endpoint_t ep, const struct opts *o) {
  unsigned char *out = alloc(o->size), *in = alloc(o->size);
  mx_status_t s;
  mx_endpoint_addr_t peer;
  int connected = 0;
  uint64_t cpu0 = cpu_ns();
  uint64_t total = o->warmup + o->iters;
  if (!o->stream) {
    for (uint64_t i = 0; i < total; i++) {
      if (i == o->warmup) cpu0 = cpu_ns();
      recv_msg(ep, in, o->size, &s);
      if (!connected) {
        uint64_t nic;
        uint32_t eid;
        CHECK(mx_decompose_endpoint_addr(s.source, &nic, &eid));
        CHECK(mx_connect(ep, nic, eid, BENCH_KEY, 10000, &peer));
        connected = 1;
      }
      send_msg(ep, peer, out, o->size);
    }
    report(NULL, 0, o->iters, o->iters * o->size, 0, cpu_ns() - cpu0, 0);
  } else {
    uint64_t nic;
    uint32_t eid;
    for (uint64_t i = 0; i < o->warmup; i++) recv_msg(ep, in, o->size, &s);
    CHECK(mx_decompose_endpoint_addr(s.source, &nic, &eid));
    CHECK(mx_connect(ep, nic, eid, BENCH_KEY, 10000, &peer));
    if (o->gate) pass_gate(o->gate);
    cpu0 = cpu_ns();
    uint64_t t0 = now_ns();
    uint64_t bytes = recv_stream(ep, o->size, o->iters, recv_window(), peer, out);
    uint64_t elapsed = now_ns() - t0;
    send_msg(ep, peer, out, 0);
    report(NULL, 0, o->iters, bytes, elapsed, cpu_ns() - cpu0, t0);
  }
  free(out);
  free(in);
}

struct thread_arg {
  mx_endpoint_t ep;
  const struct opts *o;
};

static void *server_thread(void *p) {
  struct thread_arg *a = p;
  server(a->ep, a->o);
  return NULL;
}

static mx_endpoint_t open_ep(uint32_t eid) {
  mx_endpoint_t ep;
  CHECK(mx_open_endpoint(MX_ANY_NIC, eid, BENCH_KEY, NULL, 0, &ep));
  return ep;
}

static void usage(const char *prog) {
  fprintf(stderr,
          "usage: %s -i | [-l EID [-g DIR] | -d HOST -e EID] -t pingpong|stream -s SIZE -w WARMUP -n ITERS\n",
          prog);
  exit(2);
}

int main(int argc, char **argv) {
  struct opts o = {NULL, NULL, SERVER_EID, -1, 0, 0, 0, 0, 1};
  int c;
  const char *poll_env = getenv("MX_BENCH_POLL");
  poll_mode = poll_env && strcmp(poll_env, "1") == 0;
  while ((c = getopt(argc, argv, "il:d:e:t:s:w:n:g:")) != -1) {
    switch (c) {
    case 'i': o.info = 1; break;
    case 'l': o.listen = atoi(optarg); break;
    case 'd': o.host = optarg; break;
    case 'e': o.eid = (uint32_t)atoi(optarg); break;
    case 't':
      if (strcmp(optarg, "stream") == 0) o.stream = 1;
      else if (strcmp(optarg, "pingpong") != 0) usage(argv[0]);
      break;
    case 's': o.size = (uint32_t)strtoul(optarg, NULL, 10); break;
    case 'w': o.warmup = strtoull(optarg, NULL, 10); break;
    case 'n': o.iters = strtoull(optarg, NULL, 10); break;
    case 'g': o.gate = optarg; break;
    default: usage(argv[0]);
    }
  }
  if (o.stream && o.warmup == 0) o.warmup = 1; /* the server learns its peer from it */
  CHECK(mx_init());
  if (o.info) {
    mx_endpoint_t ep = open_ep(MX_ANY_ENDPOINT);
    CHECK(mx_close_endpoint(ep));
    printf("ok\n");
  } else if (o.listen >= 0) {
    mx_endpoint_t ep = open_ep((uint32_t)o.listen);
    printf("ready\n");
    fflush(stdout);
    server(ep, &o);
    CHECK(mx_close_endpoint(ep));
  } else if (o.host) {
    mx_endpoint_t ep = open_ep(MX_ANY_ENDPOINT);
    client(ep, &o);
    CHECK(mx_close_endpoint(ep));
  } else {
    mx_endpoint_t sep = open_ep(SERVER_EID), cep = open_ep(CLIENT_EID);
    pthread_t t;
    struct thread_arg a = {sep, &o};
    if (pthread_create(&t, NULL, server_thread, &a) != 0) exit(1);
    client(cep, &o);
    pthread_join(t, NULL);
    CHECK(mx_close_endpoint(cep));
    CHECK(mx_close_endpoint(sep));
  }
  CHECK(mx_finalize());
  return 0;
}
