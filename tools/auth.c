/* auth.c - `dsec auth`: the nats-server configuration that confines each tenant to its own
 * subjects, and one credentials file per identity. */
#include <crypt.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codecs/subjects.h"
#include "dsec/names.h"
#include "tools/cli.h"

#define MAX_TENANTS 4096

static int auth_usage(void)
{
    fprintf(stderr,
            "usage: dsec auth --out DIR --tenant NAME [--tenant NAME]... [--listen HOST:PORT]\n"
            "                 [--store-dir DIR] [--tls-cert FILE --tls-key FILE [--tls-ca FILE]]\n"
            "Writes DIR/nats-server.conf and DIR/creds/<identity>.env (mode 0600):\n"
            "  control        the control plane (dsecd, dsec up): every dsec subject\n"
            "  tenant-NAME    one per tenant: publishes only under dsec.v1.NAME.>, receives\n"
            "                 only under _INBOX.NAME.> (its own answers)\n"
            "  observer       read-only: subscribes to everything, publishes nothing\n"
            "  operator       the system account ($SYS: server monitoring with the nats CLI)\n"
            "Each .env holds DSEC_URL (and DSEC_TENANT, DSEC_TLS_CA): `set -a; . FILE`.\n"
            "Run it again with more tenants: existing identities keep their passwords.\n"
            "Sandboxes never get any of these: only node managers hold the control identity.\n");
    return 2;
}

/* 48 hex characters from the kernel's random source. */
static int new_password(char out[49])
{
    unsigned char b[24];
    size_t got = 0;
    while (got < sizeof b) {
        ssize_t r = getrandom(b + got, sizeof b - got, 0);
        if (r < 0 && errno != EINTR)
            return -1;
        if (r > 0)
            got += (size_t)r;
    }
    for (size_t i = 0; i < sizeof b; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
    return 0;
}

/* The password in an earlier DIR/creds/<id>.env, so a re-run keeps it. */
static bool old_password(const char *path, const char *user, char out[49])
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return false;
    char line[1024], want[160];
    snprintf(want, sizeof want, "//%s:", user);
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        char *p = strstr(line, want);
        if (strncmp(line, "DSEC_URL=", 9) != 0 || p == NULL)
            continue;
        p += strlen(want);
        size_t n = strcspn(p, "@");
        if (n == 48 && p[n] == '@' && strspn(p, "0123456789abcdef") >= 48) {
            memcpy(out, p, 48);
            out[48] = '\0';
            found = true;
        }
    }
    fclose(f);
    return found;
}

/* bcrypt, so the server's file holds no password. */
static const char *hash_password(const char *pw, struct crypt_data *cd)
{
    char *salt = crypt_gensalt_rn("$2b$", 11, NULL, 0, cd->setting, sizeof cd->setting);
    if (salt == NULL)
        return NULL;
    char *h = crypt_rn(pw, salt, cd, sizeof *cd);
    return h && h[0] == '$' ? h : NULL;
}

struct ident {
    const char *user;
    const char *tenant; /* tenants only */
    char pw[49];
    struct crypt_data cd;
    const char *hash;
};

/* tmp, created for writing by its owner alone; NULL when it cannot be (said). */
static FILE *open_private(const char *tmp)
{
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (f == NULL) {
        fprintf(stderr, "dsec auth: writing %s: %s\n", tmp, strerror(errno));
        if (fd >= 0)
            close(fd);
    }
    return f;
}

static int write_env(const char *dir, const struct ident *id, const char *scheme,
                     const char *listen, const char *ca)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/creds/%s.env", dir, id->user);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = open_private(tmp);
    if (f == NULL)
        return -1;
    fprintf(f, "# dsec auth: identity %s. Keep it secret: it is a password.\n", id->user);
    fprintf(f, "DSEC_URL=%s://%s:%s@%s\n", scheme, id->user, id->pw, listen);
    if (id->tenant)
        fprintf(f, "DSEC_TENANT=%s\n", id->tenant);
    if (ca)
        fprintf(f, "DSEC_TLS_CA=%s\n", ca);
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        fprintf(stderr, "dsec auth: writing %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* A path in the server file: quoted, so it must not hold a quote or a backslash. */
static bool conf_path_ok(const char *what, const char *p)
{
    if (p[0] == '\0' || strpbrk(p, "\"\\\n$") != NULL) {
        fprintf(stderr,
                "dsec auth: %s \"%s\": give a path without quotes, backslashes, '$' or newlines\n",
                what, p);
        return false;
    }
    return true;
}

/* What `dsec auth` was asked for. */
struct auth_args {
    const char *out, *listen, *store, *cert, *key, *ca;
    const char **tenants;
    size_t nt;
    char storebuf[4096];
};

/* The options, checked; 0, or the exit code for a wrong one (the usage or why, said). */
static int auth_parse(int argc, char **argv, struct auth_args *a)
{
    static const struct option opts[] = {{"out", required_argument, 0, 'o'},
                                         {"tenant", required_argument, 0, 't'},
                                         {"listen", required_argument, 0, 'l'},
                                         {"store-dir", required_argument, 0, 's'},
                                         {"tls-cert", required_argument, 0, 'c'},
                                         {"tls-key", required_argument, 0, 'k'},
                                         {"tls-ca", required_argument, 0, 'a'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    static const char *tenants[MAX_TENANTS];
    *a = (struct auth_args){.listen = "127.0.0.1:4222", .tenants = tenants};
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case 'o':
            a->out = optarg;
            break;
        case 'l':
            a->listen = optarg;
            break;
        case 's':
            a->store = optarg;
            break;
        case 'c':
            a->cert = optarg;
            break;
        case 'k':
            a->key = optarg;
            break;
        case 'a':
            a->ca = optarg;
            break;
        case 't':
            if (dsec_name_ok(optarg, DSEC_NAME_LEN_MAX) < 0) {
                fprintf(stderr, "dsec auth: tenant \"%s\": 1-64 characters of [A-Za-z0-9_-]\n",
                        optarg);
                return 2;
            }
            if (strcmp(optarg, "ctl") == 0) {
                fprintf(
                    stderr,
                    "dsec auth: \"ctl\" cannot be a tenant: dsec.v1.ctl is the control plane's\n");
                return 2;
            }
            if (a->nt == MAX_TENANTS) {
                fprintf(stderr, "dsec auth: more than %d tenants\n", MAX_TENANTS);
                return 2;
            }
            tenants[a->nt++] = optarg;
            break;
        default:
            return auth_usage();
        }
    }
    if (a->out == NULL || a->nt == 0 || optind != argc)
        return auth_usage();
    if ((a->cert == NULL) != (a->key == NULL)) {
        fprintf(stderr, "dsec auth: --tls-cert and --tls-key go together\n");
        return 2;
    }
    if (a->ca != NULL && a->cert == NULL) {
        fprintf(stderr, "dsec auth: --tls-ca needs --tls-cert and --tls-key (the server's)\n");
        return 2;
    }
    const char *colon = strrchr(a->listen, ':');
    char *end = NULL;
    long port = colon ? strtol(colon + 1, &end, 10) : -1;
    if (colon == NULL || colon == a->listen || end == NULL || *end != '\0' || port < 1 ||
        port > 65535 || strpbrk(a->listen, "\"\\ /@$") != NULL) {
        fprintf(stderr, "dsec auth: --listen \"%s\": expected HOST:PORT (port 1-65535)\n",
                a->listen);
        return 2;
    }
    if (a->store == NULL) {
        snprintf(a->storebuf, sizeof a->storebuf, "%s/jetstream", a->out);
        a->store = a->storebuf;
    }
    if (!conf_path_ok("--store-dir", a->store) ||
        (a->cert && !conf_path_ok("--tls-cert", a->cert)) ||
        (a->key && !conf_path_ok("--tls-key", a->key)) ||
        (a->ca && !conf_path_ok("--tls-ca", a->ca)))
        return 2;
    return 0;
}

/* The server's configuration, conf (tmp until it is whole): the accounts, and each identity's
 * user with its permissions. 0, or the exit code. */
static int write_conf(const struct auth_args *a, const struct ident *ids, const char *conf,
                      const char *tmp)
{
    FILE *f = open_private(tmp);
    if (f == NULL)
        return 1;
    fprintf(f,
            "# nats-server configuration written by `dsec auth` (docs/security.md).\n"
            "# Passwords are bcrypt hashes; the plain ones are in creds/*.env.\n"
            "listen: \"%s\"\n"
            "jetstream { store_dir: \"%s\" }\n",
            a->listen, a->store);
    if (a->cert) {
        fprintf(f, "tls {\n  cert_file: \"%s\"\n  key_file: \"%s\"\n", a->cert, a->key);
        if (a->ca)
            fprintf(f, "  ca_file: \"%s\"\n", a->ca);
        fprintf(f, "  timeout: 2\n}\n");
    }
    fprintf(f, "accounts {\n  DSEC {\n    jetstream: enabled\n    users: [\n");
    fprintf(f,
            "      # the control plane: schedulers, node managers, quota actors, arbiters\n"
            "      {user: \"control\", password: \"%s\"}\n",
            ids[0].hash);
    fprintf(f,
            "      # operators reading traffic (nats sub, dsec top): publishes nothing\n"
            "      {user: \"observer\", password: \"%s\",\n"
            "       permissions: {publish: {deny: [\">\"]}, subscribe: {allow: [\">\"]}}}\n",
            ids[1].hash);
    for (size_t i = 0; i < a->nt; i++)
        fprintf(f,
                "      {user: \"%s\", password: \"%s\",\n"
                "       permissions: {publish: {allow: [\"" DSEC_SUBJ_TENANT_ALL "\"]},\n"
                "                     subscribe: {allow: [\"_INBOX.%s.>\", \"" DSEC_SUBJ_TENANT_EVT
                "\"]}}}\n",
                ids[3 + i].user, ids[3 + i].hash, a->tenants[i], a->tenants[i], a->tenants[i]);
    fprintf(f,
            "    ]\n  }\n  SYS {\n    users: [\n      {user: \"operator\", password: \"%s\"}\n"
            "    ]\n  }\n}\nsystem_account: SYS\n",
            ids[2].hash);
    if (fclose(f) != 0 || rename(tmp, conf) != 0) {
        fprintf(stderr, "dsec auth: writing %s: %s\n", conf, strerror(errno));
        return 1;
    }
    return 0;
}

int dsec_cli_auth(int argc, char **argv)
{
    struct auth_args args;
    int prc = auth_parse(argc, argv, &args);
    if (prc != 0)
        return prc;
    const char *out = args.out, *listen = args.listen;
    size_t nt = args.nt;
    char path[4096];
    snprintf(path, sizeof path, "%s/creds", out);
    if ((mkdir(out, 0700) < 0 && errno != EEXIST) || (mkdir(path, 0700) < 0 && errno != EEXIST)) {
        fprintf(stderr, "dsec auth: creating %s: %s\n", path, strerror(errno));
        return 1;
    }

    size_t nid = nt + 3;
    struct ident *ids = calloc(nid, sizeof *ids);
    char(*users)[DSEC_NAME_LEN_MAX + 8] = calloc(nt, sizeof *users);
    if (ids == NULL || users == NULL) {
        fprintf(stderr, "dsec auth: out of memory\n");
        free(ids);
        free(users);
        return 1;
    }
    ids[0].user = "control";
    ids[1].user = "observer";
    ids[2].user = "operator";
    for (size_t i = 0; i < nt; i++) {
        snprintf(users[i], sizeof users[i], "tenant-%s", args.tenants[i]);
        ids[3 + i].user = users[i];
        ids[3 + i].tenant = args.tenants[i];
    }
    int rc = 0;
    for (size_t i = 0; i < nid && rc == 0; i++) {
        snprintf(path, sizeof path, "%s/creds/%s.env", out, ids[i].user);
        if (!old_password(path, ids[i].user, ids[i].pw) && new_password(ids[i].pw) < 0) {
            fprintf(stderr, "dsec auth: no random bytes: %s\n", strerror(errno));
            rc = 1;
        } else if ((ids[i].hash = hash_password(ids[i].pw, &ids[i].cd)) == NULL) {
            fprintf(stderr, "dsec auth: bcrypt failed for %s\n", ids[i].user);
            rc = 1;
        }
    }
    char conf[4096], tmp[4200];
    snprintf(conf, sizeof conf, "%s/nats-server.conf", out);
    snprintf(tmp, sizeof tmp, "%s.tmp", conf);
    if (rc == 0)
        rc = write_conf(&args, ids, conf, tmp);
    const char *scheme = args.cert ? "tls" : "nats";
    for (size_t i = 0; i < nid && rc == 0; i++)
        if (write_env(out, &ids[i], scheme, listen, args.ca) < 0)
            rc = 1;
    if (rc == 0)
        printf("wrote %s and %zu credentials files in %s/creds\n"
               "start the server: nats-server -c %s\n",
               conf, nid, out, conf);
    free(ids);
    free(users);
    return rc;
}
