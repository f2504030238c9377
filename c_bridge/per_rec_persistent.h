/*
 * Samba 4.25's per-record persistence (DBWRAP_FLAG_PER_REC_PERSISTENT), for
 * every adapter: see per_rec_persistent.c.
 */

#ifndef DBWRAP_PY_PER_REC_PERSISTENT_H
#define DBWRAP_PY_PER_REC_PERSISTENT_H

#include "samba_abi.h"

#if DBWRAP_PY_SAMBA_4_25_LAYOUT
/*
 * db_open_py() for a database opened with DBWRAP_FLAG_PER_REC_PERSISTENT:
 * the same arguments; NULL with errno set and one log line on failure.
 */
struct db_context *dbwrap_py_open_per_rec_persistent(
	TALLOC_CTX *mem_ctx, const char *name, int hash_size, int tdb_flags,
	int open_flags, mode_t mode, enum dbwrap_lock_order lock_order,
	uint64_t dbwrap_flags, const char *adapter, const char *const *options);
#endif

#endif /* DBWRAP_PY_PER_REC_PERSISTENT_H */
