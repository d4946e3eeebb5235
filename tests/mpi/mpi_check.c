/*
 * Checks the results of MPI communication at every message size up to a
 * maximum (4 MiB by default): point-to-point in both directions with
 * blocking, nonblocking, synchronous and ANY_SOURCE receives, probes, a
 * cancelled receive, and the collectives the OSU micro-benchmarks time
 * (allreduce of longs, alltoall, bcast, barrier). Every byte and sum is
 * compared with what it must be; the first difference aborts the job.
 *
 *   mpi_check [MAX_BYTES]
 *
 * Prints one line per size and check on rank 0, then "mpi_check: all
 * results correct".
 */

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, nranks;

#define FAIL(...)                                                                          \
  do {                                                                                     \
    fprintf(stderr, "mpi_check: rank %d: ", rank);                                         \
    fprintf(stderr, __VA_ARGS__);                                                          \
    fprintf(stderr, "\n");                                                                 \
    MPI_Abort(MPI_COMM_WORLD, 1);                                                          \
  } while (0)

/* The byte at offset i of a message from rank `from` to rank `to` in round `round`. */
static unsigned char byte_of(int from, int to, int round, size_t i) {
  uint32_t x = (uint32_t)(i * 2654435761u) ^ (uint32_t)(from * 7919 + to * 104729 + round * 15485863);
  x ^= x >> 13;
  x *= 0x5bd1e995u;
  return (unsigned char)(x ^ (x >> 15));
}

static void fill(unsigned char *buf, size_t n, int from, int to, int round) {
  for (size_t i = 0; i < n; i++)
    buf[i] = byte_of(from, to, round, i);
}

static void verify(const unsigned char *buf, size_t n, int from, int to, int round,
                   const char *what) {
  for (size_t i = 0; i < n; i++)
    if (buf[i] != byte_of(from, to, round, i))
      FAIL("%s: %zu bytes from rank %d: byte %zu differs", what, n, from, i);
}

static void check_count(MPI_Status *st, size_t n, int source, const char *what) {
  int count;
  MPI_Get_count(st, MPI_BYTE, &count);
  if ((size_t)count != n || st->MPI_SOURCE != source)
    FAIL("%s: status says %d bytes from rank %d, expected %zu from %d", what, count,
         st->MPI_SOURCE, n, source);
}

/* Ping-pong between rank 0 and every other rank in turn. */
static void pingpong(unsigned char *out, unsigned char *in, size_t n, int round) {
  for (int peer = 1; peer < nranks; peer++) {
    MPI_Status st;
    if (rank == 0) {
      fill(out, n, 0, peer, round);
      MPI_Send(out, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
      MPI_Recv(in, (int)n, MPI_BYTE, peer, 2, MPI_COMM_WORLD, &st);
      check_count(&st, n, peer, "ping-pong reply");
      verify(in, n, peer, 0, round, "ping-pong reply");
    } else if (rank == peer) {
      MPI_Recv(in, (int)n, MPI_BYTE, 0, 1, MPI_COMM_WORLD, &st);
      check_count(&st, n, 0, "ping-pong");
      verify(in, n, 0, peer, round, "ping-pong");
      fill(out, n, peer, 0, round);
      MPI_Send(out, (int)n, MPI_BYTE, 0, 2, MPI_COMM_WORLD);
    }
  }
}

/* Everyone sends to the next rank and receives from the previous one, with
 * nonblocking calls, twice with one tag (the second must not overtake the
 * first). */
static void ring(unsigned char *out, unsigned char *in, unsigned char *out2, unsigned char *in2,
                 size_t n, int round) {
  int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  MPI_Request r[4];
  MPI_Status st[4];
  fill(out, n, rank, next, round);
  fill(out2, n / 2 + 1, rank, next, round + 1);
  MPI_Irecv(in, (int)n, MPI_BYTE, prev, 3, MPI_COMM_WORLD, &r[0]);
  MPI_Irecv(in2, (int)(n / 2 + 1), MPI_BYTE, prev, 3, MPI_COMM_WORLD, &r[1]);
  MPI_Isend(out, (int)n, MPI_BYTE, next, 3, MPI_COMM_WORLD, &r[2]);
  MPI_Isend(out2, (int)(n / 2 + 1), MPI_BYTE, next, 3, MPI_COMM_WORLD, &r[3]);
  MPI_Waitall(4, r, st);
  check_count(&st[0], n, prev, "ring");
  check_count(&st[1], n / 2 + 1, prev, "ring, second message");
  verify(in, n, prev, rank, round, "ring");
  verify(in2, n / 2 + 1, prev, rank, round + 1, "ring, second message");
}

/* Synchronous sends to rank 0, received with ANY_SOURCE after a probe. */
static void ssend_any_source(unsigned char *out, unsigned char *in, size_t n, int round) {
  if (rank == 0) {
    for (int k = 1; k < nranks; k++) {
      MPI_Status st;
      int count;
      MPI_Probe(MPI_ANY_SOURCE, 4, MPI_COMM_WORLD, &st);
      MPI_Get_count(&st, MPI_BYTE, &count);
      if ((size_t)count != n)
        FAIL("probe: %d bytes, expected %zu", count, n);
      int from = st.MPI_SOURCE;
      MPI_Recv(in, (int)n, MPI_BYTE, MPI_ANY_SOURCE, 4, MPI_COMM_WORLD, &st);
      check_count(&st, n, st.MPI_SOURCE, "ANY_SOURCE receive");
      if (st.MPI_SOURCE != from && nranks == 2)
        FAIL("probe saw rank %d, receive got rank %d", from, st.MPI_SOURCE);
      verify(in, n, st.MPI_SOURCE, 0, round, "synchronous send");
    }
  } else {
    fill(out, n, rank, 0, round);
    MPI_Ssend(out, (int)n, MPI_BYTE, 0, 4, MPI_COMM_WORLD);
  }
}

static void allreduce(long *send, long *recv, size_t count, int round) {
  for (size_t i = 0; i < count; i++)
    send[i] = (long)(i * 3 + 1) * (rank + 1) + round;
  MPI_Allreduce(send, recv, (int)count, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  long ranks_sum = (long)nranks * (nranks + 1) / 2;
  for (size_t i = 0; i < count; i++) {
    long want = (long)(i * 3 + 1) * ranks_sum + (long)round * nranks;
    if (recv[i] != want)
      FAIL("allreduce of %zu longs: element %zu is %ld, expected %ld", count, i, recv[i], want);
  }
}

static void alltoall(unsigned char *out, unsigned char *in, size_t per, int round) {
  for (int to = 0; to < nranks; to++)
    fill(out + (size_t)to * per, per, rank, to, round);
  MPI_Alltoall(out, (int)per, MPI_BYTE, in, (int)per, MPI_BYTE, MPI_COMM_WORLD);
  for (int from = 0; from < nranks; from++)
    verify(in + (size_t)from * per, per, from, rank, round, "alltoall");
}

static void bcast(unsigned char *buf, size_t n, int round) {
  int root = round % nranks;
  if (rank == root)
    fill(buf, n, root, -1, round);
  else
    memset(buf, 0, n);
  MPI_Bcast(buf, (int)n, MPI_BYTE, root, MPI_COMM_WORLD);
  verify(buf, n, root, -1, round, "bcast");
}

/* A receive nobody sends to is cancelled; the communication after it is
 * unaffected. */
static void cancelled_receive(unsigned char *in) {
  MPI_Request r;
  MPI_Status st;
  int cancelled;
  MPI_Irecv(in, 16, MPI_BYTE, (rank + 1) % nranks, 99, MPI_COMM_WORLD, &r);
  MPI_Cancel(&r);
  MPI_Wait(&r, &st);
  MPI_Test_cancelled(&st, &cancelled);
  if (!cancelled)
    FAIL("a receive nobody matched was not cancelled");
}

static void say(const char *what, size_t n) {
  if (rank == 0) {
    printf("%-28s %9zu bytes ok\n", what, n);
    fflush(stdout);
  }
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  size_t max = argc > 1 ? (size_t)strtoull(argv[1], NULL, 0) : (size_t)4 << 20;
  size_t big = max * (size_t)nranks + 16;
  unsigned char *out = malloc(big), *in = malloc(big), *out2 = malloc(max + 16),
                *in2 = malloc(max + 16);
  long *ls = malloc(((size_t)1 << 20) * sizeof(long)), *lr = malloc(((size_t)1 << 20) * sizeof(long));
  if (!out || !in || !out2 || !in2 || !ls || !lr)
    FAIL("out of memory");
  cancelled_receive(in);
  say("cancelled receive", 16);
  MPI_Barrier(MPI_COMM_WORLD);
  /* 0, every power of two, and odd lengths around the MX class boundaries. */
  size_t sizes[64], nsizes = 0;
  const size_t odd[] = {33, 129, 4097, 32769, 65537};
  size_t next_odd = 0;
  sizes[nsizes++] = 0;
  for (size_t p = 1; p <= max; p *= 2) {
    while (next_odd < sizeof(odd) / sizeof(odd[0]) && odd[next_odd] < p) {
      if (odd[next_odd] <= max)
        sizes[nsizes++] = odd[next_odd];
      next_odd++;
    }
    sizes[nsizes++] = p;
  }
  int round = 0;
  for (size_t k = 0; k < nsizes; k++, round++) {
    size_t n = sizes[k];
    pingpong(out, in, n, round);
    say("ping-pong", n);
    ring(out, in, out2, in2, n, round);
    say("ring", n);
    ssend_any_source(out, in, n, round);
    say("ssend + probe + ANY_SOURCE", n);
    size_t longs = n / sizeof(long);
    allreduce(ls, lr, longs < ((size_t)1 << 20) ? longs : (size_t)1 << 20, round);
    say("allreduce", n);
    alltoall(out, in, n, round);
    say("alltoall (bytes per rank)", n);
    bcast(in, n, round);
    say("bcast", n);
    MPI_Barrier(MPI_COMM_WORLD);
  }
  /* The counts the allreduce of MPI applications was seen to get wrong,
   * then a small one after them. */
  size_t counts[] = {65536, (size_t)1 << 20, 1, 4};
  for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++, round++) {
    allreduce(ls, lr, counts[k], round);
    say("allreduce (longs)", counts[k]);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0)
    printf("mpi_check: all results correct (%d ranks, up to %zu bytes)\n", nranks, max);
  free(out);
  free(in);
  free(out2);
  free(in2);
  free(ls);
  free(lr);
  MPI_Finalize();
  return 0;
}
