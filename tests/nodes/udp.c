/* A UDP server and client for the real-nodes tier's pods (busybox's nc has no UDP).
 * Built static by tests/nodes/tier.sh and mounted into busybox pods.
 *
 *   udp serve PORT REPLY   answer every datagram on PORT (IPv4, any address) with REPLY
 *   udp ask IP PORT        send one datagram to IP:PORT, print the answer and exit 0;
 *                          exit 1 when none comes within a second or the port is refused
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static int port_of(const char *s) {
    char *end;
    long p = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || p < 1 || p > 65535) {
        fprintf(stderr, "udp: bad port '%s'\n", s);
        exit(2);
    }
    return (int)p;
}

static int serve(int port, const char *reply) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        perror("udp serve: bind");
        return 2;
    }
    for (;;) {
        char buf[512];
        struct sockaddr_in from;
        socklen_t len = sizeof from;
        if (recvfrom(fd, buf, sizeof buf, 0, (struct sockaddr *)&from, &len) < 0) {
            if (errno == EINTR) continue;
            perror("udp serve: recvfrom");
            return 2;
        }
        sendto(fd, reply, strlen(reply), 0, (struct sockaddr *)&from, len);
    }
}

static int ask(const char *ip, int port) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    struct timeval tv = {.tv_sec = 1};
    char buf[512];
    ssize_t n;
    if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) {
        fprintf(stderr, "udp ask: '%s' is not an IPv4 address\n", ip);
        return 2;
    }
    /* Connected: an ICMP port unreachable comes back as ECONNREFUSED. */
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0) {
        perror("udp ask");
        return 2;
    }
    if (send(fd, "?", 1, 0) != 1) {
        perror("udp ask: send");
        return 1;
    }
    n = recv(fd, buf, sizeof buf - 1, 0);
    if (n < 0) {
        perror("udp ask: recv");
        return 1;
    }
    buf[n] = '\0';
    printf("%s\n", buf);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "serve") == 0) return serve(port_of(argv[2]), argv[3]);
    if (argc == 4 && strcmp(argv[1], "ask") == 0) return ask(argv[2], port_of(argv[3]));
    fprintf(stderr, "usage: udp serve PORT REPLY | udp ask IP PORT\n");
    return 2;
}
