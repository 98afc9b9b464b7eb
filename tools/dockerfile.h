/* dockerfile.h - Dockerfile parsing for `dsec image build`: instructions, word splitting,
 * variables, .dockerignore. */
#ifndef DSEC_TOOLS_DOCKERFILE_H
#define DSEC_TOOLS_DOCKERFILE_H

#include <stdbool.h>
#include <stddef.h>

#include "dsec/err.h"

/*
 * One instruction, as Docker reads it: comment lines and blank lines gone,
 * continuations (the escape character at the end of a line, '\' unless a
 * "# escape=`" directive says otherwise) joined. `args` holds the words of
 * the exec (JSON) form when json is set; otherwise `rest`, the arguments as
 * written (after the --flags), is what the instruction reads: RUN/CMD/
 * ENTRYPOINT hand it to the shell, the others split and expand it with
 * dsec_df_words.
 */
typedef struct dsec_df_insn {
    char *cmd;     /* upper case: FROM, RUN, COPY, ... */
    unsigned line; /* of the instruction's first line, from 1 */
    char **flags;  /* "--from=build", "--chown=app" */
    size_t nflags;
    char *rest; /* the arguments after the flags, trimmed */
    bool json;  /* rest was a JSON array of strings: see args */
    char **args;
    size_t nargs;
} dsec_df_insn;

typedef struct dsec_df {
    dsec_df_insn *v;
    size_t n;
    char escape; /* '\\' or '`' */
} dsec_df;

/* Parse text (len bytes; NULs refused). name labels errors ("Dockerfile:12: ...").
 * Unknown instructions, heredocs, and a continuation with nothing after it are
 * refused, naming the line. *out is the caller's: dsec_df_free. */
int dsec_df_parse(const char *text, size_t len, const char *name, dsec_df *out, dsec_err *err);
void dsec_df_free(dsec_df *df);

/* Variables visible to an instruction: "KEY=VALUE" strings, later ones win. */
typedef struct dsec_df_vars {
    char **v;
    size_t n, cap;
} dsec_df_vars;
/* Set KEY to VALUE (replacing KEY's earlier value). */
int dsec_df_vars_set(dsec_df_vars *vs, const char *key, const char *value, dsec_err *err);
/* Set each "KEY=VALUE" of kv[0..n) (strings without '=' are skipped). */
int dsec_df_vars_add(dsec_df_vars *vs, char *const *kv, size_t n, dsec_err *err);
/* KEY's value, or NULL. */
const char *dsec_df_vars_get(const dsec_df_vars *vs, const char *key);
void dsec_df_vars_free(dsec_df_vars *vs);

/*
 * Split s into words as Docker does for ENV, LABEL, ARG, COPY, ... : white
 * space separates words; '...' keeps its contents as they are; "..." and
 * bare text expand $NAME, ${NAME}, ${NAME:-word} and ${NAME:+word} from vars
 * (an unset NAME is empty) and take the escape character before any
 * character as that character. vars may be NULL (no expansion). *words and
 * each word are the caller's (dsec_df_strv_free). An unterminated quote or
 * ${ is refused.
 */
int dsec_df_words(const char *s, char escape, const dsec_df_vars *vars, char ***words, size_t *n,
                  dsec_err *err);
void dsec_df_strv_free(char **v, size_t n);

/* .dockerignore: patterns one a line ('#' comments), '!' re-including; the
 * last pattern that matches a path decides. Paths are relative to the
 * context, without "./". */
typedef struct dsec_df_ignore {
    char **pats;
    bool *negate;
    size_t n;
} dsec_df_ignore;
int dsec_df_ignore_parse(const char *text, size_t len, dsec_df_ignore *out, dsec_err *err);
/* Whether rel (a path relative to the context) is left out of it. */
bool dsec_df_ignored(const dsec_df_ignore *ig, const char *rel);
void dsec_df_ignore_free(dsec_df_ignore *ig);

#endif
