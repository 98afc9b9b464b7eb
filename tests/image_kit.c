/* image_kit.c - test images written in-process with libarchive (no docker, no registry). */
#define _GNU_SOURCE
#include "image_kit.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "dsec/layers.h"
#include "dsec/sha256.h"

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            fprintf(stderr, "image_kit: %s:%d: %s failed\n", __FILE__, __LINE__, #x);              \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static void digest_of(const void *p, size_t n, char out[72])
{
    dsec_sha256 c;
    uint8_t raw[DSEC_SHA256_LEN];
    dsec_sha256_init(&c);
    dsec_sha256_update(&c, p, n);
    dsec_sha256_final(&c, raw);
    dsec_digest_from_raw(raw, out);
}

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)sz + 1);
    CHECK(b != NULL && fread(b, 1, (size_t)sz, f) == (size_t)sz);
    fclose(f);
    *n = (size_t)sz;
    return b;
}

/* A tar of entries in memory, optionally through gzip. */
static char *tar_mem(const ik_entry *e, size_t n, bool gzip, size_t *len)
{
    size_t cap = 64u << 20;
    char *buf = malloc(cap);
    CHECK(buf != NULL);
    struct archive *a = archive_write_new();
    archive_write_set_format_pax_restricted(a);
    if (gzip)
        archive_write_add_filter_gzip(a);
    archive_write_set_bytes_in_last_block(a, 1);
    CHECK(archive_write_open_memory(a, buf, cap, len) == ARCHIVE_OK);
    for (size_t i = 0; i < n; i++) {
        struct archive_entry *en = archive_entry_new();
        archive_entry_set_pathname(en, e[i].path);
        archive_entry_set_uid(en, e[i].uid);
        archive_entry_set_gid(en, e[i].gid);
        archive_entry_set_mtime(en, 1, 0);
        char *fdata = NULL;
        size_t flen = 0;
        if (e[i].type == 'f') {
            if (e[i].from_file != NULL)
                fdata = slurp(e[i].from_file, &flen);
            else if (e[i].data != NULL)
                flen = strlen(e[i].data);
        }
        switch (e[i].type) {
        case 'f':
            archive_entry_set_filetype(en, AE_IFREG);
            archive_entry_set_size(en, (la_int64_t)flen);
            break;
        case 'd':
            archive_entry_set_filetype(en, AE_IFDIR);
            break;
        case 'l':
            archive_entry_set_filetype(en, AE_IFLNK);
            archive_entry_set_symlink(en, e[i].data);
            break;
        case 'h':
            archive_entry_set_filetype(en, AE_IFREG);
            archive_entry_set_hardlink(en, e[i].data);
            break;
        case 'c':
            archive_entry_set_filetype(en, AE_IFCHR);
            archive_entry_set_rdev(en, makedev(1, 3));
            break;
        case 'p':
            archive_entry_set_filetype(en, AE_IFIFO);
            break;
        default:
            CHECK(0);
        }
        archive_entry_set_perm(en, e[i].mode ? e[i].mode : (e[i].type == 'd' ? 0755 : 0644));
        if (e[i].xattr != NULL) {
            const char *eq = strchr(e[i].xattr, '=');
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)(eq - e[i].xattr), e[i].xattr);
            archive_entry_xattr_add_entry(en, name, eq + 1, strlen(eq + 1));
        }
        CHECK(archive_write_header(a, en) == ARCHIVE_OK);
        const char *src = fdata != NULL ? fdata : e[i].data;
        if (e[i].type == 'f' && flen > 0)
            CHECK(archive_write_data(a, src, flen) == (la_ssize_t)flen);
        free(fdata);
        archive_entry_free(en);
    }
    CHECK(archive_write_close(a) == ARCHIVE_OK);
    archive_write_free(a);
    return buf;
}

void ik_layer_make(ik_layer *l, const ik_entry *e, size_t n, bool gzip)
{
    size_t tl;
    char *tar = tar_mem(e, n, false, &tl);
    if (l->truncate_to != 0 && l->truncate_to < tl)
        tl = l->truncate_to;
    digest_of(tar, tl, l->diff_id);
    if (gzip && l->truncate_to == 0) {
        free(tar);
        l->blob = tar_mem(e, n, true, &l->len);
    } else {
        l->blob = tar;
        l->len = tl;
    }
    l->gzip = gzip && l->truncate_to == 0;
    digest_of(l->blob, l->len, l->digest);
}

void ik_layer_free(ik_layer *l)
{
    free(l->blob);
    memset(l, 0, sizeof *l);
}

static void put_file(const char *path, const void *p, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(fd >= 0 && write(fd, p, n) == (ssize_t)n);
    close(fd);
}

/* Write bytes as blobs/sha256/<hex> under dir; its digest in out. */
static void put_blob(const char *dir, const void *p, size_t n, char out[72])
{
    digest_of(p, n, out);
    char path[1024];
    snprintf(path, sizeof path, "%s/blobs/sha256/%s", dir, out + 7);
    put_file(path, p, n);
}

static char *config_json(const ik_image *im, ik_layer *const *layers, size_t n)
{
    char *buf = NULL;
    size_t sz;
    FILE *f = open_memstream(&buf, &sz);
    fprintf(f,
            "{\"architecture\":\"amd64\",\"os\":\"linux\",\"config\":{%s},"
            "\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[",
            im->config_json_extra != NULL ? im->config_json_extra : "");
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%s\"%s\"", i ? "," : "",
                i == 0 && im->bad_diff_id != NULL ? im->bad_diff_id : layers[i]->diff_id);
    fprintf(f, "]}}");
    fclose(f);
    return buf;
}

void ik_write_oci_dir(const char *dir, const ik_image *im, ik_layer *const *layers, size_t n)
{
    char p[1024];
    snprintf(p, sizeof p, "mkdir -p '%s/blobs/sha256'", dir);
    CHECK(system(p) == 0);
    snprintf(p, sizeof p, "%s/oci-layout", dir);
    put_file(p, "{\"imageLayoutVersion\":\"1.0.0\"}", 30);
    char cfgd[72], mfd[72], idxd[72], ld[72];
    char *cfg = config_json(im, layers, n);
    put_blob(dir, cfg, strlen(cfg), cfgd);
    char *mf = NULL;
    size_t sz;
    FILE *f = open_memstream(&mf, &sz);
    fprintf(f,
            "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\","
            "\"config\":{\"mediaType\":\"application/vnd.oci.image.config.v1+json\","
            "\"digest\":\"%s\",\"size\":%zu},\"layers\":[",
            cfgd, strlen(cfg));
    for (size_t i = 0; i < n; i++) {
        put_blob(dir, layers[i]->blob, layers[i]->len, ld);
        if (i == 0 &&
            im->bad_layer_digest != NULL) { /* the bytes under a name they do not hash to */
            snprintf(p, sizeof p, "%s/blobs/sha256/%s", dir, im->bad_layer_digest + 7);
            put_file(p, layers[i]->blob, layers[i]->len);
        }
        const char *media = im->layer_media != NULL ? im->layer_media
                            : layers[i]->gzip       ? "application/vnd.oci.image.layer.v1.tar+gzip"
                                                    : "application/vnd.oci.image.layer.v1.tar";
        fprintf(f, "%s{\"mediaType\":\"%s\",\"digest\":\"%s\",\"size\":%zu}", i ? "," : "", media,
                i == 0 && im->bad_layer_digest != NULL ? im->bad_layer_digest : ld, layers[i]->len);
    }
    fprintf(f, "]}");
    fclose(f);
    put_blob(dir, mf, strlen(mf), mfd);
    char ann[512] = "";
    if (im->ref != NULL)
        snprintf(ann, sizeof ann, ",\"annotations\":{\"io.containerd.image.name\":\"%s\"}",
                 im->ref);
    char entry[2048];
    snprintf(entry, sizeof entry,
             "{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"%s\","
             "\"size\":%zu,\"platform\":{\"os\":\"linux\",\"architecture\":\"%s\"}%s}",
             mfd, strlen(mf), im->platform_arch != NULL ? im->platform_arch : "amd64",
             im->nested_index ? "" : ann);
    char idx[4096];
    if (im->nested_index) {
        snprintf(idx, sizeof idx,
                 "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image."
                 "index.v1+json\",\"manifests\":[%s]}",
                 entry);
        put_blob(dir, idx, strlen(idx), idxd);
        snprintf(entry, sizeof entry,
                 "{\"mediaType\":\"application/vnd.oci.image.index.v1+json\","
                 "\"digest\":\"%s\",\"size\":%zu%s}",
                 idxd, strlen(idx), ann);
    }
    snprintf(idx, sizeof idx, "{\"schemaVersion\":2,\"manifests\":[%s]}", entry);
    snprintf(p, sizeof p, "%s/index.json", dir);
    put_file(p, idx, strlen(idx));
    free(cfg);
    free(mf);
}

void ik_tar_dir(const char *dir, const char *path)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "tar -C '%s' -cf '%s' .", dir, path);
    CHECK(system(cmd) == 0);
}

void ik_write_docker_archive(const char *path, const ik_image *im, ik_layer *const *layers,
                             size_t n)
{
    char *cfg = config_json(im, layers, n);
    char cfgd[72];
    digest_of(cfg, strlen(cfg), cfgd);
    ik_entry e[2 + 2 * 32];
    size_t ne = 0;
    char names[32][160], dirs[32][80], cfgname[80];
    char *mf = NULL;
    size_t sz;
    FILE *f = open_memstream(&mf, &sz);
    snprintf(cfgname, sizeof cfgname, "%s.json", cfgd + 7);
    fprintf(f, "[{\"Config\":\"%s\",\"RepoTags\":[", cfgname);
    if (im->ref != NULL)
        fprintf(f, "\"%s\"", im->ref);
    fprintf(f, "],\"Layers\":[");
    e[ne++] = (ik_entry){.type = 'f', .path = cfgname, .data = cfg};
    for (size_t i = 0; i < n; i++) {
        /* old-style layer dirs named by a made-up id: the diff_id check is what binds them */
        snprintf(dirs[i], sizeof dirs[i], "%.64s", layers[i]->diff_id + 7);
        dirs[i][0] = (char)('a' + (int)i % 6);
        snprintf(names[i], sizeof names[i], "%.70s/layer.tar", dirs[i]);
        fprintf(f, "%s\"%s\"", i ? "," : "", names[i]);
        e[ne++] = (ik_entry){.type = 'd', .path = dirs[i]};
    }
    fprintf(f, "]}]");
    fclose(f);
    e[ne++] = (ik_entry){.type = 'f', .path = "manifest.json", .data = mf};
    /* layer contents are binary: written through temp files */
    char tmpl[32][64];
    CHECK(n <= 32);
    for (size_t i = 0; i < n; i++) {
        snprintf(tmpl[i], sizeof tmpl[i], "/tmp/ik-layer-%d-%zu", (int)getpid(), i);
        put_file(tmpl[i], layers[i]->blob, layers[i]->len);
        e[ne++] = (ik_entry){.type = 'f', .path = names[i], .from_file = tmpl[i]};
    }
    size_t len;
    char *tar = tar_mem(e, ne, false, &len);
    put_file(path, tar, len);
    for (size_t i = 0; i < n; i++)
        unlink(tmpl[i]);
    free(tar);
    free(cfg);
    free(mf);
}

char *ik_pathf(const char *fmt, ...)
{
    static char bufs[8][1024];
    static int next;
    char *b = bufs[next++ % 8];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, sizeof bufs[0], fmt, ap);
    va_end(ap);
    return b;
}
