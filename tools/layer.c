/* layer.c - `dsec layer` (build, push, ls, rm) and `dsec env` (create, show, ls): layers and
 * environments in a registry. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsec/alloc.h"
#include "dsec/image.h"
#include "dsec/layers.h"
#include "tools/cli.h"

#define MAX_ITEMS 256

/*
 * The registry is a directory: --registry DIR, else $DSEC_LAYERS, else
 * <state>/layers where <state> is --state-dir or the cell's default state
 * directory ("./state", as `dsec up` uses). A registry that starts with
 * nats:// is the cell's JetStream registry on that bus
 * (nats://HOST:PORT[?bucket=NAME], bucket DSEC_LAYERS by default, as the
 * cell's layers.bucket).
 */
void dsec_cli_registry_close(dsec_layer_registry *r)
{
    dsec_layer_registry_free(r); /* a JetStream registry closes its own connection */
}

static const char *registry_dir(const char *opt, const char *state, char *buf, size_t n)
{
    if (opt != NULL)
        return opt;
    const char *env = getenv("DSEC_LAYERS");
    if (env != NULL && env[0] != '\0')
        return env;
    snprintf(buf, n, "%s/layers", state != NULL ? state : "./state");
    return buf;
}

static int layer_usage(void)
{
    fprintf(stderr,
            "usage: dsec layer build <dir|tarball> --name NAME:VERSION [--format erofs|dir]\n"
            "                        [--exclude PATTERN]... [--registry DIR]\n"
            "       dsec layer push <blob-file> --name NAME:VERSION --format erofs|dir [--registry "
            "DIR]\n"
            "       dsec layer ls [--registry DIR]\n"
            "       dsec layer rm <NAME:VERSION|sha256:DIGEST> [--registry DIR]\n"
            "The registry is --registry DIR, else $DSEC_LAYERS, else --state-dir DIR/layers\n"
            "(default ./state/layers); nats://HOST:PORT[?bucket=NAME] is a cell's JetStream\n"
            "registry. build and push print the layer's digest.\n"
            "examples:\n"
            "  dsec layer build ./rootfs --name busybox:1\n"
            "  dsec layer build src.tar.gz --name tools:2 --format dir --exclude '*.pyc'\n"
            "  dsec layer rm tools:2\n");
    return 2;
}

static int env_usage(void)
{
    fprintf(
        stderr,
        "usage: dsec env create NAME:VERSION --layer NAME:VERSION|sha256:DIGEST...\n"
        "                       [--env KEY=VALUE]... [--workdir DIR] [--user USER] [--registry "
        "DIR]\n"
        "       dsec env show NAME:VERSION [--registry DIR]\n"
        "       dsec env ls [--registry DIR]\n"
        "Layers are given lowest first.\n"
        "example:\n"
        "  dsec env create python:3 --layer debian:12 --layer py-tools:12 --env LANG=C.UTF-8\n");
    return 2;
}

typedef struct opts {
    const char *registry, *state, *name, *format, *workdir, *user;
    const char *exclude[MAX_ITEMS], *layers[MAX_ITEMS], *vars[MAX_ITEMS];
    size_t nexclude, nlayers, nvars;
} opts;

static bool push_item(const char **v, size_t *n, const char *s, const char *what)
{
    if (*n >= MAX_ITEMS) {
        fprintf(stderr, "dsec: at most %d %s\n", MAX_ITEMS, what);
        return false;
    }
    v[(*n)++] = s;
    return true;
}

/* Parse the options shared by every layer/env subcommand; -1 usage error, 1 --help. */
static int parse(int argc, char **argv, opts *o)
{
    static const struct option lo[] = {{"registry", required_argument, 0, 'r'},
                                       {"state-dir", required_argument, 0, 's'},
                                       {"name", required_argument, 0, 'n'},
                                       {"format", required_argument, 0, 'f'},
                                       {"exclude", required_argument, 0, 'x'},
                                       {"layer", required_argument, 0, 'l'},
                                       {"env", required_argument, 0, 'e'},
                                       {"workdir", required_argument, 0, 'w'},
                                       {"user", required_argument, 0, 'u'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
    memset(o, 0, sizeof *o);
    optind = 1;
    int ch;
    while ((ch = getopt_long(argc, argv, "r:s:n:f:x:l:e:w:u:h", lo, NULL)) != -1) {
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
            o->workdir = optarg;
            break;
        case 'u':
            o->user = optarg;
            break;
        case 'x':
            if (!push_item(o->exclude, &o->nexclude, optarg, "--exclude patterns"))
                return -1;
            break;
        case 'l':
            if (!push_item(o->layers, &o->nlayers, optarg, "--layer options"))
                return -1;
            break;
        case 'e':
            if (!push_item(o->vars, &o->nvars, optarg, "--env options"))
                return -1;
            break;
        case 'h':
            return 1;
        default:
            return -1;
        }
    }
    return 0;
}

int dsec_cli_registry_open(const char *registry, const char *state, dsec_layer_registry **r,
                           const char **where)
{
    static char buf[4096];
    *where = registry_dir(registry, state, buf, sizeof buf);
    dsec_err err;
    if (dsec_layer_registry_open(r, *where, &err) < 0) {
        fprintf(stderr, "dsec: %s\n", err.msg);
        return 2;
    }
    return 0;
}

static int open_registry(const opts *o, dsec_layer_registry **r, const char **dir)
{
    return dsec_cli_registry_open(o->registry, o->state, r, dir);
}

/* Store the blob file under name and print its digest. */
static int push_and_tag(dsec_layer_registry *r, const char *blob, dsec_layer_format fmt,
                        const char *name, const dsec_digest digest)
{
    dsec_err err;
    if (dsec_layer_registry_put(r, digest, fmt, blob, &err) < 0 ||
        dsec_layer_registry_tag_set(r, name, digest, &err) < 0) {
        fprintf(stderr, "dsec layer: %s\n", err.msg);
        return 1;
    }
    printf("%s\n", digest);
    return 0;
}

static int layer_build(const opts *o, const char *src)
{
    dsec_err err;
    dsec_layer_format fmt = DSEC_LAYER_EROFS;
    if (o->format != NULL && dsec_layer_format_parse(o->format, &fmt, &err) < 0) {
        fprintf(stderr, "dsec layer build: %s\n", err.msg);
        return 2;
    }
    if (o->name == NULL || !dsec_layer_name_valid(o->name)) {
        fprintf(stderr, "dsec layer build: --name NAME:VERSION is required and must be valid "
                        "(name of [a-z0-9.-] parts joined by '/', version of [A-Za-z0-9._-])\n");
        return 2;
    }
    dsec_layer_registry *r;
    const char *dir;
    int rc = open_registry(o, &r, &dir);
    if (rc != 0)
        return rc;
    /* build beside a directory registry so the copy into it stays on one
     * filesystem; a JetStream registry gets the blob from a temp dir */
    char work[4096], blob[4200];
    bool made = false;
    rc = 1;
    int n;
    if (strcmp(dsec_layer_registry_kind(r), "jetstream") == 0) {
        const char *tmp = getenv("TMPDIR");
        n = snprintf(work, sizeof work, "%s/dsec-layer.XXXXXX", tmp && tmp[0] ? tmp : "/var/tmp");
    } else {
        n = snprintf(work, sizeof work, "%s/#cli.XXXXXX", dir);
    }
    if (n < 0 || (size_t)n >= sizeof work) {
        fprintf(stderr, "dsec layer build: the path of a work directory in %s is too long\n", dir);
        goto out;
    }
    if (mkdtemp(work) == NULL) {
        fprintf(stderr, "dsec layer build: creating a work directory in %s: %s\n", dir,
                strerror(errno));
        goto out;
    }
    made = true;
    snprintf(blob, sizeof blob, "%s/blob", work);
    dsec_digest digest;
    if (dsec_layer_build(src, fmt, o->exclude, o->nexclude, blob, digest, &err) < 0) {
        fprintf(stderr, "dsec layer build: %s\n", err.msg);
        goto out;
    }
    rc = push_and_tag(r, blob, fmt, o->name, digest);
out:
    if (made) {
        unlink(blob); /* the registry holds its own copy */
        rmdir(work);
    }
    dsec_cli_registry_close(r);
    return rc;
}

static int layer_push(const opts *o, const char *file)
{
    dsec_err err;
    dsec_layer_format fmt;
    if (o->format == NULL) {
        fprintf(stderr, "dsec layer push: --format erofs|dir is required\n");
        return 2;
    }
    if (dsec_layer_format_parse(o->format, &fmt, &err) < 0) {
        fprintf(stderr, "dsec layer push: %s\n", err.msg);
        return 2;
    }
    if (o->name == NULL || !dsec_layer_name_valid(o->name)) {
        fprintf(stderr, "dsec layer push: --name NAME:VERSION is required and must be valid\n");
        return 2;
    }
    dsec_digest digest;
    if (dsec_digest_file(file, digest, &err) < 0) {
        fprintf(stderr, "dsec layer push: %s\n", err.msg);
        return 1;
    }
    dsec_layer_registry *r;
    const char *dir;
    int rc = open_registry(o, &r, &dir);
    if (rc != 0)
        return rc;
    rc = push_and_tag(r, file, fmt, o->name, digest);
    dsec_cli_registry_close(r);
    return rc;
}

static void human(uint64_t n, char *buf, size_t len)
{
    if (n >= (1u << 20))
        snprintf(buf, len, "%.1fM", (double)n / (1u << 20));
    else if (n >= 1024)
        snprintf(buf, len, "%.1fK", (double)n / 1024);
    else
        snprintf(buf, len, "%lluB", (unsigned long long)n);
}

static int layer_ls(const opts *o)
{
    dsec_layer_registry *r;
    const char *dir;
    int rc = open_registry(o, &r, &dir);
    if (rc != 0)
        return rc;
    dsec_layer_info *v;
    size_t n;
    dsec_err err;
    if (dsec_layer_registry_list(r, &v, &n, &err) < 0) {
        fprintf(stderr, "dsec layer ls: %s\n", err.msg);
        dsec_cli_registry_close(r);
        return 1;
    }
    /* which images hold each layer (a registry without image records has none) */
    dsec_image_info *im = NULL;
    size_t nim = 0;
    dsec_err ierr;
    if (dsec_image_list(r, &im, &nim, &ierr) < 0)
        nim = 0;
    printf("%-24s %-6s %8s %-71s %s\n", "NAME", "FORMAT", "SIZE", "DIGEST", "IMAGES");
    for (size_t i = 0; i < n; i++) {
        char sz[32];
        human(v[i].size, sz, sizeof sz);
        printf("%-24s %-6s %8s %s ", v[i].name != NULL ? v[i].name : "-",
               dsec_layer_format_name(v[i].format), sz, v[i].digest);
        int shown = 0;
        for (size_t k = 0; k < nim; k++)
            for (size_t j = 0; j < im[k].nlayers; j++)
                if (strcmp(im[k].layers[j].layer, v[i].digest) == 0) {
                    printf("%s%s", shown++ ? "," : "", im[k].ref);
                    break;
                }
        printf("%s\n", shown ? "" : "-");
    }
    dsec_image_infos_free(im, nim);
    dsec_layer_infos_free(v, n);
    dsec_cli_registry_close(r);
    return 0;
}

static int layer_rm(const opts *o, const char *what)
{
    dsec_layer_registry *r;
    const char *dir;
    int rc = open_registry(o, &r, &dir);
    if (rc != 0)
        return rc;
    dsec_err err;
    if (dsec_layer_registry_remove(r, what, &err) < 0) {
        fprintf(stderr, "dsec layer rm: %s\n", err.msg);
        rc = err.code == DSEC_E_INVALID ? 2 : 1;
    }
    dsec_cli_registry_close(r);
    return rc;
}

int dsec_cli_layer(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        if (argc >= 2) {
            layer_usage();
            return 0;
        }
        return layer_usage();
    }
    const char *sub = argv[1];
    opts o;
    int p = parse(argc - 1, argv + 1, &o);
    if (p != 0) {
        layer_usage();
        return p > 0 ? 0 : 2;
    }
    int nargs = argc - 1 - optind;
    char **args = argv + 1 + optind;
    if (strcmp(sub, "build") == 0 && nargs == 1)
        return layer_build(&o, args[0]);
    if (strcmp(sub, "push") == 0 && nargs == 1)
        return layer_push(&o, args[0]);
    if (strcmp(sub, "ls") == 0 && nargs == 0)
        return layer_ls(&o);
    if (strcmp(sub, "rm") == 0 && nargs == 1)
        return layer_rm(&o, args[0]);
    if (strcmp(sub, "build") != 0 && strcmp(sub, "push") != 0 && strcmp(sub, "ls") != 0 &&
        strcmp(sub, "rm") != 0)
        fprintf(stderr, "dsec layer: unknown subcommand \"%s\"\n", sub);
    return layer_usage();
}

/* ---- environments ------------------------------------------------------------------------- */

static int env_create(const opts *o, const char *name)
{
    if (!dsec_layer_name_valid(name)) {
        fprintf(stderr, "dsec env create: \"%s\" is not a NAME:VERSION\n", name);
        return 2;
    }
    if (o->nlayers == 0) {
        fprintf(stderr, "dsec env create: at least one --layer is required\n");
        return 2;
    }
    dsec_layer_registry *r;
    const char *dir;
    int rc = open_registry(o, &r, &dir);
    if (rc != 0)
        return rc;
    dsec_digest digests[MAX_ITEMS];
    char *layers[MAX_ITEMS];
    dsec_err err;
    for (size_t i = 0; i < o->nlayers; i++) {
        if (dsec_layer_registry_resolve(r, o->layers[i], digests[i], &err) < 0) {
            fprintf(stderr, "dsec env create: --layer %s: %s\n", o->layers[i], err.msg);
            dsec_cli_registry_close(r);
            return 1;
        }
        layers[i] = digests[i];
    }
    dsec_env env = {
        .name = (char *)name,
        .layers = layers,
        .formats = NULL, /* filled from the registry */
        .nlayers = o->nlayers,
        .vars = (char **)o->vars,
        .nvars = o->nvars,
        .workdir = (char *)o->workdir,
        .user = (char *)o->user,
    };
    if (dsec_layer_registry_env_put(r, &env, &err) < 0) {
        fprintf(stderr, "dsec env create: %s\n", err.msg);
        rc = err.code == DSEC_E_INVALID ? 2 : 1;
    } else {
        printf("%s\n", name);
    }
    dsec_cli_registry_close(r);
    return rc;
}

static int env_show(const opts *o, const char *name)
{
    dsec_layer_registry *r;
    const char *dir;
    int rc = open_registry(o, &r, &dir);
    if (rc != 0)
        return rc;
    dsec_env *e;
    dsec_err err;
    if (dsec_layer_registry_env_get(r, name, &e, &err) < 0) {
        fprintf(stderr, "dsec env show: %s\n", err.msg);
        dsec_cli_registry_close(r);
        return err.code == DSEC_E_INVALID ? 2 : 1;
    }
    char *doc;
    size_t len;
    if (dsec_env_encode(e, &doc, &len, &err) < 0) {
        fprintf(stderr, "dsec env show: %s\n", err.msg);
        rc = 1;
    } else {
        fwrite(doc, 1, len, stdout);
        dsec_free(doc);
    }
    dsec_env_free(e);
    dsec_cli_registry_close(r);
    return rc;
}

static int env_ls(const opts *o)
{
    dsec_layer_registry *r;
    const char *dir;
    int rc = open_registry(o, &r, &dir);
    if (rc != 0)
        return rc;
    char **names;
    size_t n;
    dsec_err err;
    if (dsec_layer_registry_env_list(r, &names, &n, &err) < 0) {
        fprintf(stderr, "dsec env ls: %s\n", err.msg);
        dsec_cli_registry_close(r);
        return 1;
    }
    printf("%-24s %6s %s\n", "NAME", "LAYERS", "WORKDIR USER");
    for (size_t i = 0; i < n; i++) {
        dsec_env *e;
        if (dsec_layer_registry_env_get(r, names[i], &e, &err) < 0) {
            printf("%-24s %6s (%s)\n", names[i], "?", err.msg);
            continue;
        }
        printf("%-24s %6zu %s %s\n", names[i], e->nlayers, e->workdir, e->user);
        dsec_env_free(e);
    }
    dsec_layer_names_free(names, n);
    dsec_cli_registry_close(r);
    return 0;
}

int dsec_cli_env(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        if (argc >= 2) {
            env_usage();
            return 0;
        }
        return env_usage();
    }
    const char *sub = argv[1];
    opts o;
    int p = parse(argc - 1, argv + 1, &o);
    if (p != 0) {
        env_usage();
        return p > 0 ? 0 : 2;
    }
    int nargs = argc - 1 - optind;
    char **args = argv + 1 + optind;
    if (strcmp(sub, "create") == 0 && nargs == 1)
        return env_create(&o, args[0]);
    if (strcmp(sub, "show") == 0 && nargs == 1)
        return env_show(&o, args[0]);
    if (strcmp(sub, "ls") == 0 && nargs == 0)
        return env_ls(&o);
    if (strcmp(sub, "create") != 0 && strcmp(sub, "show") != 0 && strcmp(sub, "ls") != 0)
        fprintf(stderr, "dsec env: unknown subcommand \"%s\"\n", sub);
    return env_usage();
}
