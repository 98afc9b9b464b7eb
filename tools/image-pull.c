/* image-pull.c - `dsec image pull REF`: an image from an OCI distribution registry into a layer
 * registry. */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsec/alloc.h"
#include "dsec/image.h"
#include "tools/cli.h"
#include "tools/image-pull.h"

static int usage(void)
{
    fprintf(stderr,
            "usage: dsec image pull REF [--user U --password-stdin] [--auth-file F] [--ca-file F]\n"
            "                       [--plain-http] [--format erofs|dir] [--platform OS/ARCH]\n"
            "                       [--timeout SECONDS] [--registry "
            "DIR|nats://HOST:PORT[?bucket=NAME]]\n"
            "REF is HOST[:PORT]/PATH[:TAG|@sha256:HEX]. Credentials come from --user with the\n"
            "password on stdin, else from --auth-file or $DOCKER_CONFIG/config.json or\n"
            "~/.docker/config.json (\"auths\"). TLS is checked against --ca-file or the system's\n"
            "CAs; --plain-http speaks http:// (a local registry). The registry is --registry,\n"
            "else $DSEC_LAYERS, else ./state/layers (as dsec layer).\n"
            "example:\n"
            "  dsec image pull 127.0.0.1:5000/swe/task:1 --plain-http\n");
    return 2;
}

/* The password: stdin's first line, without its newline; dsec_malloc'd. */
static char *read_password(void)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t n = getline(&line, &cap, stdin);
    if (n < 0) {
        free(line);
        return NULL;
    }
    line[strcspn(line, "\r\n")] = '\0';
    char *pw = dsec_strdup(line);
    explicit_bzero(line, cap);
    free(line); /* getline's buffer comes from libc */
    return pw;
}

static void on_progress(void *arg, const char *line)
{
    (void)arg;
    fprintf(stderr, "%s\n", line);
}

static void print_info(const dsec_image_info *i)
{
    size_t reused = 0;
    for (size_t k = 0; k < i->nlayers; k++)
        reused += i->layers[k].reused;
    printf("pulled %s\n  manifest %s\n  config   %s\n  env      %s\n  layers   %zu (%zu already "
           "in the registry)\n",
           i->ref, i->manifest, i->config, i->env, i->nlayers, reused);
}

typedef struct cli_opts {
    dsec_image_pull_opts pull;
    const char *registry, *format;
    bool password_stdin;
} cli_opts;

/* -1 usage error. */
static int parse(int argc, char **argv, cli_opts *c)
{
    static const struct option lo[] = {
        {"user", required_argument, 0, 'u'},      {"password-stdin", no_argument, 0, 'P'},
        {"auth-file", required_argument, 0, 'a'}, {"ca-file", required_argument, 0, 'c'},
        {"plain-http", no_argument, 0, 'h'},      {"format", required_argument, 0, 'f'},
        {"registry", required_argument, 0, 'r'},  {"platform", required_argument, 0, 'p'},
        {"timeout", required_argument, 0, 't'},   {0, 0, 0, 0}};
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        char *end;
        switch (ch) {
        case 'u':
            c->pull.username = optarg;
            break;
        case 'P':
            c->password_stdin = true;
            break;
        case 'a':
            c->pull.auth_file = optarg;
            break;
        case 'c':
            c->pull.ca_file = optarg;
            break;
        case 'h':
            c->pull.plain_http = true;
            break;
        case 'f':
            c->format = optarg;
            break;
        case 'r':
            c->registry = optarg;
            break;
        case 'p':
            c->pull.import.platform = optarg;
            break;
        case 't':
            c->pull.timeout_s = (unsigned)strtoul(optarg, &end, 10);
            if (*end != '\0' || c->pull.timeout_s == 0 || optarg[0] == '-') {
                fprintf(stderr, "dsec: --timeout wants a positive number of seconds, not %s\n",
                        optarg);
                return -1;
            }
            break;
        default:
            return -1;
        }
    }
    if (optind != argc - 1)
        return -1;
    if (c->password_stdin && c->pull.username == NULL) {
        fprintf(stderr, "dsec: --password-stdin needs --user\n");
        return -1;
    }
    return 0;
}

int dsec__cli_image_pull(int argc, char **argv)
{
    cli_opts c = {0};
    if (parse(argc, argv, &c) < 0)
        return usage();
    const char *ref = argv[optind];
    dsec_err err = {0};
    if (c.format != NULL && dsec_layer_format_parse(c.format, &c.pull.import.format, &err) < 0) {
        fprintf(stderr, "dsec: %s\n", err.msg);
        return 2;
    }
    char *pw = NULL;
    if (c.password_stdin && (pw = read_password()) == NULL) {
        fprintf(stderr, "dsec: --password-stdin: no password on stdin\n");
        return 2;
    }
    c.pull.password = pw;
    c.pull.import.progress = on_progress;
    dsec_layer_registry *r = NULL;
    dsec_image_info *info = NULL;
    const char *where;
    int rc = dsec_cli_registry_open(c.registry, NULL, &r, &where) != 0 ? -1 : 0; /* it says why */
    if (rc == 0 && (rc = dsec_image_pull(r, ref, &c.pull, &info, &err)) < 0)
        fprintf(stderr, "dsec image pull: %s: %s (%s)\n", ref, err.msg, dsec_code_name(err.code));
    else if (rc == 0)
        print_info(info);
    dsec_image_info_free(info);
    dsec_cli_registry_close(r);
    if (pw != NULL)
        explicit_bzero(pw, strlen(pw));
    dsec_free(pw);
    return rc < 0 ? 1 : 0;
}
