/*
 * An allreduce-like exchange over rings of 2 and 4 endpoints (two per
 * process, each driven by its own thread): every member sends its vector
 * of 64-bit values to the next member as several LARGE messages at once
 * while receiving as many from the previous one, adds what it received,
 * and passes the sum on, until every member holds the sum of all vectors.
 * So several LARGE messages are outstanding in both directions at once.
 * Every element of every sum, and every completion's status, is checked.
 *
 * Ring order: A0 -> P0 -> A1 -> P1 -> A0 (4), A0 <-> P0 (2). The active
 * side's endpoints say hello to both passive ones, so the passive side
 * learns their addresses; P0 answers A0 once P1 is open.
 */

#include "xmx_test.h"

#define COUNT (65536 + 3) /* values per vector: chunks of odd sizes */
#define CHUNKS 4
#define M_HELLO 0x4e110000ull
#define M_READY 0x4e120000ull
#define M_DATA 0xda7a000000000000ull

struct member {
  mx_endpoint_t ep;
  mx_endpoint_addr_t next;
  uint64_t prev_nic;
  uint32_t prev_eid;
  int rank, n;
  pthread_t thread;
};

static uint32_t chunk_at(int k) { return (uint32_t)((uint64_t)COUNT * k / CHUNKS); }

static void *ring_member(void *p) {
  struct member *m = p;
  int64_t *acc = malloc(COUNT * sizeof(int64_t)), *carry = malloc(COUNT * sizeof(int64_t)),
          *in = malloc(COUNT * sizeof(int64_t));
  EXPECT(acc && carry && in, "vectors");
  for (uint32_t i = 0; i < COUNT; i++) acc[i] = carry[i] = (int64_t)m->rank * 1000003 + i;
  for (int step = 0; step < m->n - 1; step++) {
    mx_request_t rr[CHUNKS], sr[CHUNKS];
    for (int k = 0; k < CHUNKS; k++) {
      uint32_t a = chunk_at(k), b = chunk_at(k + 1);
      uint64_t match = M_DATA | (uint64_t)m->n << 32 | (uint64_t)step << 8 | k;
      mx_segment_t rs = {in + a, (b - a) * sizeof(int64_t)};
      CHECK(mx_irecv(m->ep, &rs, 1, match, MX_MATCH_MASK_NONE, (void *)(uintptr_t)(k + 1), &rr[k]));
    }
    for (int k = 0; k < CHUNKS; k++) {
      uint32_t a = chunk_at(k), b = chunk_at(k + 1);
      uint64_t match = M_DATA | (uint64_t)m->n << 32 | (uint64_t)step << 8 | k;
      mx_segment_t ss = {carry + a, (b - a) * sizeof(int64_t)};
      CHECK(mx_isend(m->ep, &ss, 1, m->next, match, (void *)(uintptr_t)(k + 10), &sr[k]));
    }
    for (int k = 0; k < CHUNKS; k++) {
      uint32_t len = (chunk_at(k + 1) - chunk_at(k)) * sizeof(int64_t);
      uint64_t match = M_DATA | (uint64_t)m->n << 32 | (uint64_t)step << 8 | k;
      char what[64];
      snprintf(what, sizeof(what), "ring of %d, member %d, step %d, chunk %d", m->n, m->rank,
               step, k);
      mx_status_t s = test_wait(m->ep, &rr[k]);
      test_status_is(&s, MX_STATUS_SUCCESS, m->prev_nic, m->prev_eid, match, len, len,
                     (void *)(uintptr_t)(k + 1), what);
    }
    for (int k = 0; k < CHUNKS; k++) {
      mx_status_t s = test_wait(m->ep, &sr[k]);
      uint32_t len = (chunk_at(k + 1) - chunk_at(k)) * sizeof(int64_t);
      EXPECT(s.code == MX_STATUS_SUCCESS && s.msg_length == len && s.xfer_length == len &&
                 s.context == (void *)(uintptr_t)(k + 10),
             "ring of %d, member %d: send %d: %s %u/%u", m->n, m->rank, k,
             mx_strstatus(s.code), s.msg_length, s.xfer_length);
    }
    /* What came in is the previous member's carry: add it, pass it on. */
    for (uint32_t i = 0; i < COUNT; i++) {
      acc[i] += in[i];
      carry[i] = in[i];
    }
  }
  int64_t base = 1000003ll * m->n * (m->n - 1) / 2;
  for (uint32_t i = 0; i < COUNT; i++)
    EXPECT(acc[i] == base + (int64_t)m->n * i, "ring of %d, member %d: element %u is %lld, not %lld",
           m->n, m->rank, i, (long long)acc[i], (long long)(base + (int64_t)m->n * i));
  free(acc);
  free(carry);
  free(in);
  return NULL;
}

static void run_ring(struct member *mine, int count) {
  for (int i = 0; i < count; i++)
    EXPECT(pthread_create(&mine[i].thread, NULL, ring_member, &mine[i]) == 0, "thread");
  for (int i = 0; i < count; i++) pthread_join(mine[i].thread, NULL);
}

static void send_zero(mx_endpoint_t ep, mx_endpoint_addr_t to, uint64_t match) {
  mx_request_t r;
  mx_segment_t none = {NULL, 0};
  CHECK(mx_isend(ep, &none, 1, to, match, NULL, &r));
  test_wait(ep, &r);
}

static mx_status_t recv_zero(mx_endpoint_t ep, uint64_t match) {
  mx_request_t r;
  mx_segment_t none = {NULL, 0};
  CHECK(mx_irecv(ep, &none, 1, match, MX_MATCH_MASK_NONE, NULL, &r));
  return test_wait(ep, &r);
}

static void active(mx_endpoint_t a0, struct test_opts *o) {
  mx_endpoint_t a1;
  CHECK(mx_open_endpoint(MX_ANY_NIC, MX_ANY_ENDPOINT, TEST_KEY, NULL, 0, &a1));
  mx_endpoint_addr_t p0 = test_connect(a0, o->host, o->remote_eid);
  send_zero(a0, p0, M_HELLO | 0);
  recv_zero(a0, M_READY); /* P1 is open */
  mx_endpoint_addr_t p1 = test_connect(a0, o->host, o->remote_eid + 1);
  mx_endpoint_addr_t p0_from_a1 = test_connect(a1, o->host, o->remote_eid);
  mx_endpoint_addr_t p1_from_a1 = test_connect(a1, o->host, o->remote_eid + 1);
  send_zero(a1, p0_from_a1, M_HELLO | 1);
  send_zero(a0, p1, M_HELLO | 0);
  send_zero(a1, p1_from_a1, M_HELLO | 1);
  uint64_t nic;
  uint32_t e0, e1;
  CHECK(mx_decompose_endpoint_addr(p0, &nic, &e0));
  CHECK(mx_decompose_endpoint_addr(p1, &nic, &e1));

  struct member two = {a0, p0, nic, e0, 0, 2, 0};
  run_ring(&two, 1);
  struct member four[2] = {{a0, p0, nic, e1, 0, 4, 0}, {a1, p1_from_a1, nic, e0, 2, 4, 0}};
  run_ring(four, 2);
  CHECK(mx_close_endpoint(a1));
  printf("rings of 2 and 4: every sum checked\n");
}

static void passive(mx_endpoint_t p0, struct test_opts *o) {
  mx_endpoint_t p1;
  uint32_t eid = o->listen_eid >= 0 ? (uint32_t)o->listen_eid : PASSIVE_EID;
  CHECK(mx_open_endpoint(MX_ANY_NIC, eid + 1, TEST_KEY, NULL, 0, &p1));
  mx_status_t h = recv_zero(p0, M_HELLO | 0);
  mx_endpoint_addr_t a0 = test_connect_back(p0, &h);
  send_zero(p0, a0, M_READY);
  mx_status_t h1 = recv_zero(p0, M_HELLO | 1);
  recv_zero(p1, M_HELLO | 0);
  recv_zero(p1, M_HELLO | 1);
  mx_endpoint_addr_t a1_from_p0 = test_connect_back(p0, &h1);
  mx_endpoint_addr_t a0_from_p1 = test_connect_back(p1, &h);
  uint64_t n0, n1;
  uint32_t e0, e1;
  CHECK(mx_decompose_endpoint_addr(h.source, &n0, &e0));
  CHECK(mx_decompose_endpoint_addr(h1.source, &n1, &e1));

  struct member two = {p0, a0, n0, e0, 1, 2, 0};
  run_ring(&two, 1);
  struct member four[2] = {{p0, a1_from_p0, n0, e0, 1, 4, 0}, {p1, a0_from_p1, n1, e1, 3, 4, 0}};
  run_ring(four, 2);
  CHECK(mx_close_endpoint(p1));
  printf("rings of 2 and 4: every sum checked\n");
}

int main(int argc, char **argv) { return test_run(argc, argv, active, passive); }
