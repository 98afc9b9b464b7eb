/* replay_main.c - feed files or directories to a fuzz harness, so corpora replay as tests. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "dsec/alloc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Feed one file: an exact-size heap copy, so ASan sees any read past its end. */
static int run_file(const char *path, size_t *count)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    int rc = -1;
    uint8_t *data = NULL;
    long size;
    if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0)
        goto out_close;
    data = dsec_malloc((size_t)size);
    if (data == NULL || fread(data, 1, (size_t)size, f) != (size_t)size)
        goto out_close;
    LLVMFuzzerTestOneInput(data, (size_t)size);
    (*count)++;
    rc = 0;
out_close:
    if (rc < 0)
        fprintf(stderr, "replay: reading %s failed\n", path);
    dsec_free(data);
    fclose(f);
    return rc;
}

static int run_path(const char *path, size_t *count);

static int run_dir(const char *path, size_t *count)
{
    DIR *d = opendir(path);
    if (d == NULL) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char sub[4096];
        if ((size_t)snprintf(sub, sizeof sub, "%s/%s", path, e->d_name) >= sizeof sub) {
            fprintf(stderr, "replay: path too long under %s\n", path);
            rc = -1;
            break;
        }
        rc = run_path(sub, count);
    }
    closedir(d);
    return rc;
}

static int run_path(const char *path, size_t *count)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    return S_ISDIR(st.st_mode) ? run_dir(path, count) : run_file(path, count);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
        return 2;
    }
    size_t count = 0;
    for (int i = 1; i < argc; i++)
        if (run_path(argv[i], &count) < 0)
            return 1;
    /* An empty corpus would make this test pass without testing anything. */
    if (count == 0) {
        fprintf(stderr, "replay: no inputs found\n");
        return 1;
    }
    printf("replay: %zu inputs ran clean\n", count);
    return 0;
}
