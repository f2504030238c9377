/*
 * A plain store made inside a do_locked callback, kept until the unlock.
 *
 * Sent with the unlock it saves a crossing into the transport and shortens
 * the time the record is locked (g_lock makes one such store per call).
 * Until then db_ops.c answers this process's reads of the key from here,
 * and writes it out before any other operation on the database, so nobody
 * can see the difference except through do_locked's status, which reports
 * a failed deferred write. Used only where the record table asks for it
 * (dbwrap_py_record_ops.defer_locked_stores).
 */

#ifndef DBWRAP_PY_DEFERRED_STORE_H
#define DBWRAP_PY_DEFERRED_STORE_H

#include "samba_abi.h"

/* g_lock records are a few hundred bytes: keep those off the heap */
#define DBWRAP_PY_DEFERRED_INLINE 512

/* One per do_locked scope, on its stack; nested scopes chain through outer. */
struct dbwrap_py_deferred {
	TDB_DATA key;                      /* the do_locked key */
	TDB_DATA value;                    /* inline_buf, or on mem_ctx */
	bool pending;
	struct dbwrap_py_deferred *outer;  /* an enclosing do_locked on this db */
	TALLOC_CTX *mem_ctx;               /* for values too large for inline_buf */
	uint8_t inline_buf[DBWRAP_PY_DEFERRED_INLINE];
};

/*
 * Start a do_locked scope. The inline buffer is left as it is: zeroing 512
 * bytes on every do_locked cost more than the rest of this file.
 */
void dbwrap_py_deferred_init(struct dbwrap_py_deferred *d, TDB_DATA key,
			     struct dbwrap_py_deferred *outer, TALLOC_CTX *mem_ctx);
/* Keep the buffers, joined, as the value to store with the unlock. */
NTSTATUS dbwrap_py_deferred_set(struct dbwrap_py_deferred *d,
				const TDB_DATA *dbufs, int num_dbufs);
/* Whether d (may be NULL) is the do_locked scope of key. */
bool dbwrap_py_deferred_is_for(const struct dbwrap_py_deferred *d, TDB_DATA key);
/*
 * Whether a read of key must be answered by d's value. Inline: every read
 * asks, and nearly always nothing is pending.
 */
static inline bool dbwrap_py_deferred_covers(const struct dbwrap_py_deferred *d,
					     TDB_DATA key)
{
	return d != NULL && d->pending && dbwrap_py_deferred_is_for(d, key);
}
/* Drop the value (written, or given up). */
void dbwrap_py_deferred_clear(struct dbwrap_py_deferred *d);

#endif /* DBWRAP_PY_DEFERRED_STORE_H */
