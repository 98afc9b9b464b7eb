/* tracer.h - the actor that answers dsec.v1.ctl.trace with what its process kept of a request. */
#ifndef DSEC_ACTORS_TRACER_H
#define DSEC_ACTORS_TRACER_H

#include "bus/bus.h"
#include "codecs/subjects.h"
#include "dsec/err.h"

/* Every process answers (no queue group): dsec trace gathers the answers. */
#define DSEC_TRACE_SUBJECT DSEC_SUBJ_TRACE

typedef struct dsec_tracer dsec_tracer;

/* Configure bus's hop record with conf and answer trace queries for it as
 * process (copied). *out owns the tracer; stop it with dsec_tracer_stop
 * before the bus is freed (or let dsec_bus_free take its actor). */
int dsec_tracer_start(dsec_tracer **out, dsec_bus *bus, const char *process,
                      const dsec_trace_conf *conf, dsec_err *err);
/* NULL is a no-op. */
void dsec_tracer_stop(dsec_tracer *t);

#endif
