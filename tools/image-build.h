/* image-build.h - what the parts of `dsec image build` share: the build, its stages, Dockerfile
 * helpers. */
#ifndef DSEC_TOOLS_IMAGE_BUILD_H
#define DSEC_TOOLS_IMAGE_BUILD_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include "dsec/client.h"
#include "dsec/layers.h"
#include "tools/dockerfile.h"

typedef struct stage {
    char *alias;          /* AS name, or NULL */
    char id[DSEC_ID_MAX]; /* its sandbox ("" until created) */
    dsec_df_vars env;     /* the base environment's variables, then ENV */
    dsec_df_vars args;    /* ARGs declared in this stage, with their values */
    char *workdir, *user; /* NULL: the base's */
    char **shell;         /* SHELL, default /bin/sh -c */
    size_t nshell;
    char **entry, **cmd; /* ENTRYPOINT and CMD as argv (the shell form wrapped in SHELL) */
    size_t nentry, ncmd;
    bool entry_set, cmd_set;
    dsec_df_vars labels; /* LABEL (and MAINTAINER as "maintainer") */
    char *base;          /* the environment its first FROM named (NULL: scratch) */
} stage;

typedef struct build {
    dsec_client *c;
    dsec_layer_registry *reg;
    const char *context, *dockerfile, *name, *target;
    char ctx_real[PATH_MAX];
    dsec_df df;
    dsec_df_ignore ignore;
    dsec_df_vars build_args; /* --build-arg */
    dsec_df_vars global;     /* ARGs before the first FROM */
    stage *st;
    size_t nst;
    uint64_t step_timeout_ms;
    unsigned step, nsteps;
    bool quiet;
} build;

/* Prefix err (or a new message) with the Dockerfile's name, the line and the instruction. */
int dsec__ib_fail(const build *b, const dsec_df_insn *in, dsec_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The words of in, expanded in the stage's scope (ARGs, then ENV); dsec_df_strv_free. */
int dsec__ib_words(const build *b, const stage *s, const dsec_df_insn *in, char ***w, size_t *n,
                   dsec_err *err);
/* The value of in's flag --name=V, or NULL. */
const char *dsec__ib_flag(const dsec_df_insn *in, const char *name);
/* A path in the sandbox: p when absolute, else under the stage's WORKDIR (dsec_free). */
char *dsec__ib_path(const stage *s, const char *p);
/* The stage named (AS name) or numbered name, before stage `before`; NULL if none. */
stage *dsec__ib_stage(build *b, const char *name, size_t before);
/* Run argv in the stage's sandbox as root (chown, ln); output on failure goes in err. */
int dsec__ib_run_root(build *b, stage *s, const char *const *argv, dsec_err *err);
/* COPY and ADD (add: local tar archives are unpacked). */
int dsec__ib_copy(build *b, stage *s, const dsec_df_insn *in, bool add, dsec_err *err);

#endif
