/* image.c - `dsec image` (import, ls, inspect, rm): OCI and Docker images as environments. */
#define _GNU_SOURCE
#include "dsec/image.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "dsec/layers.h"
#include "tools/cli.h"
#include "tools/image-pull.h"

typedef struct opts {
    const char *registry, *state, *name, *format, *work;
    bool json;
} opts;

static int usage(void)
{
    fprintf(
        stderr,
        "usage: dsec image import PATH [--name REF] [--format erofs|dir] [--work-dir DIR]\n"
        "       dsec image ls [--json]\n"
        "       dsec image inspect REF|sha256:DIGEST [--json]\n"
        "       dsec image rm REF\n"
        "       dsec image pull HOST[:PORT]/REPO[:TAG|@sha256:...] (dsec image pull --help)\n"
        "       dsec image build -f Dockerfile --name REF CONTEXT (dsec image build --help)\n"
        "       (each takes --registry DIR|nats://HOST:PORT[?bucket=NAME] and --state-dir DIR,\n"
        "        as dsec layer does)\n"
        "PATH is a `docker save` archive, an OCI image layout directory or an OCI archive.\n"
        "The image becomes an environment named by its reference: create(env=REF).\n"
        "examples:\n"
        "  docker save swe/task-123:latest -o task.tar && dsec image import task.tar\n"
        "  dsec image import ./oci-dir --name 127.0.0.1:5000/swe/task:1\n");
    return 2;
}

static int parse(int argc, char **argv, opts *o)
{
    static const struct option lo[] = {
        {"registry", required_argument, 0, 'r'}, {"state-dir", required_argument, 0, 's'},
        {"name", required_argument, 0, 'n'},     {"format", required_argument, 0, 'f'},
        {"work-dir", required_argument, 0, 'w'}, {"json", no_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'},           {0, 0, 0, 0}};
    memset(o, 0, sizeof *o);
    optind = 1;
    int ch;
    while ((ch = getopt_long(argc, argv, "r:s:n:f:w:jh", lo, NULL)) != -1) {
        switch (ch) {
        case 'r':
            o->registry = optarg;
            break;
        case 's':
            o->state = optarg;
            break;
        case 'n':
            o->name = optarg;
            break;
        case 'f':
            o->format = optarg;
            break;
        case 'w':
            o->work = optarg;
            break;
        case 'j':
            o->json = true;
            break;
        case 'h':
            return 1;
        default:
            return -1;
        }
    }
    return 0;
}

static void print_line(void *arg, const char *line)
{
    (void)arg;
    fprintf(stderr, "%s\n", line);
}

static void print_json(const dsec_image_info *i)
{
    printf("{\"ref\":");
    dsec_cli_json_str(stdout, i->ref);
    printf(",\"env\":");
    dsec_cli_json_str(stdout, i->env);
    printf(",\"manifest\":\"%s\",\"config\":\"%s\",\"created\":%lld,\"layers\":[", i->manifest,
           i->config, (long long)i->created_unix);
    for (size_t k = 0; k < i->nlayers; k++)
        printf("%s{\"diff_id\":\"%s\",\"layer\":\"%s\",\"size\":%llu}", k ? "," : "",
               i->layers[k].diff_id, i->layers[k].layer, (unsigned long long)i->layers[k].size);
    printf("],\"cmd\":[");
    for (size_t k = 0; k < i->ncmd; k++) {
        printf("%s", k ? "," : "");
        dsec_cli_json_str(stdout, i->cmd[k]);
    }
    printf("],\"labels\":[");
    for (size_t k = 0; k < i->nlabels; k++) {
        printf("%s", k ? "," : "");
        dsec_cli_json_str(stdout, i->labels[k]);
    }
    printf("]}");
}

static void print_text(const dsec_image_info *i)
{
    printf("ref       %s\nenv       %s\nmanifest  %s\nconfig    %s\n", i->ref, i->env, i->manifest,
           i->config);
    for (size_t k = 0; k < i->nlayers; k++)
        printf("layer     %s -> %s (%llu bytes)\n", i->layers[k].diff_id, i->layers[k].layer,
               (unsigned long long)i->layers[k].size);
    for (size_t k = 0; k < i->ncmd; k++)
        printf("cmd       %s\n", i->cmd[k]);
    for (size_t k = 0; k < i->nlabels; k++)
        printf("label     %s\n", i->labels[k]);
}

static int run(const char *sub, const opts *o, char **args, size_t nargs)
{
    dsec_layer_registry *r;
    const char *where;
    int rc = dsec_cli_registry_open(o->registry, o->state, &r, &where);
    if (rc != 0)
        return rc;
    dsec_err err;
    dsec_image_info *i = NULL, *v = NULL;
    size_t n = 0;
    rc = 0;
    if (strcmp(sub, "import") == 0) {
        dsec_image_import_opts io = {.ref = o->name, .work_dir = o->work, .progress = print_line};
        if ((o->format != NULL && dsec_layer_format_parse(o->format, &io.format, &err) < 0) ||
            dsec_image_import(r, args[0], &io, &i, &err) < 0)
            rc = 1;
        else {
            size_t reused = 0;
            for (size_t k = 0; k < i->nlayers; k++)
                reused += i->layers[k].reused;
            printf("%s\n", i->ref);
            fprintf(stderr, "imported %s: %zu layers (%zu reused), environment %s in %s\n", i->ref,
                    i->nlayers, reused, i->env, where);
        }
    } else if (strcmp(sub, "ls") == 0) {
        if (dsec_image_list(r, &v, &n, &err) < 0)
            rc = 1;
        if (rc == 0 && o->json) {
            printf("[");
            for (size_t k = 0; k < n; k++) {
                printf("%s", k ? "," : "");
                print_json(&v[k]);
            }
            printf("]\n");
        } else if (rc == 0) {
            printf("%-48s %-6s %s\n", "REF", "LAYERS", "MANIFEST");
            for (size_t k = 0; k < n; k++)
                printf("%-48s %-6zu %s\n", v[k].ref, v[k].nlayers, v[k].manifest);
        }
    } else if (strcmp(sub, "inspect") == 0) {
        if (dsec_image_get(r, args[0], &i, &err) < 0)
            rc = 1;
        else if (o->json)
            print_json(i), printf("\n");
        else
            print_text(i);
    } else if (dsec_image_remove(r, args[0], &err) < 0) {
        rc = 1;
    }
    if (rc != 0) {
        char what[32];
        snprintf(what, sizeof what, "image %s", sub);
        rc = dsec_cli_fail(what, &err); /* names the code; 2 for bad input */
    }
    dsec_image_info_free(i);
    dsec_image_infos_free(v, n);
    dsec_cli_registry_close(r);
    return rc;
}

int dsec_cli_image(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        int rc = usage();
        return argc >= 2 ? 0 : rc;
    }
    const char *sub = argv[1];
    if (strcmp(sub, "build") == 0)
        return dsec_cli_image_build(argc - 1, argv + 1);
    if (strcmp(sub, "pull") == 0)
        return dsec__cli_image_pull(argc - 1, argv + 1);
    opts o;
    int p = parse(argc - 1, argv + 1, &o);
    if (p != 0) {
        usage();
        return p > 0 ? 0 : 2;
    }
    size_t nargs = (size_t)(argc - 1 - optind);
    char **args = argv + 1 + optind;
    bool one = strcmp(sub, "import") == 0 || strcmp(sub, "inspect") == 0 || strcmp(sub, "rm") == 0;
    if ((one && nargs == 1) || (strcmp(sub, "ls") == 0 && nargs == 0))
        return run(sub, &o, args, nargs);
    if (!one && strcmp(sub, "ls") != 0)
        fprintf(stderr, "dsec image: unknown subcommand \"%s\"\n", sub);
    return usage();
}
