/* journal.h - a node's append-only record of its sandboxes, replayed after a restart. */
#ifndef DSEC_ACTORS_JOURNAL_H
#define DSEC_ACTORS_JOURNAL_H

#include <stddef.h>
#include <stdint.h>

#include "dsec/err.h"

typedef struct dsec_journal dsec_journal;

/* Called once per live record while opening: the latest payload put for id
 * and not deleted since. id and data are borrowed for the call. */
typedef int (*dsec_journal_replay_cb)(const char *id, const void *data, size_t len, void *ud,
                                      dsec_err *err);

/* Open (creating if needed) the journal at path and replay it through cb.
 * A torn record at the tail (a crash mid-write) is cut off; corruption
 * before the tail is an error naming the offset. *out owns the journal. */
int dsec_journal_open(dsec_journal **out, const char *path, dsec_journal_replay_cb cb, void *ud,
                      dsec_err *err);
void dsec_journal_close(dsec_journal *j);

/* Record the latest payload of id (an id is at most 128 bytes, a payload at
 * most 64 KiB). When this returns the record is in the kernel: a crash of the
 * process loses nothing; a crash of the host loses what dsec_journal_sync has
 * not yet flushed. Thread-safe. */
int dsec_journal_put(dsec_journal *j, const char *id, const void *data, size_t len, dsec_err *err);
int dsec_journal_del(dsec_journal *j, const char *id, dsec_err *err);

/* fdatasync if anything was written since the last sync. */
int dsec_journal_sync(dsec_journal *j, dsec_err *err);

/* Whether the file holds many more records than the live ones (live is the
 * caller's count), so that compacting is worth it. */
int dsec_journal_wants_compaction(dsec_journal *j, uint64_t live);

/* Rewrite the journal with only the live records, given by each(): it must
 * call emit(id, data, len) once per live record. Atomic (temp + rename). */
typedef int (*dsec_journal_emit_fn)(dsec_journal *j, const char *id, const void *data, size_t len,
                                    dsec_err *err);
typedef int (*dsec_journal_each_fn)(dsec_journal *j, dsec_journal_emit_fn emit, void *ud,
                                    dsec_err *err);
int dsec_journal_compact(dsec_journal *j, dsec_journal_each_fn each, void *ud, dsec_err *err);

/* Live records found when the journal was opened (or last compacted). */
uint64_t dsec_journal_replayed(const dsec_journal *j);

#endif
