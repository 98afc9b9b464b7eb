/* net_flood.c - a DNS flood from inside a sandbox (static, copied in by test_net_bus): as many
 * queries as it can send. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* usage: net_flood RESOLVER SECONDS NAME; prints how many queries it sent */
int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: net_flood RESOLVER SECONDS NAME\n");
        return 2;
    }
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(53)};
    if (inet_pton(AF_INET, argv[1], &to.sin_addr) != 1) {
        fprintf(stderr, "net_flood: bad resolver address %s\n", argv[1]);
        return 2;
    }
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    if (s < 0)
        return 1;
    uint8_t q[512];
    size_t off = 12;
    memset(q, 0, 12);
    q[2] = 0x01; /* RD */
    q[5] = 1;    /* one question */
    const char *name = argv[3];
    while (*name && off < 400) {
        const char *dot = strchr(name, '.');
        size_t l = dot ? (size_t)(dot - name) : strlen(name);
        q[off++] = (uint8_t)l;
        memcpy(q + off, name, l);
        off += l;
        name += l + (dot ? 1 : 0);
    }
    q[off++] = 0;
    q[off++] = 0;
    q[off++] = 1; /* A */
    q[off++] = 0;
    q[off++] = 1; /* IN */
    time_t end = time(NULL) + atoi(argv[2]);
    unsigned long sent = 0;
    uint8_t junk[1500];
    while (time(NULL) < end) {
        q[0] = (uint8_t)(sent >> 8);
        q[1] = (uint8_t)sent;
        if (sendto(s, q, off, 0, (struct sockaddr *)&to, sizeof to) > 0)
            sent++;
        while (recv(s, junk, sizeof junk, 0) > 0)
            ;
    }
    printf("%lu\n", sent);
    return 0;
}
