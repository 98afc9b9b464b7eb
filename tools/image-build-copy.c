/* image-build-copy.c - COPY and ADD of `dsec image build`: files from the context or an earlier
 * stage into the stage's sandbox. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <glob.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dsec/alloc.h"
#include "tools/image-build.h"

/*
 * Files go one checked upload each (dsec_file_upload_fd: atomic, sha256 both
 * ends), directories are made with their modes, owners are root unless
 * --chown (then a `chown -R` in the sandbox, which needs chown there), and
 * symbolic links are made with `ln -s` in the sandbox (the file protocol has
 * no symlink call). Sources are matched in the context with glob(3) and must
 * resolve inside it; .dockerignore'd paths are left out.
 */

typedef struct copy {
    build *b;
    stage *s;
    const dsec_df_insn *in;
    const char *local_root; /* what the remote root mirrors */
    const char *remote_root;
    bool in_context; /* local_root is in the context: .dockerignore applies */
    int mode;        /* --chmod, or -1 */
    char **links;    /* "TARGET\0PATH" pairs made after the walk */
    size_t nlinks;
    char **tops; /* what this COPY made at its top (for --chown) */
    size_t ntops;
    unsigned files;
    dsec_err *err;
    int rc;
} copy;

static copy *g_copy; /* nftw has no user pointer */

static int push(char ***v, size_t *n, const char *a, size_t alen, const char *b2, dsec_err *err)
{
    size_t bl = b2 != NULL ? strlen(b2) + 1 : 0;
    char *s = dsec_malloc(alen + 1 + bl);
    char **q = s != NULL ? dsec_realloc(*v, (*n + 1) * sizeof *q) : NULL;
    if (q == NULL) {
        dsec_free(s);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "image build: out of memory");
    }
    memcpy(s, a, alen);
    s[alen] = '\0';
    if (b2 != NULL)
        memcpy(s + alen + 1, b2, bl);
    q[(*n)++] = s;
    *v = q;
    return 0;
}

/* Upload one local file to remote with mode. */
static int upload_file(copy *c, const char *local, const char *remote, unsigned mode)
{
    int fd = open(local, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return dsec_err_set(c->err, DSEC_E_IO, errno, "reading %s", local);
    dsec_upload_opts uo = {.mode = c->mode >= 0 ? (unsigned)c->mode : (mode & 07777)};
    int rc = dsec_file_upload_fd(c->b->c, c->s->id, remote, &uo, fd, NULL, c->err);
    close(fd);
    if (rc < 0)
        return dsec_err_wrap(c->err, "copying %s to %s", local, remote);
    c->files++;
    return 0;
}

static int walk_one(const char *local, const struct stat *st, int type, struct FTW *ftw)
{
    copy *c = g_copy;
    const char *rel = local + strlen(c->local_root); /* "" or "/x/y" */
    bool slash = rel[0] == '\0' || rel[0] == '/';
    if (c->in_context && rel[0] != '\0') {
        const char *crel = local + strlen(c->b->ctx_real) + 1;
        if (dsec_df_ignored(&c->b->ignore, crel))
            return type == FTW_D ? FTW_SKIP_SUBTREE : FTW_CONTINUE;
    }
    char remote[PATH_MAX];
    if (snprintf(remote, sizeof remote, "%s%s%s", c->remote_root, slash ? "" : "/", rel) >=
        (int)sizeof remote) {
        c->rc = dsec_err_set(c->err, DSEC_E_TOO_LARGE, 0, "path %s is too long", local);
        return FTW_STOP;
    }
    int rc = 0;
    if (type == FTW_D) {
        rc = dsec_file_mkdir(c->b->c, c->s->id, remote, st->st_mode & 07777, true, c->err);
        if (rc < 0)
            dsec_err_wrap(c->err, "making %s", remote);
    } else if (type == FTW_SL) {
        char target[PATH_MAX];
        ssize_t n = readlink(local, target, sizeof target - 1);
        rc = n < 0 ? dsec_err_set(c->err, DSEC_E_IO, errno, "reading link %s", local)
                   : push(&c->links, &c->nlinks, target, (size_t)n, remote, c->err);
    } else if (type == FTW_F && S_ISREG(st->st_mode)) {
        rc = upload_file(c, local, remote, st->st_mode);
    } else if (type == FTW_F) {
        fprintf(stderr, "note: %s: not a file, directory or link: left out\n", local);
    } else {
        rc = dsec_err_set(c->err, DSEC_E_IO, EACCES, "%s cannot be read", local);
    }
    if (rc == 0 && ftw->level == 0 &&
        push(&c->tops, &c->ntops, remote, strlen(remote), NULL, c->err) < 0)
        rc = -1;
    if (rc < 0) {
        c->rc = -1;
        return FTW_STOP;
    }
    return FTW_CONTINUE;
}

/* local (a file, a directory or a link) to remote: a directory's contents go into remote. */
static int copy_tree(copy *c, const char *local, const char *remote)
{
    char rroot[PATH_MAX];
    size_t rl = strlen(remote);
    while (rl > 1 && remote[rl - 1] == '/') /* "/opt/app/" mirrors as "/opt/app" */
        rl--;
    if (rl >= sizeof rroot)
        return dsec_err_set(c->err, DSEC_E_TOO_LARGE, 0, "destination %s is too long", remote);
    memcpy(rroot, remote, rl);
    rroot[rl] = '\0';
    c->local_root = local;
    c->remote_root = rroot;
    c->rc = 0;
    g_copy = c;
    if (nftw(local, walk_one, 32, FTW_PHYS | FTW_ACTIONRETVAL) < 0 && c->rc == 0)
        c->rc = dsec_err_set(c->err, DSEC_E_IO, errno, "walking %s", local);
    g_copy = NULL;
    return c->rc;
}

/* The links the walk found, made in the sandbox; then --chown. */
static int finish(copy *c)
{
    for (size_t i = 0; i < c->nlinks; i++) {
        const char *target = c->links[i], *path = target + strlen(target) + 1;
        const char *argv[] = {"ln", "-sfn", target, path, NULL};
        if (dsec__ib_run_root(c->b, c->s, argv, c->err) < 0)
            return dsec_err_wrap(c->err, "making link %s -> %s (the image needs `ln`)", path,
                                 target);
    }
    const char *own = dsec__ib_flag(c->in, "chown");
    if (own == NULL || c->ntops == 0)
        return 0;
    const char **argv = dsec_calloc(c->ntops + 4, sizeof *argv);
    if (argv == NULL)
        return dsec_err_set(c->err, DSEC_E_NOMEM, 0, "image build: out of memory");
    size_t n = 0;
    argv[n++] = "chown";
    argv[n++] = "-hR";
    argv[n++] = own;
    for (size_t i = 0; i < c->ntops; i++)
        argv[n++] = c->tops[i];
    int rc = dsec__ib_run_root(c->b, c->s, argv, c->err);
    dsec_free(argv);
    return rc < 0 ? dsec_err_wrap(c->err, "--chown=%s (the image needs `chown`)", own) : 0;
}

static bool is_archive(const char *p)
{
    static const char *const ext[] = {".tar",  ".tar.gz", ".tgz", ".tar.bz2",
                                      ".tbz2", ".tar.xz", ".txz", ".tar.zst"};
    size_t n = strlen(p);
    for (size_t i = 0; i < sizeof ext / sizeof *ext; i++) {
        size_t e = strlen(ext[i]);
        if (n > e && strcmp(p + n - e, ext[i]) == 0)
            return true;
    }
    return false;
}

/* ADD of a local archive: unpacked on the host into scratch by GNU tar (which refuses ".."
 * members and defers links that point outside until the end), then copied as a tree. */
static int add_archive(copy *c, const char *local, const char *remote)
{
    char tmp[] = "/tmp/dsec-add-XXXXXX";
    if (mkdtemp(tmp) == NULL)
        return dsec_err_set(c->err, DSEC_E_IO, errno, "making a scratch directory");
    pid_t pid = fork();
    if (pid == 0) {
        execlp("tar", "tar", "-x", "-f", local, "-C", tmp, "--no-same-owner", (char *)NULL);
        _exit(127);
    }
    int st = 0;
    int rc = pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0
                 ? dsec_err_set(c->err, DSEC_E_INVALID, 0, "ADD %s: tar could not unpack it", local)
                 : 0;
    if (rc == 0) {
        bool ctx = c->in_context;
        c->in_context = false;
        rc = dsec_file_mkdir(c->b->c, c->s->id, remote, 0755, true, c->err);
        if (rc == 0)
            rc = copy_tree(c, tmp, remote);
        c->in_context = ctx;
    }
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd) != 0)
        fprintf(stderr, "note: could not remove %s\n", tmp);
    return rc;
}

/* Where one source goes: into dest when dest is a directory, else dest itself. */
static int dest_of(const char *src, const char *dest, bool into, char *out, size_t n)
{
    const char *base = strrchr(src, '/');
    base = base != NULL ? base + 1 : src;
    size_t dl = strlen(dest);
    return snprintf(out, n, "%s%s%s", dest, into && dl > 0 && dest[dl - 1] != '/' ? "/" : "",
                    into ? base : "") >= (int)n
               ? -1
               : 0;
}

/* Make the parent of a file's destination, as Docker does. */
static int make_parent(copy *c, const char *path)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s", path);
    char *sl = strrchr(p, '/');
    if (sl == NULL || sl == p)
        return 0;
    *sl = '\0';
    return dsec_file_mkdir(c->b->c, c->s->id, p, 0755, true, c->err);
}

/* One context match: a directory's contents into dest, a file to or into dest. */
static int copy_match(copy *c, const char *path, const char *dest, bool into, bool add)
{
    struct stat st;
    if (stat(path, &st) < 0)
        return dsec_err_set(c->err, DSEC_E_IO, errno, "%s", path);
    if (S_ISDIR(st.st_mode)) {
        if (dsec_file_mkdir(c->b->c, c->s->id, dest, 0755, true, c->err) < 0)
            return dsec_err_wrap(c->err, "making %s", dest);
        return copy_tree(c, path, dest);
    }
    char target[PATH_MAX];
    if (dest_of(path, dest, into, target, sizeof target) < 0)
        return dsec_err_set(c->err, DSEC_E_TOO_LARGE, 0, "destination %s is too long", dest);
    if (add && is_archive(path))
        return add_archive(c, path, dest);
    if (make_parent(c, target) < 0)
        return dsec_err_wrap(c->err, "making the directory of %s", target);
    int rc = upload_file(c, path, target, st.st_mode);
    if (rc == 0)
        rc = push(&c->tops, &c->ntops, target, strlen(target), NULL, c->err);
    return rc;
}

/* The context paths src matches (*keep, borrowed from g), each inside the context; none is an
 * error. */
static int context_matches(copy *c, const char *src, glob_t *g, const char ***keep, size_t *nkeep)
{
    if (strncmp(src, "http://", 7) == 0 || strncmp(src, "https://", 8) == 0 ||
        strncmp(src, "git@", 4) == 0)
        return dsec_err_set(c->err, DSEC_E_UNSUPPORTED, 0,
                            "%s: a build reaches no network: download it into the context and "
                            "COPY it",
                            src);
    char pat[PATH_MAX];
    if (snprintf(pat, sizeof pat, "%s/%s", c->b->ctx_real, src) >= (int)sizeof pat)
        return dsec_err_set(c->err, DSEC_E_TOO_LARGE, 0, "%.80s...: path too long", src);
    int g_rc = glob(pat, 0, NULL, g);
    *keep = g_rc == 0 ? dsec_calloc(g->gl_pathc, sizeof **keep) : NULL;
    *nkeep = 0;
    if (g_rc == 0 && *keep == NULL)
        return dsec_err_set(c->err, DSEC_E_NOMEM, 0, "image build: out of memory");
    size_t cl = strlen(c->b->ctx_real);
    for (size_t i = 0; g_rc == 0 && i < g->gl_pathc; i++) {
        char real[PATH_MAX];
        const char *m = g->gl_pathv[i];
        if (realpath(m, real) == NULL ||
            (strcmp(real, c->b->ctx_real) != 0 &&
             (strncmp(real, c->b->ctx_real, cl) != 0 || real[cl] != '/')))
            return dsec_err_set(c->err, DSEC_E_PERMISSION, 0,
                                "%s: resolves outside the build context %s", src, c->b->ctx_real);
        if (strlen(m) > cl + 1 && dsec_df_ignored(&c->b->ignore, m + cl + 1))
            continue;
        (*keep)[(*nkeep)++] = m;
    }
    if (*nkeep == 0 && strpbrk(src, "*?[") != NULL)
        return 0; /* as BuildKit: a wildcard may match nothing */
    if (*nkeep == 0)
        return dsec_err_set(c->err, DSEC_E_NOT_FOUND, 0,
                            "%s: no file of the build context matches it (or .dockerignore leaves "
                            "it out)",
                            src);
    return 0;
}

/* COPY --from=STAGE: a path of an earlier stage's sandbox, through a scratch file on the host.
 * Directories are copied whole; links in them are left out (no readlink call: noted). */
static int from_stage(copy *c, stage *from, const char *src, const char *dest, bool into)
{
    dsec_dirent de;
    if (dsec_file_stat(c->b->c, from->id, src, &de, c->err) < 0)
        return dsec_err_wrap(c->err, "--from: %s", src);
    dsec_free(de.name);
    char target[PATH_MAX];
    if (strcmp(de.kind, "dir") == 0) {
        if (dsec_file_mkdir(c->b->c, c->s->id, dest, (unsigned)de.mode & 07777, true, c->err) < 0)
            return -1;
        dsec_dirent *ents;
        size_t n;
        if (dsec_file_list(c->b->c, from->id, src, &ents, &n, c->err) < 0)
            return dsec_err_wrap(c->err, "--from: listing %s", src);
        int rc = 0;
        for (size_t i = 0; rc == 0 && i < n; i++) {
            char s2[PATH_MAX], d2[PATH_MAX];
            snprintf(s2, sizeof s2, "%s/%s", src, ents[i].name);
            snprintf(d2, sizeof d2, "%s/%s", dest, ents[i].name);
            if (strcmp(ents[i].kind, "file") == 0 || strcmp(ents[i].kind, "dir") == 0)
                rc = from_stage(c, from, s2, d2, false);
            else
                fprintf(stderr, "note: COPY --from: %s is a %s: left out\n", s2, ents[i].kind);
        }
        dsec_dirents_free(ents, n);
        return rc;
    }
    if (strcmp(de.kind, "file") != 0)
        return dsec_err_set(c->err, DSEC_E_UNSUPPORTED, 0, "--from: %s is a %s, not a file", src,
                            de.kind);
    if (dest_of(src, dest, into, target, sizeof target) < 0)
        return dsec_err_set(c->err, DSEC_E_TOO_LARGE, 0, "destination %s is too long", dest);
    FILE *tmp = tmpfile();
    if (tmp == NULL)
        return dsec_err_set(c->err, DSEC_E_IO, errno, "making a scratch file");
    int rc = dsec_file_download_fd(c->b->c, from->id, src, NULL, fileno(tmp), NULL, c->err);
    if (rc == 0 && lseek(fileno(tmp), 0, SEEK_SET) < 0)
        rc = dsec_err_set(c->err, DSEC_E_IO, errno, "rewinding the scratch file");
    if (rc == 0)
        rc = make_parent(c, target);
    dsec_upload_opts uo = {.mode = c->mode >= 0 ? (unsigned)c->mode : (unsigned)de.mode & 07777};
    if (rc == 0)
        rc = dsec_file_upload_fd(c->b->c, c->s->id, target, &uo, fileno(tmp), NULL, c->err);
    fclose(tmp);
    if (rc == 0) {
        c->files++;
        rc = push(&c->tops, &c->ntops, target, strlen(target), NULL, c->err);
    }
    return rc < 0 ? dsec_err_wrap(c->err, "--from: %s to %s", src, target) : 0;
}

static int parse_chmod(const dsec_df_insn *in, int *mode)
{
    const char *m = dsec__ib_flag(in, "chmod");
    *mode = -1;
    if (m == NULL)
        return 0;
    char *end;
    long v = strtol(m, &end, 8);
    if (m[0] == '\0' || *end != '\0' || v < 0 || v > 07777)
        return -1;
    *mode = (int)v;
    return 0;
}

/* Each source (context matches, or paths of --from's stage) to dest. */
static int copy_sources(copy *c, char **w, size_t nsrc, const char *dest, bool add)
{
    const char *fromname = dsec__ib_flag(c->in, "from");
    stage *from = fromname != NULL ? dsec__ib_stage(c->b, fromname, c->b->nst - 1) : NULL;
    if (fromname != NULL && from == NULL)
        return dsec_err_set(c->err, DSEC_E_NOT_FOUND, 0,
                            "--from=%s: no earlier stage is named so (to copy from an image, add "
                            "a stage FROM it)",
                            fromname);
    size_t dl = strlen(dest);
    bool into = nsrc > 1 || dest[dl - 1] == '/';
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < nsrc; i++) {
        if (from != NULL) {
            char *src = dsec__ib_path(from, w[i]);
            rc = src != NULL ? from_stage(c, from, src, dest, into)
                             : dsec_err_set(c->err, DSEC_E_NOMEM, 0, "out of memory");
            dsec_free(src);
            continue;
        }
        glob_t g = {0};
        const char **keep = NULL;
        size_t nkeep = 0;
        rc = context_matches(c, w[i], &g, &keep, &nkeep);
        bool many = into || nkeep > 1;
        for (size_t k = 0; rc == 0 && k < nkeep; k++)
            rc = copy_match(c, keep[k], dest, many, add);
        dsec_free(keep);
        globfree(&g);
    }
    return rc;
}

int dsec__ib_copy(build *b, stage *s, const dsec_df_insn *in, bool add, dsec_err *err)
{
    char **w;
    size_t n;
    if (dsec__ib_words(b, s, in, &w, &n, err) < 0)
        return dsec__ib_fail(b, in, err, "%s", "");
    copy c = {.b = b, .s = s, .in = in, .err = err, .in_context = true};
    int rc = 0;
    if (n < 2)
        rc = dsec__ib_fail(b, in, err, "needs a source and a destination");
    else if (parse_chmod(in, &c.mode) < 0)
        rc = dsec__ib_fail(b, in, err, "--chmod=%s: expected an octal mode",
                           dsec__ib_flag(in, "chmod"));
    char *dest = rc == 0 ? dsec__ib_path(s, w[n - 1]) : NULL;
    if (rc == 0 && dest == NULL)
        rc = dsec_err_set(err, DSEC_E_NOMEM, 0, "image build: out of memory");
    if (rc == 0 && (w[n - 1][strlen(w[n - 1]) - 1] == '/' && dest[strlen(dest) - 1] != '/')) {
        char *d2 = NULL; /* keep the "into a directory" slash that dsec__ib_path may have lost */
        if (asprintf(&d2, "%s/", dest) >= 0) {
            dsec_free(dest);
            dest = dsec_strdup(d2);
            free(d2);
        }
    }
    if (rc == 0)
        rc = copy_sources(&c, w, n - 1, dest, add);
    if (rc == 0)
        rc = finish(&c);
    if (rc < 0 && err->msg[0] != '\0' &&
        strncmp(err->msg, b->dockerfile, strlen(b->dockerfile)) != 0)
        dsec__ib_fail(b, in, err, "%s", "");
    else if (rc == 0 && !b->quiet)
        fprintf(stderr, "  %u file(s) copied\n", c.files);
    dsec_free(dest);
    dsec_df_strv_free(c.links, c.nlinks);
    dsec_df_strv_free(c.tops, c.ntops);
    dsec_df_strv_free(w, n);
    return rc;
}
