/*
 * A node cache's local files, opened by this process itself: the records'
 * and the buckets' tdb files and the node agent's state file, with the
 * node cache's rules over them (python/dbwrap_py/nodecache/_core.h). The
 * proxy transport's fast path works on them; the node daemon tells where
 * they are (NODE_CACHE).
 *
 * tdb files must be opened again in a forked child (their locks are the
 * process's): every open set is on one list, the fast path's only global
 * state, and a pthread_atfork handler reopens them in the child, while it
 * still runs as root (smbd's children later become the connected user).
 */

#ifndef DBWRAP_PY_NODECACHE_FILES_H
#define DBWRAP_PY_NODECACHE_FILES_H

#include "samba_abi.h"
#include "_core.h"

/* What the daemon says of a database's node cache. */
struct nodecache_where {
	const char *records_path;
	const char *buckets_path;
	const char *cache_dir;
	TDB_DATA cache_id;
	int64_t wipe_revision;
	double op_timeout;
};

struct nodecache_files {
	struct tdb_context *records;   /* NULL once a reopen after fork failed */
	struct tdb_context *buckets;
	struct nc_state state;
	struct nc_records rules;       /* over the three above */
	char *records_path, *buckets_path;
	uint8_t *cache_id;
	struct nodecache_files *prev, *next;
};

/*
 * Open the files `where` names; a talloc child of mem_ctx, closed when
 * freed. NULL with errno set (and the cause in why) when they cannot be.
 */
struct nodecache_files *nodecache_files_open(TALLOC_CTX *mem_ctx,
					     const struct nodecache_where *where,
					     struct dbwrap_py_native_why *why);

#endif /* DBWRAP_PY_NODECACHE_FILES_H */
