/* files.c - dsec files mkdir|stat|mv|rm: directories, renames and removals in a sandbox. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsec/alloc.h"
#include "dsec/client.h"
#include "tools/cli.h"

static int files_usage(void)
{
    fprintf(stderr, "usage: dsec files mkdir [-p] [-m MODE] ID PATH\n"
                    "       dsec files stat ID PATH\n"
                    "       dsec files mv ID FROM TO\n"
                    "       dsec files rm [-r] ID PATH\n");
    return 2;
}

int dsec_cli_files(int argc, char **argv)
{
    if (argc < 2)
        return files_usage();
    const char *verb = argv[1];
    bool parents = false, recursive = false;
    unsigned long mode = 0;
    int ch;
    optind = 2;
    while ((ch = getopt(argc, argv, "+prm:")) != -1) {
        char *end;
        if (ch == 'p' && strcmp(verb, "mkdir") == 0)
            parents = true;
        else if (ch == 'r' && strcmp(verb, "rm") == 0)
            recursive = true;
        else if (ch == 'm' && strcmp(verb, "mkdir") == 0 &&
                 (mode = strtoul(optarg, &end, 8), *end == '\0' && mode <= 07777))
            ;
        else
            return files_usage();
    }
    int nargs = argc - optind;
    char **a = argv + optind;
    bool mv = strcmp(verb, "mv") == 0;
    if (!(strcmp(verb, "mkdir") == 0 || strcmp(verb, "stat") == 0 || mv ||
          strcmp(verb, "rm") == 0) ||
        nargs != (mv ? 3 : 2))
        return files_usage();
    char cmd[32];
    snprintf(cmd, sizeof cmd, "files %s", verb);
    dsec_client *c = dsec_cli_connect(cmd);
    if (c == NULL)
        return 1;
    dsec_err err;
    int rc;
    if (strcmp(verb, "mkdir") == 0) {
        rc = dsec_file_mkdir(c, a[0], a[1], (unsigned)mode, parents, &err);
    } else if (mv) {
        rc = dsec_file_rename(c, a[0], a[1], a[2], &err);
    } else if (strcmp(verb, "rm") == 0) {
        rc = dsec_file_remove(c, a[0], a[1], recursive, &err);
    } else {
        dsec_dirent st;
        rc = dsec_file_stat(c, a[0], a[1], &st, &err);
        if (rc == 0) {
            char when[32] = "";
            time_t t = (time_t)st.mtime;
            struct tm tm;
            if (gmtime_r(&t, &tm) != NULL)
                strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
            printf("%s %04" PRIo64 " %" PRIu64 " %s %s\n", st.kind, st.mode & 07777, st.size, when,
                   a[1]);
            dsec_free(st.name);
        }
    }
    dsec_client_free(c);
    return rc < 0 ? dsec_cli_fail(cmd, &err) : 0;
}
