/*
 * unixcall: one request line to a unix stream socket, the reply line on stdout.
 *
 *   unixcall SOCKET REQUEST [TIMEOUT_S]
 *
 * For the JSON control sockets of xmx-backd and xmxd from a shell that has no
 * such client. Exit status: 0 when a whole reply line came back, 1 otherwise,
 * 2 on a usage error.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define MAX_REPLY (1 << 20)

static int write_all(int fd, const char *p, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 3 || argc > 4) {
    fprintf(stderr, "usage: %s SOCKET REQUEST [TIMEOUT_S]\n", argv[0]);
    return 2;
  }
  int timeout_ms = (argc == 4 ? atoi(argv[3]) : 10) * 1000;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(argv[1]) >= sizeof sa.sun_path) {
    fprintf(stderr, "unixcall: socket path too long\n");
    return 2;
  }
  strcpy(sa.sun_path, argv[1]);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
    fprintf(stderr, "unixcall: %s: %s\n", argv[1], strerror(errno));
    return 1;
  }
  if (write_all(fd, argv[2], strlen(argv[2])) < 0 || write_all(fd, "\n", 1) < 0) {
    fprintf(stderr, "unixcall: write: %s\n", strerror(errno));
    return 1;
  }
  char *reply = malloc(MAX_REPLY);
  size_t have = 0;
  if (!reply) return 1;
  for (;;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      fprintf(stderr, "unixcall: no reply within %d ms\n", timeout_ms);
      return 1;
    }
    ssize_t n = read(fd, reply + have, MAX_REPLY - have);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      fprintf(stderr, "unixcall: the socket closed before a whole reply line\n");
      return 1;
    }
    char *nl = memchr(reply + have, '\n', (size_t)n);
    have += (size_t)n;
    if (nl) {
      fwrite(reply, 1, (size_t)(nl - reply) + 1, stdout);
      return 0;
    }
    if (have == MAX_REPLY) {
      fprintf(stderr, "unixcall: reply longer than %d bytes\n", MAX_REPLY);
      return 1;
    }
  }
}
