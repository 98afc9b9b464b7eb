/* fuzz_config.c - fuzz the cell configuration: YAML parsing and every section's checks, net: among
 * them. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/cell.h"
#include "dsec/err.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dsec_cell_conf c;
    dsec_err err;
    dsec_cell_conf_defaults(&c);
    dsec_err_clear(&err);
    int rc = dsec_cell_conf_parse(&c, "fuzz.yaml", (const char *)data, size, &err);
    /* a refusal always says what was wrong, and names the file */
    if (rc < 0 && (err.code == DSEC_OK || err.msg[0] == '\0')) {
        fprintf(stderr, "fuzz_config: refused without a message\n");
        abort();
    }
    if (rc == 0 && c.nnodes > DSEC_CELL_MAX_NODES) {
        fprintf(stderr, "fuzz_config: %zu nodes accepted\n", c.nnodes);
        abort();
    }
    dsec_cell_conf_release(&c);
    return 0;
}
