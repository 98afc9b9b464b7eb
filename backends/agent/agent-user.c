/* agent-user.c - users: the sandbox's own /etc/passwd and /etc/group (static glibc has no NSS) */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/agent/agent-int.h"

static bool parse_id(const char *s, size_t len, unsigned long *out)
{
    if (len == 0 || len > 10)
        return false;
    unsigned long v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (unsigned long)(s[i] - '0');
    }
    if (v > UINT32_MAX - 1) /* (uid_t)-1 means "unchanged" to the kernel */
        return false;
    *out = v;
    return true;
}

/* Split a colon line into at most max fields (in place). Returns the field count. */
static int split_colon(char *line, char **f, int max)
{
    int n = 0;
    f[n++] = line;
    for (char *p = line; *p && n < max; p++)
        if (*p == ':') {
            *p = 0;
            f[n++] = p + 1;
        }
    return n;
}

/* Each line of the file at path (its newline cut) to fn until fn says it is done (true).
 * Whether fn said so; false too when the file cannot be read. */
static bool each_line(const char *path, bool (*fn)(char *line, void *arg), void *arg)
{
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return false;
    char *line = NULL;
    size_t cap = 0;
    bool done = false;
    while (!done && getline(&line, &cap, f) > 0) {
        line[strcspn(line, "\n")] = 0;
        done = fn(line, arg);
    }
    free(line);
    fclose(f);
    return done;
}

/* What passwd_find looks for, and where it puts what it found. */
struct passwd_want {
    const char *name;
    uid_t uid;
    bool by_name;
    struct ident *id;
};

static bool passwd_line(char *line, void *arg)
{
    struct passwd_want *w = arg;
    char *fl[7];
    unsigned long u, gg;
    if (split_colon(line, fl, 7) < 7 || !parse_id(fl[2], strlen(fl[2]), &u) ||
        !parse_id(fl[3], strlen(fl[3]), &gg))
        return false;
    if (!(w->by_name ? strcmp(fl[0], w->name) == 0 : (uid_t)u == w->uid))
        return false;
    bool found = strlen(fl[0]) <= DSEC__AGENT_USER_MAX && strlen(fl[5]) <= DSEC__AGENT_PATH_MAX;
    if (found) {
        strcpy(w->id->name, fl[0]);
        strcpy(w->id->home, fl[5]);
        w->id->uid = (uid_t)u;
        w->id->gid = (gid_t)gg;
    }
    return found;
}

/* Find a passwd entry by name (by_name) or uid. Fills name, uid, gid, home. */
static bool passwd_find(const char *name, uid_t uid, bool by_name, struct ident *id)
{
    struct passwd_want w = {.name = name, .uid = uid, .by_name = by_name, .id = id};
    return each_line("/etc/passwd", passwd_line, &w);
}

/* What group_find looks for, and where it puts the gid. */
struct group_want {
    const char *name;
    gid_t *gid;
};

static bool group_line(char *line, void *arg)
{
    struct group_want *w = arg;
    char *fl[4];
    unsigned long gg;
    if (split_colon(line, fl, 4) >= 3 && strcmp(fl[0], w->name) == 0 &&
        parse_id(fl[2], strlen(fl[2]), &gg)) {
        *w->gid = (gid_t)gg;
        return true;
    }
    return false;
}

static bool group_find(const char *name, gid_t *gid)
{
    struct group_want w = {.name = name, .gid = gid};
    return each_line("/etc/group", group_line, &w);
}

/* A group line that lists id's user adds the group; done once GROUPS_MAX are there. */
static bool member_line(char *line, void *arg)
{
    struct ident *id = arg;
    char *fl[4];
    unsigned long gg;
    if (split_colon(line, fl, 4) < 4 || !parse_id(fl[2], strlen(fl[2]), &gg) ||
        (gid_t)gg == id->gid)
        return false;
    for (char *tok = strtok(fl[3], ","); tok; tok = strtok(NULL, ","))
        if (strcmp(tok, id->name) == 0) {
            id->groups[id->ngroups++] = (gid_t)gg;
            break;
        }
    return id->ngroups >= GROUPS_MAX;
}

/* The primary group, then every group of /etc/group that lists the user. */
static void supplementary_groups(struct ident *id)
{
    id->groups[0] = id->gid;
    id->ngroups = 1;
    if (id->name[0] == 0)
        return;
    each_line("/etc/group", member_line, id);
}

/*
 * "name", "name:group", "uid" or "uid:gid" (numbers need no passwd entry: a
 * uid without one runs with gid = uid unless a gid is given). Returns NULL or
 * a message saying what is wrong.
 */
const char *dsec__agent_resolve_user(const char *spec, struct ident *id)
{
    memset(id, 0, sizeof *id);
    id->set = true;
    const char *colon = strchr(spec, ':');
    size_t ulen = colon ? (size_t)(colon - spec) : strlen(spec);
    char uname[DSEC__AGENT_USER_MAX + 1];
    if (ulen == 0 || ulen > DSEC__AGENT_USER_MAX)
        return "empty or overlong user name";
    memcpy(uname, spec, ulen);
    uname[ulen] = 0;
    unsigned long num;
    if (parse_id(uname, ulen, &num)) {
        if (!passwd_find(NULL, (uid_t)num, false, id)) {
            id->uid = (uid_t)num;
            id->gid = (gid_t)num;
        }
    } else if (!passwd_find(uname, 0, true, id)) {
        return "no such user in /etc/passwd";
    }
    if (colon) {
        const char *gs = colon + 1;
        if (parse_id(gs, strlen(gs), &num))
            id->gid = (gid_t)num;
        else if (!group_find(gs, &id->gid))
            return "no such group in /etc/group";
        id->groups[0] = id->gid;
        id->ngroups = 1;
    } else {
        supplementary_groups(id);
    }
    return NULL;
}
