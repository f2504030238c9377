/*
 * Joining the buffers of a storev into one value: the one place that adds
 * up their lengths (overflow-checked) and copies them.
 */

#ifndef DBWRAP_PY_BUFFERS_H
#define DBWRAP_PY_BUFFERS_H

#include "samba_abi.h"

/* Gives `len` bytes to join into, or NULL. */
typedef uint8_t *(*dbwrap_py_alloc_fn)(void *alloc_ctx, size_t len);

/*
 * The buffers, one after another, in memory from alloc; *len is the total.
 * NULL if the total does not fit in a size_t or alloc gives nothing.
 */
uint8_t *dbwrap_py_join(const TDB_DATA *dbufs, int num_dbufs,
			dbwrap_py_alloc_fn alloc, void *alloc_ctx, size_t *len);

#endif /* DBWRAP_PY_BUFFERS_H */
