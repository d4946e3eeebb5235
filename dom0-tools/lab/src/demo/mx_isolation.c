/*
 * The isolation step of `xmx demo`, run as an application of one guest: try to
 * reach other guests through the MX API and report what MX answers, one JSON
 * line per target on stdout.
 *
 *   mx_isolation [-t TIMEOUT_MS] HOSTNAME=NIC_ID ...
 *
 * For each target it asks mx_hostname_to_nic_id for HOSTNAME, then calls
 * mx_connect on NIC_ID (hexadecimal, the board address dom0's peer table
 * gives) with endpoint 2 and TIMEOUT_MS (default 5000). Errors are returned,
 * not fatal, so every answer is reported with its time in milliseconds.
 */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "myriexpress.h"

#define KEY 0x5eedb0b0u
#define TARGET_EID 2

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static const char *code_name(mx_return_t r) {
  switch (r) {
  case MX_SUCCESS: return "MX_SUCCESS";
  case MX_FAILURE: return "MX_FAILURE";
  case MX_NO_PERM: return "MX_NO_PERM";
  case MX_BAD_ENDPOINT: return "MX_BAD_ENDPOINT";
  case MX_HOST_NOT_FOUND: return "MX_HOST_NOT_FOUND";
  case MX_TIMEOUT: return "MX_TIMEOUT";
  case MX_BAD_ENDPOINT_ID: return "MX_BAD_ENDPOINT_ID";
  case MX_CONNECTION_FAILED: return "MX_CONNECTION_FAILED";
  case MX_BAD_CONNECTION_KEY: return "MX_BAD_CONNECTION_KEY";
  case MX_NIC_NOT_FOUND: return "MX_NIC_NOT_FOUND";
  default: return "MX_OTHER";
  }
}

/* The text as a JSON string body: the library's messages are plain ASCII,
 * but quotes, backslashes and control bytes are escaped all the same. */
static void json_text(const char *s) {
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') printf("\\%c", c);
    else if (c < 0x20) printf("\\u%04x", c);
    else putchar(c);
  }
}

static void outcome(const char *what, mx_return_t r, double ms) {
  printf("\"%s\":{\"code\":%d,\"name\":\"%s\",\"message\":\"", what, (int)r, code_name(r));
  json_text(mx_strerror(r));
  printf("\",\"ms\":%.3f}", ms);
}

int main(int argc, char **argv) {
  uint32_t timeout = 5000;
  int c;
  while ((c = getopt(argc, argv, "t:")) != -1) {
    if (c == 't') timeout = (uint32_t)strtoul(optarg, NULL, 10);
    else {
      fprintf(stderr, "usage: %s [-t TIMEOUT_MS] HOSTNAME=NIC_ID ...\n", argv[0]);
      return 2;
    }
  }
  mx_return_t r = mx_init();
  if (r != MX_SUCCESS) {
    fprintf(stderr, "mx_init: %s\n", mx_strerror(r));
    return 1;
  }
  mx_set_error_handler(MX_ERRORS_RETURN);
  mx_endpoint_t ep;
  r = mx_open_endpoint(MX_ANY_NIC, MX_ANY_ENDPOINT, KEY, NULL, 0, &ep);
  if (r != MX_SUCCESS) {
    fprintf(stderr, "mx_open_endpoint: %s\n", mx_strerror(r));
    return 1;
  }
  for (int i = optind; i < argc; i++) {
    char host[MX_MAX_HOSTNAME_LEN + 1];
    const char *eq = strchr(argv[i], '=');
    size_t len = eq ? (size_t)(eq - argv[i]) : 0;
    if (!eq || len == 0 || len > MX_MAX_HOSTNAME_LEN) {
      fprintf(stderr, "bad target %s (want HOSTNAME=NIC_ID)\n", argv[i]);
      return 2;
    }
    memcpy(host, argv[i], len);
    host[len] = '\0';
    uint64_t nic = strtoull(eq + 1, NULL, 16);

    uint64_t found = 0;
    double t0 = now_ms();
    mx_return_t lookup = mx_hostname_to_nic_id(host, &found);
    double lookup_ms = now_ms() - t0;

    mx_endpoint_addr_t addr;
    t0 = now_ms();
    mx_return_t conn = mx_connect(ep, nic, TARGET_EID, KEY, timeout, &addr);
    double connect_ms = now_ms() - t0;

    printf("{\"target\":\"");
    json_text(host);
    printf("\",\"nic_id\":\"%012" PRIx64 "\",", nic);
    outcome("lookup", lookup, lookup_ms);
    putchar(',');
    outcome("connect", conn, connect_ms);
    printf("}\n");
    fflush(stdout);
  }
  mx_close_endpoint(ep);
  mx_finalize();
  return 0;
}
