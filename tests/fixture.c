/* fixture.c - a nats-server in a fresh temp dir for the integration tests. */
#include "tests/fixture.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

/* A test that dies outside cmocka (a signal ASan does not report, an _exit) keeps the
 * lines it printed: ctest's pipe would otherwise hold them in a buffer that dies too. */
__attribute__((constructor)) static void line_buffered_stdout(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
}

int dsec_test_server_start(const char *prefix, bool jetstream, dsec_natsd **out, char *root,
                           size_t n)
{
    snprintf(root, n, "/tmp/%s-XXXXXX", prefix);
    if (mkdtemp(root) == NULL) {
        perror("mkdtemp");
        return -1;
    }
    char dir[512];
    snprintf(dir, sizeof dir, "%s/nats", root);
    mkdir(dir, 0700);
    dsec_natsd_opts o = {.state_dir = dir, .jetstream = jetstream};
    dsec_err err;
    if (dsec_natsd_start(out, &o, &err) < 0) {
        fprintf(stderr, "nats-server: %s\n", err.msg);
        return -1;
    }
    return 0;
}

int dsec_test_server_stop(dsec_natsd *s, const char *root)
{
    dsec_natsd_stop(s);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    return system(cmd) == 0 ? 0 : -1;
}
