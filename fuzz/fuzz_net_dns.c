/* fuzz_net_dns.c - fuzz the resolver query path: no crash, nothing forwarded without policy. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <ldns/ldns.h>

#include "backends/net/net-int.h"
#include "dsec/alloc.h"
#include "dsec/err.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The fixed policy: names under allowed.test. It records its last verdict,
 * so a forwarded query can be checked against it. */
static struct {
    int calls;
    bool last;
    char name[256];
} seen;

static bool policy(void *ud, const struct sockaddr *cl, const char *name)
{
    (void)ud;
    (void)cl;
    size_t n = strlen(name), z = sizeof "allowed.test" - 1;
    bool ok = n == z ? strcmp(name, "allowed.test") == 0
                     : n > z && name[n - z - 1] == '.' && strcmp(name + n - z, "allowed.test") == 0;
    seen.calls++;
    seen.last = ok;
    snprintf(seen.name, sizeof seen.name, "%s", name);
    return ok;
}

static _Noreturn void die(const char *what)
{
    fprintf(stderr, "fuzz_net_dns: %s (last policy name \"%s\")\n", what, seen.name);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static dsec__dns *d;
    if (d == NULL) {
        dsec__dns_conf c = {.allowed = policy}; /* nlisten 0: the query path only */
        dsec_err err;
        if (dsec__dns_new(&d, &c, &err) < 0) {
            fprintf(stderr, "fuzz_net_dns: %s\n", err.msg);
            abort();
        }
    }
    struct sockaddr_in cl = {.sin_family = AF_INET, .sin_port = htons(5353)};
    inet_pton(AF_INET, "10.0.0.2", &cl.sin_addr);
    seen.calls = 0;
    seen.last = false;
    seen.name[0] = '\0';
    uint8_t *reply = NULL;
    size_t len = 0;
    if (dsec__dns_query_offline(d, (const struct sockaddr *)&cl, data, size, &reply, &len) < 0)
        die("offline query failed");
    if (reply == NULL) {
        /* dropped (no header, or a response) or forwarded; forwarded only
         * when the policy said yes, and only a standard query */
        bool has_header = size >= 12 && (data[2] & 0x80) == 0;
        if (has_header && (seen.calls != 1 || !seen.last))
            die("a query was forwarded without the policy's yes");
        if (has_header && ((data[2] >> 3) & 0x0f) != 0)
            die("a non-QUERY opcode was forwarded");
        return 0;
    }
    if (len < 12 || (reply[2] & 0x80) == 0)
        die("a reply without a header or without QR");
    if (size < 12 || reply[0] != data[0] || reply[1] != data[1])
        die("a reply that does not carry the query's id");
    unsigned rcode = reply[3] & 0x0f;
    if (rcode != LDNS_RCODE_REFUSED && rcode != LDNS_RCODE_FORMERR && rcode != LDNS_RCODE_SERVFAIL)
        die("an immediate reply that is not REFUSED/FORMERR/SERVFAIL");
    if (reply[6] != 0 || reply[7] != 0)
        die("an immediate reply with answers");
    ldns_pkt *p = NULL;
    if (ldns_wire2pkt(&p, reply, len) != LDNS_STATUS_OK)
        die("a reply ldns cannot parse");
    ldns_pkt_free(p);
    dsec_free(reply);
    return 0;
}
