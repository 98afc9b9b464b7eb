/* dsec.c - the dsec command-line tool: dispatch `dsec <command> ...` to its subcommand. */
#include <stdio.h>
#include <string.h>

#include "tools/cli.h"

/* tools/layer.c (to move into tools/cli.h) */

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} command;

static const command commands[] = {
    {"up", dsec_cli_up, "run an embedded one-node cell in the foreground"},
    {"create", dsec_cli_create, "create a sandbox; prints its id"},
    {"exec", dsec_cli_exec, "run a command in a sandbox: dsec exec [-d|-it] ID -- CMD..."},
    {"ps", dsec_cli_ps, "list a sandbox's background processes (dsec exec -d)"},
    {"attach", dsec_cli_attach, "follow a background process's output: dsec attach [-i] ID HANDLE"},
    {"session", dsec_cli_session,
     "start a persistent shell session: dsec session ID (then exec --session)"},
    {"kill", dsec_cli_kill, "signal a background process: dsec kill ID HANDLE [-s SIG]"},
    {"call", dsec_cli_call,
     "run one function call in a fresh sandbox: dsec call -- python3 -c CODE"},
    {"cp", dsec_cli_cp, "copy a file into or out of a sandbox (ID:/path)"},
    {"ls", dsec_cli_ls_any,
     "list this tenant's sandboxes (--label K=V, --state, --type), or a directory: dsec ls ID "
     "PATH"},
    {"watch", dsec_cli_watch,
     "print a directory's changes as they happen: dsec watch ID PATH [-r]"},
    {"files", dsec_cli_files,
     "make directories, stat, rename, remove in a sandbox: dsec files mkdir|stat|mv|rm ID PATH..."},
    {"fork", dsec_cli_fork, "branch a sandbox into N children: dsec fork ID -n N"},
    {"snapshot", dsec_cli_snapshot,
     "publish a container's state as an environment: dsec snapshot ID NAME:V"},
    {"net", dsec_cli_net,
     "change a sandbox's network policy, watch network alerts: dsec net set ID ENTRY..."},
    {"pause", dsec_cli_simple_op, "pause sandboxes"},
    {"resume", dsec_cli_simple_op, "resume sandboxes"},
    {"rm", dsec_cli_rm,
     "destroy sandboxes: dsec rm ID..., or every match: dsec rm --label K=V --yes"},
    {"events", dsec_cli_events,
     "follow this tenant's sandbox lifecycle events: dsec events [--json]"},
    {"status", dsec_cli_simple_op, "show a sandbox's type, state and node"},
    {"ttl", dsec_cli_ttl, "make a sandbox end SECONDS from now: dsec ttl ID SECONDS"},
    {"top", dsec_cli_top, "show the live cell: nodes, capacity, sandboxes, rates"},
    {"trace", dsec_cli_trace, "show the hops of a recent request: dsec trace TRACE_ID"},
    {"decode", dsec_cli_decode, "print a msgpack payload from stdin as JSON"},
    {"demo", dsec_cli_demo, "run the sample rollout workload on an embedded cell"},
    {"job", dsec_cli_job, "play a preemptible job: hold capacity, answer reclaims"},
    {"traj", dsec_cli_traj, "print a rollout's trajectory log: dsec traj show ROLLOUT"},
    {"layer", dsec_cli_layer,
     "build, push, list and remove layers: dsec layer build DIR --name N:V"},
    {"image", dsec_cli_image,
     "import, pull, build, list, inspect and remove images: dsec image import task.tar"},
    {"env", dsec_cli_env, "create, show and list environments (ordered layers + settings)"},
    {"tenant", dsec_cli_tenant,
     "set, show, list and remove tenants' quotas: dsec tenant set T --sandboxes N"},
    {"auth", dsec_cli_auth, "write the nats-server config confining each tenant, and credentials"},
    {"project", dsec_cli_project,
     "the same for projects, nested under their tenant: dsec project set T/P"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: dsec <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(out, "\n`dsec <command> --help` describes one command.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "dsec: unknown command \"%s\"\n", argv[1]);
    usage(stderr);
    return 2;
}
