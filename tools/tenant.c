/* tenant.c - `dsec tenant` and `dsec project`: define, show, list and remove quotas through a
 * cell's quota actor. */
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/wire.h"
#include "bus/bus.h"
#include "codecs/msg.h"
#include "dsec/alloc.h"
#include "dsec/names.h"
#include "codecs/subjects.h"
#include "tools/cli.h"

static int usage(const char *what)
{
    bool proj = strcmp(what, "project") == 0;
    const char *arg = proj ? "TENANT/PROJECT[/SUB...]" : "TENANT";
    fprintf(stderr,
            "usage: dsec %s set %s [--sandboxes N] [--cpu MILLI] [--memory MB]\n"
            "       dsec %s get %s\n"
            "       dsec %s ls [%s]\n"
            "       dsec %s rm %s\n"
            "options: --cell CELL (default $DSEC_CELL, else \"local\"); the bus is $DSEC_URL.\n"
            "A limit left out (or 0) is none of its own: only the levels above bound it.\n"
            "%s",
            what, arg, what, arg, what, proj ? "TENANT" : "", what, arg,
            proj
                ? "A project's limits are delegated from its parent (the tenant, or the project\n"
                  "above it): each is at most the parent's, and the parent must be defined first.\n"
                : "");
    return 2;
}

static bool parse_u64(const char *s, uint64_t *out)
{
    char *end;
    if (s == NULL || *s == '\0' || *s == '-')
        return false;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end != '\0')
        return false;
    *out = v;
    return true;
}

/* "acme/rl/math" -> tenant "acme", project "rl/math" (project NULL for "acme"). */
static int split_path(const char *what, const char *arg, char *tenant, size_t tn,
                      const char **project)
{
    const char *slash = strchr(arg, '/');
    bool proj = strcmp(what, "project") == 0;
    if (proj != (slash != NULL)) {
        fprintf(stderr, "dsec %s: \"%s\": expected %s\n", what, arg,
                proj ? "TENANT/PROJECT (a project names its tenant)" : "a tenant name without '/'");
        return -1;
    }
    size_t len = slash ? (size_t)(slash - arg) : strlen(arg);
    if (len >= tn) {
        fprintf(stderr, "dsec %s: tenant name in \"%s\" is longer than %d characters\n", what, arg,
                DSEC_NAME_LEN_MAX);
        return -1;
    }
    memcpy(tenant, arg, len);
    tenant[len] = '\0';
    if (dsec_name_ok(tenant, DSEC_NAME_LEN_MAX) < 0) {
        fprintf(stderr, "dsec %s: tenant \"%s\": 1-64 characters of [A-Za-z0-9_-]\n", what, tenant);
        return -1;
    }
    *project = slash ? slash + 1 : NULL;
    if (*project && dsec_project_ok(*project, DSEC_NAME_LEN_MAX) < 0) {
        fprintf(stderr,
                "dsec %s: project \"%s\": names of [A-Za-z0-9_-] joined by '/', at most 64 "
                "characters and %d deep\n",
                what, *project, DSEC_PROJECT_DEPTH_MAX);
        return -1;
    }
    return 0;
}

static void fmt_pair(char *buf, size_t n, uint64_t used, uint64_t lim)
{
    if (lim)
        snprintf(buf, n, "%" PRIu64 "/%" PRIu64, used, lim);
    else
        snprintf(buf, n, "%" PRIu64 "/-", used);
}

static void print_row(const dsec_msg_quota *q)
{
    char name[2 * DSEC_NAME_LEN_MAX + 2], a[48], b[48], c[48];
    if (q->project && q->project[0])
        snprintf(name, sizeof name, "%s/%s", q->tenant, q->project);
    else
        snprintf(name, sizeof name, "%s", q->tenant);
    fmt_pair(a, sizeof a, q->used_sandboxes, q->sandboxes);
    fmt_pair(b, sizeof b, q->used_cpu_milli, q->cpu_milli);
    fmt_pair(c, sizeof c, q->used_memory_mb, q->memory_mb);
    printf("%-32s %-16s %-20s %-20s\n", name, a, b, c);
}

static void print_head(void)
{
    printf("%-32s %-16s %-20s %-20s\n", "NAME", "SANDBOXES", "CPU (milli)", "MEMORY (MiB)");
}

/* Send one request to the cell's quota actor; *reply is the caller's. */
static int ask(const char *what, const char *cell, const char *op, int type, const void *msg,
               dsec_msg **reply)
{
    const char *url = getenv("DSEC_URL");
    dsec_bus_opts bo = {.url = url && url[0] ? url : NULL, .name = "dsec-quota-cli"};
    dsec_bus *bus = NULL;
    dsec_err err;
    dsec_buf b;
    dsec_buf_init(&b);
    char subj[160];
    snprintf(subj, sizeof subj, DSEC_SUBJ_QUOTA, cell, op);
    dsec_hdr hdr = {.type = dsec_msg_type_name(type), .schema = DSEC_SCHEMA_VERSION};
    int rc = dsec_bus_connect(&bus, &bo, &err);
    if (rc == 0)
        rc = dsec_encode(&b, type, msg, &err);
    if (rc == 0)
        rc = dsec_bus_request_sync(bus, subj, &hdr, b.data, b.len, 5000, reply, &err);
    dsec_buf_release(&b);
    dsec_bus_free(bus);
    if (rc < 0) {
        if (err.code == DSEC_E_NO_RESPONDERS)
            fprintf(stderr,
                    "dsec %s: no quota actor answers for cell %s (is quota.enabled set and "
                    "the quota role running?)\n",
                    what, cell);
        else
            fprintf(stderr, "dsec %s: %s (%s)\n", what, err.msg, dsec_code_name(err.code));
        return -1;
    }
    const char *rtype = dsec_msg_type(*reply);
    if (rtype == NULL || strcmp(rtype, DSEC_TYPE_ERROR) == 0) {
        dsec_msg_error e;
        if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_ERROR, dsec_msg_data(*reply),
                        dsec_msg_len(*reply), &e, &err) == 0)
            fprintf(stderr, "dsec %s: %s (%s)\n", what, e.message, e.code);
        else
            fprintf(stderr, "dsec %s: the quota actor answered with an error (%s)\n", what,
                    dsec_msg_header(*reply, DSEC_HDR_ERROR_CODE)
                        ? dsec_msg_header(*reply, DSEC_HDR_ERROR_CODE)
                        : "unreadable");
        dsec_msg_free(*reply);
        *reply = NULL;
        return -1;
    }
    return 0;
}

static int run(const char *what, int argc, char **argv)
{
    static const struct option opts[] = {{"sandboxes", required_argument, 0, 's'},
                                         {"cpu", required_argument, 0, 'c'},
                                         {"memory", required_argument, 0, 'm'},
                                         {"cell", required_argument, 0, 'C'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    if (argc < 2)
        return usage(what);
    const char *verb = argv[1];
    const char *cell = getenv("DSEC_CELL");
    cell = cell && cell[0] ? cell : "local";
    dsec_msg_quota q = {0};
    int o;
    optind = 2;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        uint64_t *dst = o == 's'   ? &q.sandboxes
                        : o == 'c' ? &q.cpu_milli
                        : o == 'm' ? &q.memory_mb
                                   : NULL;
        if (dst != NULL) {
            if (!parse_u64(optarg, dst)) {
                fprintf(stderr, "dsec %s: --%s \"%s\": expected a whole number\n", what,
                        o == 's'   ? "sandboxes"
                        : o == 'c' ? "cpu"
                                   : "memory",
                        optarg);
                return 2;
            }
        } else if (o == 'C') {
            cell = optarg;
        } else {
            return usage(what);
        }
    }
    if (dsec_name_ok(cell, DSEC_NAME_LEN_MAX) < 0) {
        fprintf(stderr, "dsec %s: cell \"%s\" is not a valid name\n", what, cell);
        return 2;
    }
    int nargs = argc - optind;
    char **args = argv + optind;
    char tenant[DSEC_NAME_LEN_MAX + 1];
    dsec_msg *reply = NULL;
    dsec_err err;
    if (strcmp(verb, "ls") == 0) {
        if (nargs > 1)
            return usage(what);
        dsec_msg_quota_list req = {0};
        if (nargs == 1) {
            if (dsec_name_ok(args[0], DSEC_NAME_LEN_MAX) < 0) {
                fprintf(stderr, "dsec %s: tenant \"%s\": 1-64 characters of [A-Za-z0-9_-]\n", what,
                        args[0]);
                return 2;
            }
            req.tenant = args[0];
        }
        if (ask(what, cell, "list", DSEC_MSG_QUOTA_LIST, &req, &reply) < 0)
            return 1;
        dsec_msg_quota_list out;
        if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_QUOTA_LIST, dsec_msg_data(reply),
                        dsec_msg_len(reply), &out, &err) < 0) {
            fprintf(stderr, "dsec %s: unreadable answer: %s\n", what, err.msg);
            dsec_msg_free(reply);
            return 1;
        }
        bool proj = strcmp(what, "project") == 0;
        print_head();
        const dsec_msg_quota *items = out.items.items;
        for (uint32_t i = 0; i < out.items.n; i++)
            if (proj == (items[i].project != NULL && items[i].project[0] != '\0'))
                print_row(&items[i]);
        dsec_msg_free(reply);
        return 0;
    }
    bool set = strcmp(verb, "set") == 0, rm = strcmp(verb, "rm") == 0,
         get = strcmp(verb, "get") == 0;
    if ((!set && !rm && !get) || nargs != 1)
        return usage(what);
    if (split_path(what, args[0], tenant, sizeof tenant, &q.project) < 0)
        return 2;
    q.tenant = tenant;
    q.remove = rm;
    if (ask(what, cell, get ? "get" : "set", DSEC_MSG_QUOTA, &q, &reply) < 0)
        return 1;
    dsec_msg_quota out;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_QUOTA, dsec_msg_data(reply), dsec_msg_len(reply),
                    &out, &err) < 0) {
        fprintf(stderr, "dsec %s: unreadable answer: %s\n", what, err.msg);
        dsec_msg_free(reply);
        return 1;
    }
    if (rm) {
        printf("removed %s %s\n", what, args[0]);
    } else {
        print_head();
        print_row(&out);
    }
    dsec_msg_free(reply);
    return 0;
}

int dsec_cli_tenant(int argc, char **argv)
{
    return run("tenant", argc, argv);
}

int dsec_cli_project(int argc, char **argv)
{
    return run("project", argc, argv);
}
