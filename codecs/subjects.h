/* subjects.h - every subject of the protocol, spelled in one place for senders and receivers. */
#ifndef DSEC_CODECS_SUBJECTS_H
#define DSEC_CODECS_SUBJECTS_H

#include <inttypes.h>

/*
 * docs/protocol.md lists what travels on each. A sender fills the %s with names; a receiver
 * fills them with "*" (one token) or ends with ">" to subscribe to a family, from the same
 * macro, so the two cannot drift apart. They are printf formats: snprintf(buf, n, DSEC_SUBJ_X,
 * ...) lets the compiler check the arguments. Names never hold '.', '*', '>' or spaces
 * (dsec/names.h checks them where they enter).
 */

#define DSEC_SUBJ_ROOT "dsec.v1."    /* every subject starts with it */
#define DSEC_SUBJ_CTL "dsec.v1.ctl." /* the cell's own traffic; tenants never see it */
#define DSEC_SUBJ_SBX_TOKENS 7       /* dsec.v1.<tenant>.sbx.<node>.<id>.<op> */

/* ---- tenants' requests and events (dsec.v1.<tenant>.…) ---- */
#define DSEC_SUBJ_CREATE "dsec.v1.%s.create"         /* tenant */
#define DSEC_SUBJ_CREATE_CELL "dsec.v1.%s.create.%s" /* tenant, cell */
#define DSEC_SUBJ_LIST "dsec.v1.%s.list"             /* tenant */
#define DSEC_SUBJ_NODES "dsec.v1.%s.nodes"           /* tenant */
#define DSEC_SUBJ_SBX "dsec.v1.%s.sbx.%s.%s.%s"      /* tenant, node, sandbox id, op */
#define DSEC_SUBJ_SBX_OF_NODE "dsec.v1.%s.sbx.%s.>"  /* tenant, node: every sandbox op */
#define DSEC_SUBJ_EVT_SBX "dsec.v1.%s.evt.sbx"       /* tenant: its sandboxes' lifecycle */
#define DSEC_SUBJ_EVT_LOST "dsec.v1.%s.evt.lost"     /* tenant: sandboxes of a lost node */
#define DSEC_SUBJ_TENANT_ALL "dsec.v1.%s.>"          /* tenant: all it may publish */
#define DSEC_SUBJ_TENANT_EVT "dsec.v1.%s.evt.>"      /* tenant: all it may hear */

/* ---- the cell's control traffic (dsec.v1.ctl.…) ---- */
#define DSEC_SUBJ_PLACE "dsec.v1.ctl.place.%s"                   /* node */
#define DSEC_SUBJ_LOOKUP "dsec.v1.ctl.lookup.%s"                 /* cell */
#define DSEC_SUBJ_HOLD "dsec.v1.ctl.hold.%s"                     /* node */
#define DSEC_SUBJ_HOLD_ANY "dsec.v1.ctl.hold.>"                  /* every node's holds */
#define DSEC_SUBJ_RECONCILE "dsec.v1.ctl.reconcile.%s"           /* node */
#define DSEC_SUBJ_SUPERSEDED "dsec.v1.ctl.superseded.%s"         /* cell */
#define DSEC_SUBJ_SUPERSEDED_NODE "dsec.v1.ctl.superseded.%s.%s" /* cell, node */
#define DSEC_SUBJ_SYNC "dsec.v1.ctl.sync"                        /* every cell */
#define DSEC_SUBJ_SYNC_CELL "dsec.v1.ctl.sync.%s"                /* cell */
#define DSEC_SUBJ_QUOTA "dsec.v1.ctl.quota.%s.%s"                /* cell, op (admit, set, ...) */
#define DSEC_SUBJ_QUOTA_ADMIT "dsec.v1.ctl.quota.%s.admit"       /* cell */
#define DSEC_SUBJ_QUOTA_CHANGED "dsec.v1.ctl.quota.changed"
#define DSEC_SUBJ_JOB_REGISTER "dsec.v1.ctl.job.%s.register" /* cell */
#define DSEC_SUBJ_JOB "dsec.v1.ctl.job.%s.%s.%s" /* cell, job, reclaim|forced|released */
#define DSEC_SUBJ_JOB_ANY "dsec.v1.ctl.job.>"
#define DSEC_SUBJ_SCHED_BACK "dsec.v1.ctl.sched.%s.%s.back" /* cell, scheduler */
#define DSEC_SUBJ_TRACE "dsec.v1.ctl.trace"                 /* every process answers */
#define DSEC_SUBJ_PING "dsec.v1.ctl.ping"

/* events: dsec.v1.ctl.evt.<cell>.<kind>[.<name>[.<what>]] */
#define DSEC_SUBJ_EVT_PREFIX "dsec.v1.ctl.evt."
#define DSEC_SUBJ_EVT "dsec.v1.ctl.evt.%s.%s"       /* cell, demand|summary|reclaim */
#define DSEC_SUBJ_EVT_OF "dsec.v1.ctl.evt.%s.%s.%s" /* cell, node|sbx|alert|lost, name */
#define DSEC_SUBJ_EVT_ALL "dsec.v1.ctl.evt.%s.>"    /* cell */
#define DSEC_SUBJ_EVT_CAPACITY_ANY "dsec.v1.ctl.evt.*.node.*.capacity"

/* the trajectory log's stream: dsec.v1.traj.<rollout>.<step> */
#define DSEC_SUBJ_TRAJ_ALL "dsec.v1.traj.>"
#define DSEC_SUBJ_TRAJ "dsec.v1.traj.%s.%" PRIu64  /* rollout, step */
#define DSEC_SUBJ_TRAJ_ROLLOUT "dsec.v1.traj.%s.*" /* rollout: all its steps */

#endif
