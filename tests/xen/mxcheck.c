/*
 * mxcheck: the MX traffic of the real-Xen scenarios, between two guests.
 *
 *   mxcheck -l EID [-n ITERS] [-s BYTES] [-r ROUNDS | -t SECONDS]
 *       the passive side: open endpoint EID, echo the ping-pong, receive the
 *       LARGE message and check every byte, send one back.
 *   mxcheck -d HOST -e EID [-n ITERS] [-s BYTES] [-r ROUNDS | -t SECONDS] [-w SECONDS]
 *       the active side: find HOST (an MX hostname) and connect to its endpoint
 *       EID, retrying for up to SECONDS (the peer may still be starting, on
 *       another machine), then ITERS timed 8-byte round trips (half of the mean
 *       round trip is printed as the latency), then BYTES (default 16 MiB) each
 *       way, every byte checked by its receiver; ROUNDS times (default 1), each
 *       round with its own contents, the slowest round reported (a stream that
 *       outlasts a migration shows what the move cost). With -t, rounds go on for
 *       SECONDS from the first one, then the active side says stop.
 *
 * Both sides must be given the same ITERS, BYTES and ROUNDS (or -t). Lines worth
 * keeping start with "mxcheck:"; the exit status is 0 when every check held.
 */
#include <sys/time.h>
#include <time.h>

#include "xmx_test.h"

#define WARMUP 10
#define PING_LEN 8
#define TAG_PING 1
#define TAG_LARGE_OUT 2
#define TAG_LARGE_BACK 3
/* Matches TAG_LARGE_OUT under TAG_ROUND_MASK: a timed passive side takes either. */
#define TAG_STOP 6
#define TAG_ROUND_MASK 3
#define SEED_OUT 0x1234
#define SEED_BACK 0x5678

struct opts {
  const char *host;
  uint32_t eid;
  int passive;
  int iters;
  uint32_t bytes;
  int rounds;
  int seconds;
  int wait_s;
};

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void usage(const char *prog) {
  fprintf(stderr,
          "usage: %s -l EID [-n ITERS] [-s BYTES] [-r ROUNDS | -t SECONDS]\n"
          "       %s -d HOST -e EID [-n ITERS] [-s BYTES] [-r ROUNDS | -t SECONDS] [-w SECONDS]\n",
          prog, prog);
  exit(2);
}

static struct opts parse(int argc, char **argv) {
  struct opts o = {NULL, PASSIVE_EID, 0, 100, 16u << 20, 1, 0, 60};
  int c;
  while ((c = getopt(argc, argv, "l:d:e:n:s:r:t:w:h")) != -1) {
    switch (c) {
    case 'l': o.passive = 1; o.eid = (uint32_t)atoi(optarg); break;
    case 'd': o.host = optarg; break;
    case 'e': o.eid = (uint32_t)atoi(optarg); break;
    case 'n': o.iters = atoi(optarg); break;
    case 's': o.bytes = (uint32_t)strtoul(optarg, NULL, 0); break;
    case 'r': o.rounds = atoi(optarg); break;
    case 't': o.seconds = atoi(optarg); break;
    case 'w': o.wait_s = atoi(optarg); break;
    default: usage(argv[0]);
    }
  }
  if (o.passive == (o.host != NULL) || o.iters < 1 || o.rounds < 1 || o.seconds < 0 || o.wait_s < 1)
    usage(argv[0]);
  return o;
}

static void send_wait(mx_endpoint_t ep, mx_endpoint_addr_t to, void *buf, uint32_t len,
                      uint64_t tag) {
  mx_segment_t seg = {buf, len};
  mx_request_t req;
  CHECK(mx_isend(ep, &seg, 1, to, tag, NULL, &req));
  mx_status_t s = test_wait(ep, &req);
  EXPECT(s.code == MX_STATUS_SUCCESS, "send of %u bytes: %s", len, mx_strstatus(s.code));
}

static mx_status_t recv_wait(mx_endpoint_t ep, void *buf, uint32_t len, uint64_t tag) {
  mx_segment_t seg = {buf, len};
  mx_request_t req;
  CHECK(mx_irecv(ep, &seg, 1, tag, MX_MATCH_MASK_NONE, NULL, &req));
  mx_status_t s = test_wait(ep, &req);
  EXPECT(s.code == MX_STATUS_SUCCESS, "receive of %u bytes: %s", len, mx_strstatus(s.code));
  EXPECT(s.msg_length == len && s.xfer_length == len, "%u/%u bytes received, %u expected",
         s.msg_length, s.xfer_length, len);
  return s;
}

/* The peer's address, retrying both the name lookup (the peer table may not list
 * the peer yet) and the connection (its endpoint may not be open yet). */
static mx_endpoint_addr_t connect_retrying(mx_endpoint_t ep, const struct opts *o) {
  double deadline = now_us() + o->wait_s * 1e6;
  int tries = 0;
  for (;;) {
    uint64_t nic;
    mx_endpoint_addr_t addr;
    mx_return_t r = mx_hostname_to_nic_id((char *)o->host, &nic);
    tries++;
    if (r == MX_SUCCESS) {
      r = mx_connect(ep, nic, o->eid, TEST_KEY, 2000, &addr);
      if (r == MX_SUCCESS) {
        printf("mxcheck: connected to %s endpoint %u (attempt %d)\n", o->host, o->eid, tries);
        return addr;
      }
    }
    if (now_us() > deadline) {
      fprintf(stderr, "mxcheck: cannot reach %s endpoint %u in %d s: %s\n", o->host, o->eid,
              o->wait_s, mx_strerror(r));
      exit(1);
    }
    usleep(200000);
  }
}

static unsigned char *alloc(uint32_t len) {
  unsigned char *p = malloc(len ? len : 1);
  EXPECT(p != NULL, "%u bytes of memory", len);
  return p;
}

static void active(mx_endpoint_t ep, const struct opts *o) {
  mx_endpoint_addr_t peer = connect_retrying(ep, o);
  unsigned char ping[PING_LEN], pong[PING_LEN];
  double t0 = 0;
  for (int k = 0; k < WARMUP + o->iters; k++) {
    if (k == WARMUP) t0 = now_us();
    test_fill(ping, sizeof ping, (uint32_t)k);
    send_wait(ep, peer, ping, sizeof ping, TAG_PING);
    recv_wait(ep, pong, sizeof pong, TAG_PING);
    test_verify(pong, sizeof pong, (uint32_t)k + 1, "pong");
  }
  double half_rtt = (now_us() - t0) / (2.0 * o->iters);
  printf("mxcheck: ping-pong %d B x %d: half-RTT %.1f us\n", PING_LEN, o->iters, half_rtt);

  unsigned char *buf = alloc(o->bytes);
  double out_ms = 0, back_ms = 0, slowest_ms = 0;
  int slowest = 0;
  double until = now_us() + o->seconds * 1e6;
  int rounds = 0;
  for (int r = 0; o->seconds ? now_us() < until : r < o->rounds; r++) {
    rounds = r + 1;
    test_fill(buf, o->bytes, SEED_OUT + (uint32_t)r);
    t0 = now_us();
    send_wait(ep, peer, buf, o->bytes, TAG_LARGE_OUT);
    out_ms = (now_us() - t0) / 1e3;
    memset(buf, 0, o->bytes);
    double t1 = now_us();
    recv_wait(ep, buf, o->bytes, TAG_LARGE_BACK);
    back_ms = (now_us() - t1) / 1e3;
    test_verify(buf, o->bytes, SEED_BACK + (uint32_t)r, "large message from the peer");
    double round_ms = (now_us() - t0) / 1e3;
    if (round_ms > slowest_ms) {
      slowest_ms = round_ms;
      slowest = r;
    }
  }
  printf("mxcheck: sent %u B in %.1f ms; received %u B, every byte checked, in %.1f ms "
         "(%.1f MB/s)\n",
         o->bytes, out_ms, o->bytes, back_ms, back_ms > 0 ? o->bytes / (back_ms * 1e3) : 0.0);
  if (o->seconds) {
    unsigned char stop = 1;
    send_wait(ep, peer, &stop, 1, TAG_STOP);
  }
  if (rounds > 1)
    printf("mxcheck: %d rounds each way, every byte checked; slowest round %d: %.1f ms\n",
           rounds, slowest + 1, slowest_ms);
  free(buf);
}

static void passive(mx_endpoint_t ep, const struct opts *o) {
  unsigned char ping[PING_LEN], pong[PING_LEN];
  mx_endpoint_addr_t peer;
  for (int k = 0; k < WARMUP + o->iters; k++) {
    mx_status_t s = recv_wait(ep, ping, sizeof ping, TAG_PING);
    test_verify(ping, sizeof ping, (uint32_t)k, "ping");
    if (k == 0) {
      peer = test_connect_back(ep, &s);
      printf("mxcheck: first ping received, connected back\n");
    }
    test_fill(pong, sizeof pong, (uint32_t)k + 1);
    send_wait(ep, peer, pong, sizeof pong, TAG_PING);
  }
  printf("mxcheck: echoed %d pings\n", WARMUP + o->iters);

  unsigned char *buf = alloc(o->bytes);
  int rounds = 0;
  double last_ms = 0;
  for (int r = 0; o->seconds || r < o->rounds; r++) {
    memset(buf, 0, o->bytes);
    double t0 = now_us();
    if (o->seconds) {
      /* The next round, or the active side's stop. */
      mx_segment_t seg = {buf, o->bytes};
      mx_request_t req;
      CHECK(mx_irecv(ep, &seg, 1, TAG_LARGE_OUT, TAG_ROUND_MASK, NULL, &req));
      mx_status_t s = test_wait(ep, &req);
      EXPECT(s.code == MX_STATUS_SUCCESS, "receive of round %d: %s", r + 1,
             mx_strstatus(s.code));
      if (s.match_info == TAG_STOP) break;
      EXPECT(s.msg_length == o->bytes && s.xfer_length == o->bytes,
             "%u/%u bytes received, %u expected", s.msg_length, s.xfer_length, o->bytes);
    } else {
      recv_wait(ep, buf, o->bytes, TAG_LARGE_OUT);
    }
    rounds = r + 1;
    double in_ms = (now_us() - t0) / 1e3;
    test_verify(buf, o->bytes, SEED_OUT + (uint32_t)r, "large message from the peer");
    last_ms = in_ms;
    test_fill(buf, o->bytes, SEED_BACK + (uint32_t)r);
    send_wait(ep, peer, buf, o->bytes, TAG_LARGE_BACK);
  }
  printf("mxcheck: received %u B, every byte checked, in %.1f ms\n", o->bytes, last_ms);
  if (rounds > 1) printf("mxcheck: %d rounds each way, every byte checked\n", rounds);
  free(buf);
}

int main(int argc, char **argv) {
  struct opts o = parse(argc, argv);
  setvbuf(stdout, NULL, _IOLBF, 0);
  /* A refused connection (the peer's endpoint not open yet) is retried, not fatal. */
  mx_set_error_handler(MX_ERRORS_RETURN);
  CHECK(mx_init());
  mx_endpoint_t ep;
  CHECK(mx_open_endpoint(MX_ANY_NIC, o.passive ? o.eid : MX_ANY_ENDPOINT, TEST_KEY, NULL, 0,
                         &ep));
  if (o.passive) {
    printf("mxcheck: endpoint %u open\n", o.eid);
    passive(ep, &o);
  } else {
    active(ep, &o);
  }
  /* Which path the messages took: a direct channel (co-located guests, when
   * dom0 offers it) or the backend. */
  printf("mxcheck: direct frames sent %u, received %u\n", test_counter("Direct frames sent"),
         test_counter("Direct frames received"));
  CHECK(mx_close_endpoint(ep));
  CHECK(mx_finalize());
  printf("mxcheck: PASS (%s)\n", o.passive ? "passive" : "active");
  return 0;
}
