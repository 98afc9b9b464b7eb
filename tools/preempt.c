/* preempt.c - dsec subcommands for preemption and the trajectory log: `dsec job` and `dsec traj
 * show`. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/traj.h"
#include "bus/bus.h"
#include "dsec/alloc.h"
#include "dsec/client.h"
#include "dsec/job.h"
#include "tools/cli.h"

static bool parse_num(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (s[0] == '\0' || s[0] == '-' || *end != '\0' || errno != 0)
        return false;
    *out = v;
    return true;
}

struct play {
    uint64_t checkpoint_ms;
    bool refuse;
};

static int play_checkpoint(dsec_job *job, const dsec_job_reclaim *r, void *ud)
{
    struct play *p = ud;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    uint64_t now_ns = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
    printf("reclaim %s: %" PRIu64 " milli-CPU, %" PRIu64 " MB within %" PRId64 " ms; %s\n",
           r->req_id, r->cpu_milli, r->memory_mb, (int64_t)(r->deadline_ns - now_ns) / 1000000,
           p->refuse ? "refusing (the arbiter will force it)" : "checkpointing");
    fflush(stdout);
    struct timespec ts = {(time_t)(p->checkpoint_ms / 1000),
                          (long)(p->checkpoint_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    if (!p->refuse) {
        printf("reclaim %s: checkpoint done, releasing\n", r->req_id);
        fflush(stdout);
    }
    return p->refuse ? -1 : 0;
}

/* dsec job NAME --cell C --node N... --units K --cpu MILLI --memory MB ... */
int dsec_cli_job(int argc, char **argv)
{
    static const char *use =
        "NAME --cell CELL --node NODE [--node NODE]... [--units K] [--cpu MILLI] [--memory MB]\n"
        "       [--class job|batch] [--priority P] [--checkpoint-ms MS] [--grace-ms MS] "
        "[--refuse]\n"
        "Plays a preemptible job: holds K units (round-robin over the nodes) until Ctrl-C;\n"
        "answers each reclaim by acknowledging, sleeping the checkpoint time and releasing\n"
        "(or, with --refuse, by never releasing, so the arbiter forces it).";
    static const struct option opts[] = {
        {"cell", required_argument, 0, 'c'},     {"node", required_argument, 0, 'n'},
        {"units", required_argument, 0, 'u'},    {"cpu", required_argument, 0, 'p'},
        {"memory", required_argument, 0, 'm'},   {"class", required_argument, 0, 'C'},
        {"priority", required_argument, 0, 'P'}, {"checkpoint-ms", required_argument, 0, 'k'},
        {"grace-ms", required_argument, 0, 'g'}, {"refuse", no_argument, 0, 'r'},
        {"help", no_argument, 0, 'h'},           {0, 0, 0, 0}};
    const char *cell = NULL, *cls = "job", *nodes[64];
    size_t nnodes = 0;
    uint64_t units = 1, cpu = 1000, mem = 512, ckpt = 1000, grace = 0, prio_u = 0;
    int64_t prio = 0;
    struct play play = {0};
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        bool ok = true;
        switch (o) {
        case 'c':
            cell = optarg;
            break;
        case 'n':
            if (nnodes < 64)
                nodes[nnodes++] = optarg;
            break;
        case 'u':
            ok = parse_num(optarg, &units) && units > 0 && units <= 4096;
            break;
        case 'p':
            ok = parse_num(optarg, &cpu);
            break;
        case 'm':
            ok = parse_num(optarg, &mem);
            break;
        case 'C':
            cls = optarg;
            break;
        case 'P':
            if (optarg[0] == '-')
                ok = parse_num(optarg + 1, &prio_u), prio = -(int64_t)prio_u;
            else
                ok = parse_num(optarg, &prio_u), prio = (int64_t)prio_u;
            break;
        case 'k':
            ok = parse_num(optarg, &ckpt);
            break;
        case 'g':
            ok = parse_num(optarg, &grace);
            break;
        case 'r':
            play.refuse = true;
            break;
        case 'h':
            printf("usage: dsec job %s\n", use);
            return 0;
        default:
            ok = false;
        }
        if (!ok) {
            fprintf(stderr, "usage: dsec job %s\n", use);
            return 2;
        }
    }
    if (optind + 1 != argc || cell == NULL || nnodes == 0) {
        fprintf(stderr, "usage: dsec job %s\n", use);
        return 2;
    }
    play.checkpoint_ms = ckpt;
    dsec_job_unit *u = dsec_calloc(units, sizeof *u);
    if (u == NULL)
        return 1;
    for (uint64_t i = 0; i < units; i++)
        u[i] = (dsec_job_unit){.node = nodes[i % nnodes], .cpu_milli = cpu, .memory_mb = mem};
    dsec_cli_block_signals();
    dsec_client *c = NULL;
    dsec_err err;
    if (dsec_client_connect(&c, NULL, &err) < 0) {
        fprintf(stderr, "dsec job: cannot reach the bus: %s\n", err.msg);
        dsec_free(u);
        return 1;
    }
    dsec_job_spec spec = {.name = argv[optind],
                          .cell = cell,
                          .cls = cls,
                          .priority = prio,
                          .checkpoint_ms = ckpt,
                          .grace_ms = grace,
                          .units = u,
                          .nunits = units};
    dsec_job *job = NULL;
    int rc = 0;
    if (dsec_job_start(c, &spec, play_checkpoint, &play, &job, &err) < 0) {
        fprintf(stderr, "dsec job: %s (%s)\n", err.msg, dsec_code_name(err.code));
        rc = 1;
    } else {
        printf("job %s holds %" PRIu64 " unit(s) of %" PRIu64 " milli-CPU and %" PRIu64
               " MB in cell %s; Ctrl-C releases and stops\n",
               argv[optind], units, cpu, mem, cell);
        fflush(stdout);
        dsec_cli_wait_for_signal();
        dsec_job_stats st;
        dsec_job_stats_get(job, &st);
        printf("job %s: %" PRIu64 " reclaim(s), %" PRIu64 " released, %" PRIu64
               " unit(s) forced; releasing %zu unit(s)\n",
               argv[optind], st.reclaims, st.released, st.forced, st.units_held);
        dsec_job_free(job, true);
    }
    dsec_client_free(c);
    dsec_free(u);
    return rc;
}

static void print_bytes(const char *label, const dsec_record_bytes *d)
{
    if (d->len == 0)
        return;
    printf("    %s: ", label);
    size_t n = d->len < 200 ? d->len : 200;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = d->data[i];
        if (ch == '\n')
            fputs("\\n", stdout);
        else if (ch < 0x20 || ch == 0x7f)
            printf("\\x%02x", ch);
        else
            putchar(ch);
    }
    if (d->len > n)
        printf("... (%zu bytes)", d->len);
    putchar('\n');
}

static int show_one(const dsec_traj_record *r, void *ud)
{
    printf("step %" PRIu64 "  %s  exit %" PRId64 "%s  %" PRIu64 " us  ", r->step, r->sandbox_id,
           r->exit_code, r->timed_out ? " (timed out)" : "", r->duration_us);
    for (size_t i = 0; i < r->n_argv; i++)
        printf("%s%s", i ? " " : "", r->argv[i]);
    putchar('\n');
    print_bytes("stdout", &r->stdout_data);
    print_bytes("stderr", &r->stderr_data);
    (void)ud;
    return 0;
}

/* dsec traj show ROLLOUT */
int dsec_cli_traj(int argc, char **argv)
{
    if (argc != 3 || strcmp(argv[1], "show") != 0) {
        fprintf(stderr,
                "usage: dsec traj show ROLLOUT\n"
                "Prints the rollout's trajectory log: each logged step, its command and result.\n");
        return 2;
    }
    const char *url = getenv("DSEC_URL");
    dsec_bus_opts bo = {.url = url && url[0] ? url : NULL, .name = "dsec-traj"};
    dsec_bus *bus = NULL;
    dsec_traj *t = NULL;
    dsec_err err;
    int rc = 1;
    size_t n = 0;
    if (dsec_bus_connect(&bus, &bo, &err) < 0 || dsec_traj_open(&t, bus, NULL, &err) < 0 ||
        dsec_traj_read(t, argv[2], show_one, NULL, &n, &err) < 0) {
        fprintf(stderr, "dsec traj: %s (%s)\n", err.msg, dsec_code_name(err.code));
        rc = err.code == DSEC_E_INVALID ? 2 : 1;
    } else {
        printf("%zu step(s) logged for rollout %s\n", n, argv[2]);
        rc = 0;
    }
    dsec_traj_close(t);
    dsec_bus_free(bus);
    return rc;
}
