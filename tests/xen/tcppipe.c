/*
 * tcppipe: the transport of `xl migrate -s` between two test hosts (the image has no ssh).
 *
 *   tcppipe ssh [-p PORT] [-t CONNECT_S] [-i IDLE_S] HOST COMMAND...
 *       What xl runs in place of ssh (`xl migrate -s "tcppipe ssh" DOMAIN HOST` runs
 *       `tcppipe ssh HOST xl migrate-receive`): connect to HOST:PORT, retrying refused or
 *       unreachable connects for up to CONNECT_S seconds, send COMMAND as one line, then
 *       copy stdin to the connection and the connection to stdout, until the far end
 *       closes the connection.
 *   tcppipe serve [-p PORT] [-t ACCEPT_S] [-i IDLE_S] [-o]
 *       The far end: accept connections on PORT for up to ACCEPT_S seconds. A connection
 *       whose first line is "ping" is answered "ready" and closed (with -o, tcppipe then
 *       exits 0: a barrier the other host releases); the first whose line is an xl
 *       migrate-receive command (`xl [OPTION]... migrate-receive [OPTION]...`) has it run
 *       by sh, its stdin and stdout relayed to the connection (through pipes, as ssh would:
 *       xl gets two distinct descriptors), and tcppipe exits with its status.
 *   tcppipe ping [-p PORT] [-t S] HOST
 *       Wait (up to S seconds, retrying) until a `serve` on HOST:PORT answers "ready".
 *
 * Every wait is bounded: no byte either way for IDLE_S seconds (default 60) ends a relay.
 * PORT defaults to 7700. Exit status: 0 ok (serve: the command's status), 1 timeout or
 * connection failure, 2 usage or setup error. Messages go to stderr, prefixed "tcppipe".
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_PORT 7700
#define LINE_MAX_LEN 512
#define BUF_LEN 65536
/* What a command returns for a usage error: main prints the usage. */
#define USAGE (-2)

static const char *mode = "?";

static void msg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void msg(const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "tcppipe %s: %s\n", mode, line);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int write_all(int fd, const char *p, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Milliseconds left until `deadline` (monotonic seconds), at least 0. */
static int left_ms(double deadline)
{
    double left = deadline - now_s();
    return left <= 0 ? 0 : (int)(left * 1000) + 1;
}

/* One line (without its newline) from fd within `timeout_s`: 0, or -1. */
static int read_line(int fd, char *line, size_t cap, double timeout_s)
{
    double deadline = now_s() + timeout_s;
    size_t len = 0;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, left_ms(deadline));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        char c;
        ssize_t n = read(fd, &c, 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        if (c == '\n') {
            line[len] = 0;
            return 0;
        }
        if (len + 1 >= cap)
            return -1;
        line[len++] = c;
    }
}

/* A TCP connection to host:port, retried until `timeout_s` passes; -1 if none. */
static int connect_retry(const char *host, int port, double timeout_s)
{
    double deadline = now_s() + timeout_s;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        msg("%s is not an IPv4 address", host);
        return -1;
    }
    int tries = 0, last_errno = 0;
    for (;;) {
        tries++;
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            msg("socket: %s", strerror(errno));
            return -1;
        }
        int r = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
        if (r < 0 && errno == EINPROGRESS) {
            /* One attempt waits at most 2 s (an unanswered SYN), within the bound. */
            int wait = left_ms(deadline);
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            r = poll(&p, 1, wait < 2000 ? wait : 2000);
            if (r > 0) {
                int err = 0;
                socklen_t el = sizeof(err);
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
                errno = err;
                r = err ? -1 : 0;
            } else {
                errno = r == 0 ? ETIMEDOUT : errno;
                r = -1;
            }
        }
        if (r == 0) {
            fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            if (tries > 1)
                msg("connected to %s:%d after %d attempts", host, port, tries);
            return fd;
        }
        last_errno = errno;
        close(fd);
        if (now_s() >= deadline) {
            msg("no connection to %s:%d within %.0f s (%d attempts, last: %s)", host, port,
                timeout_s, tries, strerror(last_errno));
            return -1;
        }
        usleep(200000);
    }
}

/*
 * Copy `in` to the connection and the connection to `out` until the connection's end
 * (client) or `in`'s end (server) is reached. The end of `in` is passed on (shutdown of
 * our sending half), the end of the connection too (`out` closed). Fails after `idle_s`
 * seconds with no byte either way.
 */
static int relay(int in, int out, int sock, int idle_s, int until_in_ends, unsigned long long counts[2])
{
    static char buf[BUF_LEN];
    int in_open = 1, sock_open = 1;
    counts[0] = counts[1] = 0;
    while (until_in_ends ? in_open : sock_open) {
        struct pollfd p[2] = {{.fd = in_open ? in : -1, .events = POLLIN},
                              {.fd = sock_open ? sock : -1, .events = POLLIN}};
        int r = poll(p, 2, idle_s * 1000);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            msg("poll: %s", strerror(errno));
            return -1;
        }
        if (r == 0) {
            msg("no byte either way for %d s (sent %llu, received %llu): giving up", idle_s,
                counts[0], counts[1]);
            return -1;
        }
        if (p[0].revents) {
            ssize_t n = read(in, buf, sizeof(buf));
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) {
                in_open = 0;
                shutdown(sock, SHUT_WR);
            } else if (write_all(sock, buf, (size_t)n) < 0) {
                msg("sending: %s (after %llu bytes)", strerror(errno), counts[0]);
                return -1;
            } else {
                counts[0] += (unsigned long long)n;
            }
        }
        if (p[1].revents) {
            ssize_t n = read(sock, buf, sizeof(buf));
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0) {
                msg("receiving: %s (after %llu bytes)", strerror(errno), counts[1]);
                close(out);
                return -1;
            } else if (n == 0) {
                sock_open = 0;
                close(out);
            } else if (write_all(out, buf, (size_t)n) < 0) {
                /* Our reader is gone: nothing more to pass on this way. */
                msg("passing on: %s (after %llu bytes)", strerror(errno), counts[1]);
                sock_open = 0;
            } else {
                counts[1] += (unsigned long long)n;
            }
        }
    }
    return 0;
}

struct opts {
    int port;
    int wait_s;
    int idle_s;
    int once;
};

/* Parse -p -t -i; returns the index of the first operand. */
static int parse_opts(int argc, char **argv, struct opts *o)
{
    int c;
    optind = 2;
    while ((c = getopt(argc, argv, "+p:t:i:o")) != -1) {
        switch (c) {
        case 'o': o->once = 1; break;
        case 'p': o->port = atoi(optarg); break;
        case 't': o->wait_s = atoi(optarg); break;
        case 'i': o->idle_s = atoi(optarg); break;
        default: return -1;
        }
    }
    if (o->port <= 0 || o->port > 65535 || o->wait_s <= 0 || o->idle_s <= 0)
        return -1;
    return optind;
}

static int cmd_ssh(int argc, char **argv)
{
    struct opts o = {DEFAULT_PORT, 30, 60, 0};
    int i = parse_opts(argc, argv, &o);
    if (i < 0 || argc - i < 2)
        return USAGE;
    char line[LINE_MAX_LEN] = "";
    for (int a = i + 1; a < argc; a++) {
        if (strlen(line) + strlen(argv[a]) + 2 >= sizeof(line)) {
            msg("command too long");
            return 2;
        }
        if (a > i + 1)
            strcat(line, " ");
        strcat(line, argv[a]);
    }
    double t0 = now_s();
    int sock = connect_retry(argv[i], o.port, o.wait_s);
    if (sock < 0)
        return 1;
    strcat(line, "\n");
    if (write_all(sock, line, strlen(line)) < 0) {
        msg("sending the command: %s", strerror(errno));
        return 1;
    }
    unsigned long long counts[2];
    int r = relay(0, 1, sock, o.idle_s, 0, counts);
    msg("%s: sent %llu bytes, received %llu, in %.2f s", r == 0 ? "done" : "failed", counts[0],
        counts[1], now_s() - t0);
    return r == 0 ? 0 : 1;
}

/* `xl [-OPTION]... migrate-receive [-OPTION]...` and nothing else. */
static int is_migrate_receive(const char *line)
{
    char copy[LINE_MAX_LEN];
    snprintf(copy, sizeof(copy), "%s", line);
    char *save = NULL, *w = strtok_r(copy, " ", &save);
    if (!w || strcmp(w, "xl") != 0)
        return 0;
    int seen = 0;
    while ((w = strtok_r(NULL, " ", &save))) {
        if (!seen && strcmp(w, "migrate-receive") == 0)
            seen = 1;
        else if (w[0] != '-' || strspn(w + 1, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") != strlen(w + 1))
            return 0;
    }
    return seen;
}

/* Wait for `pid` up to `timeout_s`, then kill it; its wait status, or -1. */
static int wait_child(pid_t pid, double timeout_s)
{
    double deadline = now_s() + timeout_s;
    int status;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return status;
        if (r < 0 && errno != EINTR)
            return -1;
        if (now_s() >= deadline) {
            msg("the command did not exit within %.0f s of closing its output: killed", timeout_s);
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        usleep(50000);
    }
}

static int run_command(int sock, const char *line, int idle_s)
{
    int to_child[2], from_child[2];
    if (pipe2(to_child, O_CLOEXEC) < 0 || pipe2(from_child, O_CLOEXEC) < 0) {
        msg("pipe: %s", strerror(errno));
        return 2;
    }
    double t0 = now_s();
    pid_t pid = fork();
    if (pid < 0) {
        msg("fork: %s", strerror(errno));
        return 2;
    }
    if (pid == 0) {
        dup2(to_child[0], 0);
        dup2(from_child[1], 1);
        execl("/bin/sh", "sh", "-c", line, (char *)NULL);
        _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    unsigned long long counts[2];
    int r = relay(from_child[0], to_child[1], sock, idle_s, 1, counts);
    close(sock);
    close(from_child[0]);
    if (r < 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        msg("'%s' killed after %.2f s (received %llu bytes, sent %llu)", line, now_s() - t0,
            counts[1], counts[0]);
        return 1;
    }
    int status = wait_child(pid, 30);
    int code = status < 0 ? 1 : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    msg("'%s' exited with %d after %.2f s (received %llu bytes, sent %llu)", line, code,
        now_s() - t0, counts[1], counts[0]);
    return code;
}

static int cmd_serve(int argc, char **argv)
{
    struct opts o = {DEFAULT_PORT, 300, 60, 0};
    int i = parse_opts(argc, argv, &o);
    if (i < 0 || i != argc)
        return USAGE;
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o.port),
                             .sin_addr.s_addr = htonl(INADDR_ANY)};
    if (ls < 0 || bind(ls, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(ls, 4) < 0) {
        msg("listening on port %d: %s", o.port, strerror(errno));
        return 2;
    }
    msg("listening on port %d for %d s", o.port, o.wait_s);
    double deadline = now_s() + o.wait_s;
    for (;;) {
        struct pollfd p = {.fd = ls, .events = POLLIN};
        int r = poll(&p, 1, left_ms(deadline));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            msg("%s within %d s", o.once ? "no ping came" : "no migration came", o.wait_s);
            return 1;
        }
        struct sockaddr_in peer;
        socklen_t pl = sizeof(peer);
        int sock = accept4(ls, (struct sockaddr *)&peer, &pl, SOCK_CLOEXEC);
        if (sock < 0)
            continue;
        setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        char from[INET_ADDRSTRLEN] = "?", line[LINE_MAX_LEN];
        inet_ntop(AF_INET, &peer.sin_addr, from, sizeof(from));
        if (read_line(sock, line, sizeof(line), 10) < 0) {
            msg("%s sent no command line", from);
            close(sock);
            continue;
        }
        if (strcmp(line, "ping") == 0) {
            write_all(sock, "ready\n", 6);
            close(sock);
            msg("ping from %s answered", from);
            if (o.once)
                return 0;
            continue;
        }
        if (!is_migrate_receive(line)) {
            msg("refused from %s: '%s' (only xl migrate-receive)", from, line);
            close(sock);
            continue;
        }
        msg("%s asks for '%s'", from, line);
        close(ls);
        return run_command(sock, line, o.idle_s);
    }
}

static int cmd_ping(int argc, char **argv)
{
    struct opts o = {DEFAULT_PORT, 60, 60, 0};
    int i = parse_opts(argc, argv, &o);
    if (i < 0 || argc - i != 1)
        return USAGE;
    double deadline = now_s() + o.wait_s;
    for (;;) {
        int sock = connect_retry(argv[i], o.port, deadline - now_s() > 0.2 ? deadline - now_s() : 0.2);
        if (sock < 0)
            return 1;
        char line[LINE_MAX_LEN];
        int ok = write_all(sock, "ping\n", 5) == 0 && read_line(sock, line, sizeof(line), 10) == 0 &&
                 strcmp(line, "ready") == 0;
        close(sock);
        if (ok)
            return 0;
        if (now_s() >= deadline) {
            msg("%s:%d never answered ready", argv[i], o.port);
            return 1;
        }
        usleep(200000);
    }
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc >= 2)
        mode = argv[1];
    int r = USAGE;
    if (argc >= 2 && strcmp(argv[1], "ssh") == 0)
        r = cmd_ssh(argc, argv);
    else if (argc >= 2 && strcmp(argv[1], "serve") == 0)
        r = cmd_serve(argc, argv);
    else if (argc >= 2 && strcmp(argv[1], "ping") == 0)
        r = cmd_ping(argc, argv);
    if (r == USAGE) {
        fprintf(stderr,
                "usage: tcppipe ssh [-p PORT] [-t CONNECT_S] [-i IDLE_S] HOST COMMAND...\n"
                "       tcppipe serve [-p PORT] [-t ACCEPT_S] [-i IDLE_S] [-o]\n"
                "       tcppipe ping [-p PORT] [-t S] HOST\n");
        return 2;
    }
    return r;
}
