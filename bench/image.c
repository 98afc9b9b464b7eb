/* image.c - `make bench S=image`: image pull+import from a local registry against skopeo +
 * mkfs.erofs, storage per task image, create latency from an image vs a native env. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "actors/cell.h"
#include "bench/common.h"
#include "dsec/alloc.h"
#include "dsec/client.h"
#include "dsec/image.h"
#include "dsec/layers.h"

/*
 * 1. import: a >= 200 MB image (the debootstrap bookworm tree that
 *    scripts/build-envs.sh makes for python:3, split into 4 layers by our own
 *    OCI layout writer, pushed with skopeo to docker-registry on loopback),
 *    pulled by dsec_image_pull, against the baseline `skopeo copy docker://
 *    oci:DIR` plus untar + mkfs.erofs of each layer, in the same run;
 * 2. storage: 20 task images over the same base, each with a small layer of
 *    its own: the layer registry's bytes against base + the 20 own layers;
 * 3. create -> first exec from the imported image vs the same tree built as
 *    one native layer (`dsec layer build` + `dsec env create`), through a cell.
 */

#define TASKS 20
#define CREATE_N 20
#define MAX_LAYERS 8

typedef struct blob {
    char digest[DSEC_DIGEST_STRLEN + 1], diff_id[DSEC_DIGEST_STRLEN + 1];
    unsigned long long size;
} blob;

static char root[64];
static pid_t reg_pid;
static int reg_port;

static const char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static const char *fmt(const char *f, ...)
{
    static char bufs[8][2048];
    static int next;
    char *b = bufs[next++ % 8];
    va_list ap;
    va_start(ap, f);
    vsnprintf(b, sizeof bufs[0], f, ap);
    va_end(ap);
    return b;
}

static const char *sh_line(const char *cmd)
{
    static char line[512];
    line[0] = '\0';
    FILE *f = popen(cmd, "r");
    if (f != NULL) {
        if (fgets(line, sizeof line, f) == NULL)
            line[0] = '\0';
        pclose(f);
    }
    line[strcspn(line, "\n")] = '\0';
    return line;
}

/* tar (reproducible) + gzip of tree into layout/blobs; fills b. */
static void make_layer(const char *layout, const char *tree, const char *what, blob *b)
{
    if (dsec_bench_sh("cd %s && tar -C %s --numeric-owner --mtime=@0 --sort=name -cf l.tar %s && "
                      "sha256sum l.tar | cut -c1-64 > l.diff && gzip -1 -n -f l.tar && "
                      "h=$(sha256sum l.tar.gz | cut -c1-64) && stat -c %%s l.tar.gz > l.size && "
                      "mv l.tar.gz blobs/sha256/$h && echo $h > l.hash",
                      layout, tree, what) != 0)
        dsec_bench_die("making a layer", NULL);
    snprintf(b->diff_id, sizeof b->diff_id, "sha256:%s", sh_line(fmt("cat %s/l.diff", layout)));
    snprintf(b->digest, sizeof b->digest, "sha256:%s", sh_line(fmt("cat %s/l.hash", layout)));
    b->size = strtoull(sh_line(fmt("cat %s/l.size", layout)), NULL, 10);
}

/* config + manifest for layers[0..n) into layout; adds the manifest to index.json under tag. */
static void write_image(const char *layout, const blob *l, size_t n, const char *tag)
{
    char diffs[4096] = "", descs[8192] = "";
    size_t dn = 0, ln = 0;
    for (size_t i = 0; i < n; i++) {
        dn +=
            (size_t)snprintf(diffs + dn, sizeof diffs - dn, "%s\"%s\"", i ? "," : "", l[i].diff_id);
        ln += (size_t)snprintf(descs + ln, sizeof descs - ln,
                               "%s{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar+gzip\","
                               "\"digest\":\"%s\",\"size\":%llu}",
                               i ? "," : "", l[i].digest, l[i].size);
    }
    FILE *f = fopen(fmt("%s/c.json", layout), "w");
    if (f == NULL)
        dsec_bench_die("writing a config", NULL);
    fprintf(
        f,
        "{\"architecture\":\"amd64\",\"os\":\"linux\",\"config\":{\"Env\":[\"PATH=/usr/bin:/bin\"],"
        "\"Cmd\":[\"/bin/sh\"]},\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[%s]}}",
        diffs);
    fclose(f);
    if (dsec_bench_sh(
            "cd %s && h=$(sha256sum c.json | cut -c1-64) && s=$(stat -c %%s c.json) && "
            "mv c.json blobs/sha256/$h && printf '{\"schemaVersion\":2,\"mediaType\":"
            "\"application/vnd.oci.image.manifest.v1+json\",\"config\":{\"mediaType\":"
            "\"application/vnd.oci.image.config.v1+json\",\"digest\":\"sha256:%%s\",\"size\":%%s},"
            "\"layers\":[%s]}' $h $s > m.json && mh=$(sha256sum m.json | cut -c1-64) && "
            "ms=$(stat -c %%s m.json) && mv m.json blobs/sha256/$mh && "
            "printf '{\"imageLayoutVersion\":\"1.0.0\"}' > oci-layout && "
            "printf "
            "'{\"schemaVersion\":2,\"manifests\":[{\"mediaType\":\"application/vnd.oci.image."
            "manifest.v1+json\",\"digest\":\"sha256:%%s\",\"size\":%%s,\"annotations\":"
            "{\"org.opencontainers.image.ref.name\":\"%s\"}}]}' $mh $ms > index.json",
            layout, descs, tag) != 0)
        dsec_bench_die("writing a manifest", NULL);
}

static void push(const char *layout, const char *tag, const char *repo)
{
    if (dsec_bench_sh("skopeo copy -q --dest-tls-verify=false oci:%s:%s "
                      "docker://127.0.0.1:%d/%s:%s >/dev/null",
                      layout, tag, reg_port, repo, tag) != 0)
        dsec_bench_die("skopeo copy to the registry", NULL);
}

static void kill_registry(void)
{
    if (reg_pid > 0) {
        kill(reg_pid, SIGTERM);
        waitpid(reg_pid, NULL, 0);
        reg_pid = 0;
    }
}

static void start_registry(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0 ||
        getsockname(fd, (struct sockaddr *)&a, &n) < 0)
        dsec_bench_die("a free port", NULL);
    reg_port = ntohs(a.sin_port);
    close(fd);
    FILE *f = fopen(fmt("%s/registry.yml", root), "w");
    if (f == NULL)
        dsec_bench_die("writing the registry config", NULL);
    fprintf(f,
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: "
            "%s/registry\n"
            "http:\n  addr: 127.0.0.1:%d\n  secret: bench\n",
            root, reg_port);
    fclose(f);
    reg_pid = fork();
    if (reg_pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the run */
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0) { /* its request log (every probe's 404) is noise here */
            dup2(null, 1);
            dup2(null, 2);
        }
        execlp("docker-registry", "docker-registry", "serve", fmt("%s/registry.yml", root),
               (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 200; i++) {
        if (dsec_bench_sh("curl -sf http://127.0.0.1:%d/v2/ >/dev/null", reg_port) == 0)
            return;
        usleep(50000);
    }
    dsec_bench_die("docker-registry did not start", NULL);
}

static double pull(dsec_layer_registry *r, const char *repo, dsec_image_info **out)
{
    dsec_image_pull_opts o = {.plain_http = true, .timeout_s = 120};
    o.import.work_dir = fmt("%s/scratch", root);
    dsec_err err;
    char ref[256];
    snprintf(ref, sizeof ref, "127.0.0.1:%d/%s:1", reg_port, repo);
    double t0 = dsec_bench_now_s();
    if (dsec_image_pull(r, ref, &o, out, &err) < 0)
        dsec_bench_die(ref, &err);
    return dsec_bench_now_s() - t0;
}

/* skopeo copy to an OCI dir, then each layer untarred and made an EROFS image. */
static double baseline(size_t nlayers)
{
    double t0 = dsec_bench_now_s();
    if (dsec_bench_sh(
            "skopeo copy -q --src-tls-verify=false docker://127.0.0.1:%d/bench/base:1 oci:%s/sk:1 "
            ">/dev/null",
            reg_port, root) != 0)
        dsec_bench_die("skopeo copy from the registry", NULL);
    if (dsec_bench_sh(
            "cd %s && i=0 && for d in $(python3 -c 'import json,sys; "
            "m=json.load(open(sys.argv[1]));"
            "print(\" \".join(l[\"digest\"][7:] for l in m[\"layers\"]))' "
            "sk/blobs/sha256/$(python3 -c 'import json; print(json.load(open(\"sk/index.json\"))"
            "[\"manifests\"][0][\"digest\"][7:])')); do i=$((i+1)); mkdir t$i && "
            "tar -C t$i --numeric-owner -xzf sk/blobs/sha256/$d && mkfs.erofs t$i.erofs t$i "
            ">/dev/null || exit 1; done && [ $i = %zu ]",
            root, nlayers) != 0)
        dsec_bench_die("untar + mkfs.erofs", NULL);
    double s = dsec_bench_now_s() - t0;
    dsec_bench_sh("rm -rf %s/sk %s/t*", root, root);
    return s;
}

static dsec_cell_conf conf; /* the cell's, released when the run ends */

static dsec_cell *start_cell(dsec_client **cl)
{
    dsec_cell_conf_defaults(&conf);
    conf.embedded_nats = true;
    conf.nats_port = 0;
    conf.sched_replicas = 1;
    snprintf(conf.state_dir, sizeof conf.state_dir, "%s/state", root);
    snprintf(conf.layers_path, sizeof conf.layers_path, "%s/layers", root);
    dsec_cell_node node = {.cpu_milli = 1000000, .memory_mb = 1u << 20, .slots = 1024};
    snprintf(node.name, sizeof node.name, "img-0");
    snprintf(node.backend, sizeof node.backend, "native");
    node.types[0] = dsec_strdup("container");
    conf.nodes = dsec_calloc(1, sizeof node);
    conf.nodes[0] = node;
    conf.nnodes = 1;
    dsec_cell *cell;
    dsec_err err;
    if (dsec_cell_start(&cell, &conf, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE, &err) < 0)
        dsec_bench_die("starting the cell", &err);
    dsec_bench_set_cell(cell);
    dsec_client_opts co = {.url = dsec_cell_url(cell), .timeout_ms = 600000, .threads = 2};
    if (dsec_client_connect(cl, &co, &err) < 0)
        dsec_bench_die("connecting", &err);
    return cell;
}

/* create -> first `true` answered, p50 over CREATE_N (after one warm-up that caches the layers). */
static double create_p50_ms(dsec_client *cl, const char *env)
{
    double lat[CREATE_N];
    for (int i = -1; i < CREATE_N; i++) {
        dsec_create_spec cs = {.type = "container",
                               .env = env,
                               .cpu_milli = 1000,
                               .memory_mb = 128,
                               .ttl_s = 3600,
                               .idle_s = 3600};
        dsec_sandbox_info info;
        dsec_exec_reply res;
        dsec_err err;
        const char *argv[] = {"/bin/true", NULL};
        dsec_exec_opts eo = {.argv = argv};
        double t0 = dsec_bench_now_s();
        if (dsec_create(cl, &cs, &info, &err) < 0)
            dsec_bench_die(env, &err);
        if (dsec_exec(cl, info.id, &eo, &res, &err) < 0)
            dsec_bench_die("exec", &err);
        if (i >= 0)
            lat[i] = (dsec_bench_now_s() - t0) * 1000;
        dsec_exec_reply_release(&res);
        if (dsec_destroy(cl, info.id, &err) < 0)
            dsec_bench_die("destroy", &err);
    }
    return dsec_bench_pct(lat, CREATE_N, 0.5);
}

/* The base tree: $DSEC_BENCH_BASE, else the debootstrap tree scripts/build-envs.sh makes. */
static const char *base_tree(void)
{
    const char *env = getenv("DSEC_BENCH_BASE");
    if (env != NULL && *env)
        return env;
    if (dsec_bench_sh("%s/scripts/build-envs.sh --dsec %s --registry %s/envs --state-dir %s "
                      "--no-check >/dev/null",
                      DSEC_SRC, DSEC_CLI, root, root) != 0)
        dsec_bench_die("scripts/build-envs.sh", NULL);
    return fmt("%s/cache/debootstrap-bookworm", root);
}

/* The base image (4 layers) and TASKS task images over it, pushed; layers of the base in base[]. */
static size_t push_images(const char *tree_in, blob *base)
{
    char tree[512], lay[600], py[600]; /* fmt's buffers are reused: keep these */
    snprintf(tree, sizeof tree, "%s", tree_in);
    snprintf(lay, sizeof lay, "%s/layout", root);
    snprintf(py, sizeof py, "%s/py", root);
    if (dsec_bench_sh("mkdir -p %s/blobs/sha256", lay) != 0)
        dsec_bench_die("mkdir", NULL);
    const char *parts[] = {
        "./usr/lib", "./usr/share", "--exclude=./usr/lib --exclude=./usr/share ./usr",
        "--exclude=./usr --exclude=./.complete --exclude='./proc/*' --exclude='./sys/*' "
        "--exclude='./dev/*' ."};
    size_t n = sizeof parts / sizeof parts[0];
    for (size_t i = 0; i < n; i++)
        make_layer(lay, tree, parts[i], &base[i]);
    /* a Python layer on top, as a python:3 image has (the host's standard library: real files),
     * which also takes the image past 200 MB */
    if (dsec_bench_sh("mkdir -p %s/usr/lib && cp -a /usr/lib/python3.11 %s/usr/lib/", py, py) != 0)
        dsec_bench_die("the python layer", NULL);
    make_layer(lay, py, ".", &base[n++]);
    write_image(lay, base, n, "1");
    push(lay, "1", "bench/base");
    for (int t = 0; t < TASKS; t++) {
        blob l[MAX_LAYERS];
        memcpy(l, base, n * sizeof *l);
        const char *own = fmt("%s/task%d", root, t);
        if (dsec_bench_sh(
                "mkdir -p %s/etc && echo task-%d > %s/etc/task && head -c 262144 /dev/urandom > "
                "%s/etc/task.bin",
                own, t, own, own) != 0)
            dsec_bench_die("a task layer", NULL);
        make_layer(lay, own, ".", &l[n]);
        write_image(lay, l, n + 1, "1");
        push(lay, "1", fmt("bench/task%d", t));
    }
    return n;
}

static unsigned long long du_bytes(const char *path)
{
    return strtoull(sh_line(fmt("du -sb %s | cut -f1", path)), NULL, 10);
}

int main(void)
{
    if (geteuid() != 0) {
        fprintf(stderr, "bench image: needs root (containers, mounts, debootstrap)\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    snprintf(root, sizeof root, "/var/tmp/dsec-bench-img-XXXXXX");
    if (mkdtemp(root) == NULL)
        dsec_bench_die("mkdtemp", NULL);
    dsec_bench_run("image", root, "img-0", NULL);
    atexit(kill_registry);
    char tree[512];
    snprintf(tree, sizeof tree, "%s", base_tree());
    printf("image bench in %s; base tree %s (%.0f MB) and the host's python3.11 (%.0f MB)\n", root,
           tree, du_bytes(tree) / 1e6, du_bytes("/usr/lib/python3.11") / 1e6);
    start_registry();
    blob base[MAX_LAYERS];
    size_t nbase = push_images(tree, base);

    dsec_layer_registry *r;
    dsec_err err;
    if (dsec_layer_registry_local(&r, fmt("%s/layers", root), &err) < 0)
        dsec_bench_die("the layer registry", &err);
    dsec_image_info *bi;
    double import_s = pull(r, "bench/base", &bi);
    double baseline_s = baseline(nbase);
    unsigned long long expected = 0;
    for (size_t i = 0; i < bi->nlayers; i++)
        expected += bi->layers[i].size;
    printf("import %.2f s (%zu layers) vs skopeo copy + untar + mkfs.erofs %.2f s: %.2fx\n",
           import_s, bi->nlayers, baseline_s, import_s / baseline_s);
    for (int t = 0; t < TASKS; t++) {
        dsec_image_info *ti;
        pull(r, fmt("bench/task%d", t), &ti);
        expected += ti->layers[ti->nlayers - 1].size;
        dsec_image_info_free(ti);
    }
    unsigned long long stored = du_bytes(fmt("%s/layers", root));
    printf("%d task images: registry holds %llu bytes, base + own layers %llu (%.3fx)\n", TASKS,
           stored, expected, (double)stored / (double)expected);
    dsec_layer_registry_free(r);

    if (dsec_bench_sh(
            "%s layer build %s --name native-base:1 --registry %s/layers --exclude './proc/*' "
            "--exclude './sys/*' --exclude ./.complete >/dev/null && %s layer build %s/py --name "
            "native-py:1 --registry %s/layers >/dev/null && %s env create native:1 --layer "
            "native-base:1 --layer native-py:1 --env PATH=/usr/bin:/bin --registry %s/layers "
            ">/dev/null",
            DSEC_CLI, tree, root, DSEC_CLI, root, root, DSEC_CLI, root) != 0)
        dsec_bench_die("the native environment", NULL);
    dsec_client *cl;
    start_cell(&cl);
    double p_img = create_p50_ms(cl, bi->env), p_nat = create_p50_ms(cl, "native:1");
    printf("create -> first exec p50: image %.1f ms, native %.1f ms (%.2fx)\n", p_img, p_nat,
           p_img / p_nat);
    double r_imp = import_s / baseline_s, r_store = (double)stored / (double)expected,
           r_create = p_img / p_nat;
    printf("targets: import %.2fx of the baseline (<= 1.3) %s; bytes stored %.3fx (<= 1.05) %s; "
           "create from the image %.2fx of native (<= 1.1) %s\n",
           r_imp, r_imp <= 1.3 ? "PASS" : "FAIL", r_store, r_store <= 1.05 ? "PASS" : "FAIL",
           r_create, r_create <= 1.1 ? "PASS" : "FAIL");
    printf("{\"scenario\":\"image\",\"import_s\":%.3f,\"baseline_s\":%.3f,\"images\":%d,\"bytes_"
           "stored\":%llu,"
           "\"bytes_expected\":%llu,\"create_p50_ms_image\":%.2f,\"create_p50_ms_native\":%.2f}\n",
           import_s, baseline_s, TASKS, stored, expected, p_img, p_nat);
    dsec_image_info_free(bi);
    dsec_client_free(cl);
    kill_registry();
    dsec_bench_end();
    dsec_cell_conf_release(&conf);
    return 0;
}
