/*
 * heartbeat: the pulse of a guest that is moved between hosts (scenario migrate).
 *
 *   heartbeat [PERIOD_MS]
 *
 * Every PERIOD_MS (default 100) milliseconds: read the guest's domain id (`domid`), write
 * the beat's number at data/heartbeat and the longest gaps seen between two beats at
 * data/heartbeat-gap, "REALTIME MONOTONIC BOOTTIME BEAT": milliseconds by each clock, and
 * the beat that ended the longest realtime gap. A beat that finds another domain id than
 * the last (the guest now runs elsewhere) writes data/heartbeat-move, "FROM TO REALTIME
 * MONOTONIC BOOTTIME BEAT", the gap that move cost by each clock, and says so on stdout,
 * as it says every gap of a second or more.
 *
 * It speaks to xenstore through /dev/xen/xenbus itself: a shell loop's forks take most of
 * a 100 ms period under emulation. The paths are relative: xenstored resolves them against
 * the home of the domain the guest is at the time, on whichever host that is.
 * Runs until killed; exits 2 if xenstore cannot be used.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* xen/io/xs_wire.h */
enum { XS_READ = 2, XS_WRITE = 11, XS_ERROR = 16 };
struct xsd_sockmsg {
    uint32_t type;
    uint32_t req_id;
    uint32_t tx_id;
    uint32_t len;
};

static int xs_fd = -1;
static uint32_t req_id;

static int read_all(int fd, void *p, size_t len)
{
    char *c = p;
    while (len > 0) {
        ssize_t n = read(fd, c, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        c += n;
        len -= (size_t)n;
    }
    return 0;
}

/* One request; its reply's payload (NUL-terminated) in `reply`. 0, or -1. */
static int xs_request(uint32_t type, const char *a, size_t alen, const char *b, size_t blen,
                      char *reply, size_t cap)
{
    char msg[sizeof(struct xsd_sockmsg) + 4096];
    struct xsd_sockmsg h = {.type = type, .req_id = ++req_id, .tx_id = 0,
                            .len = (uint32_t)(alen + blen)};
    if (alen + blen > 4096)
        return -1;
    memcpy(msg, &h, sizeof(h));
    memcpy(msg + sizeof(h), a, alen);
    memcpy(msg + sizeof(h) + alen, b, blen);
    /* The device takes one whole message per write. */
    ssize_t n;
    do
        n = write(xs_fd, msg, sizeof(h) + alen + blen);
    while (n < 0 && errno == EINTR);
    if (n != (ssize_t)(sizeof(h) + alen + blen))
        return -1;
    struct xsd_sockmsg r;
    if (read_all(xs_fd, &r, sizeof(r)) < 0 || r.len >= 4096)
        return -1;
    char body[4096];
    if (read_all(xs_fd, body, r.len) < 0)
        return -1;
    body[r.len] = 0;
    if (reply && cap > 0) {
        size_t k = r.len < cap - 1 ? r.len : cap - 1;
        memcpy(reply, body, k);
        reply[k] = 0;
    }
    return r.type == XS_ERROR ? -1 : 0;
}

static int xs_read(const char *path, char *out, size_t cap)
{
    return xs_request(XS_READ, path, strlen(path) + 1, "", 0, out, cap);
}

static int xs_write(const char *path, const char *value)
{
    return xs_request(XS_WRITE, path, strlen(path) + 1, value, strlen(value), NULL, 0);
}

static long long ms(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int main(int argc, char **argv)
{
    long period = argc > 1 ? atol(argv[1]) : 100;
    if (period <= 0 || argc > 2) {
        fprintf(stderr, "usage: heartbeat [PERIOD_MS]\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    xs_fd = open("/dev/xen/xenbus", O_RDWR);
    if (xs_fd < 0) {
        perror("heartbeat: /dev/xen/xenbus");
        return 2;
    }
    char domid[32], last_domid[32] = "", value[128];
    long long prt = 0, pmono = 0, pboot = 0, max_rt = 0, max_mono = 0, max_boot = 0;
    unsigned long n = 0, at = 0, failures = 0;
    for (;;) {
        long long rt = ms(CLOCK_REALTIME), mono = ms(CLOCK_MONOTONIC), boot = ms(CLOCK_BOOTTIME);
        n++;
        if (xs_read("domid", domid, sizeof(domid)) < 0)
            snprintf(domid, sizeof(domid), "?");
        if (n > 1) {
            long long g = rt - prt, gm = mono - pmono, gb = boot - pboot;
            if (g > max_rt) {
                max_rt = g;
                at = n;
            }
            if (gm > max_mono)
                max_mono = gm;
            if (gb > max_boot)
                max_boot = gb;
            if (strcmp(domid, last_domid) != 0) {
                printf("heartbeat %lu: now domain %s (was %s), after a gap of %lld ms "
                       "(monotonic %lld ms, boottime %lld ms)\n",
                       n, domid, last_domid, g, gm, gb);
                snprintf(value, sizeof(value), "%s %s %lld %lld %lld %lu", last_domid, domid, g,
                         gm, gb, n);
                xs_write("data/heartbeat-move", value);
            } else if (g >= 1000) {
                printf("heartbeat %lu: %lld ms since the last (monotonic %lld ms, boottime %lld ms)\n",
                       n, g, gm, gb);
            }
        } else {
            printf("heartbeat: domain %s, a beat every %ld ms\n", domid, period);
        }
        snprintf(last_domid, sizeof(last_domid), "%s", domid);
        prt = rt;
        pmono = mono;
        pboot = boot;
        snprintf(value, sizeof(value), "%lu", n);
        int ok = xs_write("data/heartbeat", value) == 0;
        snprintf(value, sizeof(value), "%lld %lld %lld %lu", max_rt, max_mono, max_boot, at);
        ok = xs_write("data/heartbeat-gap", value) == 0 && ok;
        if (!ok && failures++ < 10)
            printf("heartbeat %lu: a xenstore write failed\n", n);
        if (n % 100 == 0)
            printf("heartbeat %lu (domain %s)\n", n, domid);
        struct timespec ts = {.tv_sec = period / 1000, .tv_nsec = (period % 1000) * 1000000};
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
            ;
    }
}
