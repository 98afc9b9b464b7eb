/* internal.h - what the files of libdsec share; never installed. */
#ifndef DSEC_CLIENT_INTERNAL_H
#define DSEC_CLIENT_INTERNAL_H

#include "bus/bus.h"
#include "dsec/client.h"

/* The client's bus (owned by the client). */
dsec_bus *dsec__client_bus(dsec_client *c);
/* Its per-attempt timeout (ms). */
int dsec__client_timeout_ms(const dsec_client *c);

#endif
