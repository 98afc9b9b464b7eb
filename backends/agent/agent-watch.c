/* agent-watch.c - `dsec-agent --watch DIR [--recursive]`: a directory's changes as JSON lines on
 * stdout, run as a sandbox's background process. */
#include "backends/agent/agent-watch.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

/*
 * The node starts this as a background process (argv "/proc/self/exe --watch DIR": the
 * agent's shepherd runs the agent binary itself), so its output goes through the ring every
 * background process has: bounded, followed by offset, kept when nobody reads, and the
 * watcher ends with its sandbox or with a signal. One line per event:
 *
 *   {"event":"create","path":"/src/a.py","dir":false}
 *
 * event: create, modify (a file written and closed), delete, moved_from, moved_to, attrib,
 * overflow (the kernel dropped events: rescan), gone (the watched directory itself went;
 * the watcher then exits 0). The first line is {"event":"ready",...} once every watch is set,
 * so a client knows changes after it are seen. Paths are absolute. With --recursive,
 * directories created later are watched too (their existing content is reported as create
 * events, since it may have been filled before the watch was set).
 */

#define WATCH_MAX 65536

struct wdir {
    int wd;
    char *path;
};

static struct wdir *dirs;
static size_t ndirs, capdirs;
static bool recursive;

static const char *path_of(int wd)
{
    for (size_t i = 0; i < ndirs; i++)
        if (dirs[i].wd == wd)
            return dirs[i].path;
    return NULL;
}

/* A JSON string body: quotes, backslashes and control bytes escaped. */
static void put_json_str(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            printf("\\%c", *p);
        else if (*p < 0x20)
            printf("\\u%04x", *p);
        else
            putchar(*p);
    }
}

static void emit(const char *event, const char *dir, const char *name, bool is_dir)
{
    printf("{\"event\":\"%s\",\"path\":\"", event);
    put_json_str(dir);
    if (name != NULL && name[0] != '\0') {
        if (strcmp(dir, "/") != 0)
            putchar('/');
        put_json_str(name);
    }
    printf("\",\"dir\":%s}\n", is_dir ? "true" : "false");
}

static int add_dir(int fd, const char *path, bool report);

/* Watch path's subdirectories (recursive); report: their entries as create events. */
static void add_children(int fd, const char *path, bool report)
{
    DIR *d = opendir(path);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char sub[PATH_MAX];
        int n = snprintf(sub, sizeof sub, "%s%s%s", path, strcmp(path, "/") ? "/" : "", e->d_name);
        if (n < 0 || (size_t)n >= sizeof sub)
            continue;
        struct stat st;
        bool is_dir = lstat(sub, &st) == 0 && S_ISDIR(st.st_mode);
        if (report)
            emit("create", path, e->d_name, is_dir);
        if (is_dir)
            add_dir(fd, sub, report);
    }
    closedir(d);
}

static int add_dir(int fd, const char *path, bool report)
{
    if (ndirs >= WATCH_MAX)
        return -1;
    int wd = inotify_add_watch(fd, path,
                               IN_CREATE | IN_CLOSE_WRITE | IN_DELETE | IN_MOVED_FROM |
                                   IN_MOVED_TO | IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF |
                                   IN_ONLYDIR | IN_DONT_FOLLOW);
    if (wd < 0)
        return -1;
    if (path_of(wd) == NULL) {
        if (ndirs == capdirs) {
            size_t nc = capdirs ? capdirs * 2 : 64;
            struct wdir *nd = realloc(dirs, nc * sizeof *nd);
            if (nd == NULL)
                return -1;
            dirs = nd;
            capdirs = nc;
        }
        char *copy = strdup(path);
        if (copy == NULL)
            return -1;
        dirs[ndirs++] = (struct wdir){wd, copy};
    }
    if (recursive)
        add_children(fd, path, report);
    return 0;
}

static void drop_wd(int wd)
{
    for (size_t i = 0; i < ndirs; i++)
        if (dirs[i].wd == wd) {
            free(dirs[i].path);
            dirs[i] = dirs[--ndirs];
            return;
        }
}

int dsec__agent_watch_main(int argc, char **argv)
{
    const char *root = NULL;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--recursive") == 0)
            recursive = true;
        else if (root == NULL)
            root = argv[i];
        else
            root = "";
    }
    if (root == NULL || root[0] != '/') {
        fprintf(stderr, "dsec-agent --watch: give one absolute directory path (and "
                        "--recursive to watch below it)\n");
        return 2;
    }
    char top[PATH_MAX];
    snprintf(top, sizeof top, "%s", root);
    for (size_t n = strlen(top); n > 1 && top[n - 1] == '/'; n--)
        top[n - 1] = '\0';
    struct stat st;
    if (stat(top, &st) < 0) {
        fprintf(stderr, "dsec-agent --watch: %s: %s\n", top, strerror(errno));
        return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "dsec-agent --watch: %s: not a directory\n", top);
        return 1;
    }
    int fd = inotify_init1(IN_CLOEXEC);
    if (fd < 0 || add_dir(fd, top, false) < 0) {
        fprintf(stderr, "dsec-agent --watch: %s: %s\n", top, strerror(errno));
        return 1;
    }
    printf("{\"event\":\"ready\",\"path\":\"");
    put_json_str(top);
    printf("\",\"dir\":true}\n");
    fflush(stdout);
    static char buf[64 << 10] __attribute__((aligned(__alignof__(struct inotify_event))));
    for (;;) {
        ssize_t len = read(fd, buf, sizeof buf);
        if (len < 0 && errno == EINTR)
            continue;
        if (len <= 0)
            return 1;
        for (char *p = buf; p < buf + len;) {
            const struct inotify_event *ev = (const struct inotify_event *)p;
            p += sizeof *ev + ev->len;
            if (ev->mask & IN_Q_OVERFLOW) {
                printf("{\"event\":\"overflow\",\"path\":\"");
                put_json_str(top);
                printf("\",\"dir\":true}\n");
                continue;
            }
            const char *dir = path_of(ev->wd);
            if (dir == NULL)
                continue;
            bool is_dir = (ev->mask & IN_ISDIR) != 0;
            const char *name = ev->len > 0 ? ev->name : NULL;
            if (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF)) {
                if (strcmp(dir, top) == 0) {
                    emit("gone", top, NULL, true);
                    fflush(stdout);
                    return 0;
                }
                continue; /* a subdirectory: its parent reports it */
            }
            if (ev->mask & IN_IGNORED) {
                drop_wd(ev->wd);
                continue;
            }
            const char *what = ev->mask & IN_CREATE        ? "create"
                               : ev->mask & IN_CLOSE_WRITE ? "modify"
                               : ev->mask & IN_DELETE      ? "delete"
                               : ev->mask & IN_MOVED_FROM  ? "moved_from"
                               : ev->mask & IN_MOVED_TO    ? "moved_to"
                               : ev->mask & IN_ATTRIB      ? "attrib"
                                                           : NULL;
            if (what == NULL)
                continue;
            emit(what, dir, name, is_dir);
            if (recursive && is_dir && (ev->mask & (IN_CREATE | IN_MOVED_TO)) && name != NULL) {
                char sub[PATH_MAX];
                int n = snprintf(sub, sizeof sub, "%s%s%s", dir, strcmp(dir, "/") ? "/" : "", name);
                if (n > 0 && (size_t)n < sizeof sub)
                    add_dir(fd, sub, true);
            }
        }
        fflush(stdout);
    }
}
