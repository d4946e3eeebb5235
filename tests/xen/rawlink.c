/*
 * rawlink: prove an Ethernet link between two test hosts with MXoE-ethertype frames.
 *
 *   rawlink echo IFACE [TIMEOUT_S]
 *       return every 0x86DF frame to its sender until an end frame arrives.
 *   rawlink ping IFACE PEER_MAC SIZES [ROUNDS] [TIMEOUT_S]
 *       send ROUNDS frames of each size in SIZES (comma separated, whole frame
 *       with its 14-byte header) to PEER_MAC, expect each back byte for byte,
 *       then send the end frame.
 *
 * Exit status: 0 when every frame came back intact (ping) or the end frame arrived
 * (echo); 1 on a lost or corrupted frame or a timeout; 2 on a usage or setup error.
 * Frames that are not ours (other ethertypes, other senders) are ignored.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define ETHERTYPE_MXOE 0x86DF
#define HDR 14
#define MIN_FRAME 60
#define MAX_FRAME 9014
/* Payload prefix: a magic, so frames from anything else on the link are ignored. */
static const char MAGIC[8] = "XMXLINK";
#define KIND_DATA 1
#define KIND_END 2
/* Attempts per frame before a loss is declared: the emulated link is UDP underneath. */
#define ATTEMPTS 5

struct link {
    int fd;
    int ifindex;
    uint8_t mac[6];
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int parse_mac(const char *s, uint8_t mac[6])
{
    unsigned v[6];
    char tail;
    if (sscanf(s, "%x:%x:%x:%x:%x:%x%c", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &tail) != 6)
        return -1;
    for (int i = 0; i < 6; i++) {
        if (v[i] > 0xff)
            return -1;
        mac[i] = (uint8_t)v[i];
    }
    return 0;
}

static int open_link(const char *ifname, struct link *l)
{
    struct ifreq ifr;
    struct sockaddr_ll sll;

    if (strlen(ifname) >= IFNAMSIZ) {
        fprintf(stderr, "rawlink: interface name too long\n");
        return -1;
    }
    l->fd = socket(AF_PACKET, SOCK_RAW, htons(ETHERTYPE_MXOE));
    if (l->fd < 0) {
        perror("rawlink: socket(AF_PACKET)");
        return -1;
    }
    memset(&ifr, 0, sizeof(ifr));
    memcpy(ifr.ifr_name, ifname, strlen(ifname));
    if (ioctl(l->fd, SIOCGIFINDEX, &ifr) < 0) {
        perror("rawlink: SIOCGIFINDEX");
        return -1;
    }
    l->ifindex = ifr.ifr_ifindex;
    if (ioctl(l->fd, SIOCGIFHWADDR, &ifr) < 0) {
        perror("rawlink: SIOCGIFHWADDR");
        return -1;
    }
    memcpy(l->mac, ifr.ifr_hwaddr.sa_data, 6);
    memset(&sll, 0, sizeof(sll));
    sll.sll_family = AF_PACKET;
    sll.sll_protocol = htons(ETHERTYPE_MXOE);
    sll.sll_ifindex = l->ifindex;
    if (bind(l->fd, (struct sockaddr *)&sll, sizeof(sll)) < 0) {
        perror("rawlink: bind");
        return -1;
    }
    return 0;
}

/* Receive one of our frames within `timeout_s`: its length, 0 on timeout, -1 on error. */
static ssize_t recv_frame(struct link *l, uint8_t *buf, size_t cap, double timeout_s)
{
    double deadline = now_s() + timeout_s;
    for (;;) {
        double left = deadline - now_s();
        if (left <= 0)
            return 0;
        struct pollfd p = {.fd = l->fd, .events = POLLIN};
        int r = poll(&p, 1, (int)(left * 1000) + 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            perror("rawlink: poll");
            return -1;
        }
        if (r == 0)
            return 0;
        struct sockaddr_ll from;
        socklen_t fl = sizeof(from);
        ssize_t n = recvfrom(l->fd, buf, cap, MSG_TRUNC, (struct sockaddr *)&from, &fl);
        if (n < 0) {
            perror("rawlink: recvfrom");
            return -1;
        }
        if (from.sll_pkttype == PACKET_OUTGOING)
            continue;
        if ((size_t)n > cap || n < HDR + 13)
            continue;
        if (memcmp(buf + HDR, MAGIC, sizeof(MAGIC)) != 0)
            continue;
        return n;
    }
}

static int send_frame(struct link *l, const uint8_t *frame, size_t len)
{
    struct sockaddr_ll to;
    memset(&to, 0, sizeof(to));
    to.sll_family = AF_PACKET;
    to.sll_ifindex = l->ifindex;
    to.sll_halen = 6;
    memcpy(to.sll_addr, frame, 6);
    ssize_t n = sendto(l->fd, frame, len, 0, (struct sockaddr *)&to, sizeof(to));
    if (n != (ssize_t)len) {
        perror("rawlink: sendto");
        return -1;
    }
    return 0;
}

/* Frame `seq` of `len` bytes: header, magic, kind, seq, then a pattern of the seq. */
static void build_frame(uint8_t *f, size_t len, const uint8_t dst[6], const uint8_t src[6],
                        uint8_t kind, uint32_t seq)
{
    memcpy(f, dst, 6);
    memcpy(f + 6, src, 6);
    f[12] = ETHERTYPE_MXOE >> 8;
    f[13] = ETHERTYPE_MXOE & 0xff;
    memcpy(f + HDR, MAGIC, sizeof(MAGIC));
    f[HDR + 8] = kind;
    uint32_t be = htonl(seq);
    memcpy(f + HDR + 9, &be, 4);
    for (size_t i = HDR + 13; i < len; i++)
        f[i] = (uint8_t)(i * 7 + seq * 13);
}

static int echo(struct link *l, double timeout_s)
{
    static uint8_t buf[MAX_FRAME + 64];
    unsigned long echoed = 0;
    int ended = 0;
    double deadline = now_s() + timeout_s;
    for (;;) {
        ssize_t n = recv_frame(l, buf, sizeof(buf), deadline - now_s());
        if (n < 0)
            return 2;
        if (n == 0 && ended) {
            printf("rawlink echo: end frame received, %lu frames echoed\n", echoed);
            return 0;
        }
        if (n == 0) {
            fprintf(stderr, "rawlink echo: no end frame within %.0f s (%lu echoed)\n", timeout_s, echoed);
            return 1;
        }
        uint8_t sender[6];
        memcpy(sender, buf + 6, 6);
        memcpy(buf, sender, 6);
        memcpy(buf + 6, l->mac, 6);
        if (send_frame(l, buf, (size_t)n) < 0)
            return 2;
        if (buf[HDR + 8] == KIND_END && !ended) {
            /* Linger a moment, in case our echo of the end frame is lost and resent. */
            ended = 1;
            deadline = now_s() + 1.0;
        } else if (buf[HDR + 8] != KIND_END) {
            echoed++;
        }
    }
}

/* Send `frame` and wait for it back unchanged but for the swapped addresses. */
static int round_trip(struct link *l, const uint8_t *frame, size_t len, const uint8_t peer[6],
                      unsigned *retries)
{
    static uint8_t buf[MAX_FRAME + 64];
    for (int attempt = 0; attempt < ATTEMPTS; attempt++) {
        if (attempt > 0)
            (*retries)++;
        if (send_frame(l, frame, len) < 0)
            return -1;
        for (;;) {
            ssize_t n = recv_frame(l, buf, sizeof(buf), 1.0);
            if (n < 0)
                return -1;
            if (n == 0)
                break; /* lost: send again */
            /* A late echo of an earlier attempt or frame: not this one. */
            if (memcmp(buf + HDR + 8, frame + HDR + 8, 5) != 0)
                continue;
            if ((size_t)n != len || memcmp(buf, l->mac, 6) != 0 || memcmp(buf + 6, peer, 6) != 0 ||
                memcmp(buf + 12, frame + 12, len - 12) != 0) {
                fprintf(stderr, "rawlink ping: frame of %zu bytes came back altered (%zd bytes)\n", len, n);
                return -1;
            }
            return 0;
        }
    }
    fprintf(stderr, "rawlink ping: frame of %zu bytes lost %d times\n", len, ATTEMPTS);
    return -1;
}

static int ping(struct link *l, const uint8_t peer[6], const char *sizes, unsigned rounds)
{
    static uint8_t frame[MAX_FRAME];
    unsigned retries = 0, sent = 0;
    uint32_t seq = 0;
    char list[256];
    if (strlen(sizes) >= sizeof(list)) {
        fprintf(stderr, "rawlink: size list too long\n");
        return 2;
    }
    strcpy(list, sizes);
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *end;
        unsigned long len = strtoul(tok, &end, 10);
        if (*end != '\0' || len < MIN_FRAME || len > MAX_FRAME) {
            fprintf(stderr, "rawlink: frame size %s outside %d..%d\n", tok, MIN_FRAME, MAX_FRAME);
            return 2;
        }
        double t0 = now_s();
        for (unsigned r = 0; r < rounds; r++) {
            build_frame(frame, len, peer, l->mac, KIND_DATA, ++seq);
            if (round_trip(l, frame, len, peer, &retries) < 0)
                return 1;
            sent++;
        }
        printf("rawlink ping: %u x %lu bytes echoed, %.1f us per round trip\n", rounds, len,
               (now_s() - t0) * 1e6 / rounds);
    }
    build_frame(frame, MIN_FRAME, peer, l->mac, KIND_END, ++seq);
    if (round_trip(l, frame, MIN_FRAME, peer, &retries) < 0)
        return 1;
    printf("rawlink ping: ok, %u frames echoed intact, %u resent\n", sent, retries);
    return 0;
}

static void usage(void)
{
    fprintf(stderr, "usage: rawlink echo IFACE [TIMEOUT_S]\n"
                    "       rawlink ping IFACE PEER_MAC SIZES [ROUNDS] [TIMEOUT_S]\n");
}

int main(int argc, char **argv)
{
    struct link l;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 3 && strcmp(argv[1], "echo") == 0) {
        double timeout_s = argc >= 4 ? atof(argv[3]) : 60;
        if (timeout_s <= 0) {
            usage();
            return 2;
        }
        if (open_link(argv[2], &l) < 0)
            return 2;
        return echo(&l, timeout_s);
    }
    if (argc >= 5 && strcmp(argv[1], "ping") == 0) {
        uint8_t peer[6];
        unsigned rounds = argc >= 6 ? (unsigned)strtoul(argv[5], NULL, 10) : 20;
        double timeout_s = argc >= 7 ? atof(argv[6]) : 60;
        if (parse_mac(argv[3], peer) < 0 || rounds == 0 || timeout_s <= 0) {
            usage();
            return 2;
        }
        if (open_link(argv[2], &l) < 0)
            return 2;
        /* The peer may still be booting: wait for its first echo, bounded. */
        double deadline = now_s() + timeout_s;
        static uint8_t probe[MIN_FRAME];
        unsigned ignored = 0;
        build_frame(probe, MIN_FRAME, peer, l.mac, KIND_DATA, 0);
        while (round_trip(&l, probe, MIN_FRAME, peer, &ignored) < 0) {
            if (now_s() >= deadline) {
                fprintf(stderr, "rawlink ping: peer silent for %.0f s\n", timeout_s);
                return 1;
            }
        }
        printf("rawlink ping: peer answers\n");
        return ping(&l, peer, argv[4], rounds);
    }
    usage();
    return 2;
}
