/*
 * A node cache's local files, opened by this process itself: the records'
 * and the buckets' tdb files and the node agent's state file, with the
 * node cache's rules over them (c_core/nodecache_core.h). The
 * proxy transport's fast path works on them; the node daemon tells where
 * they are (NODE_CACHE).
 *
 * One process opens a tdb file once (tdb_open refuses a second open), so
 * the databases of one node cache share its files, counted by their holds;
 * a forked child shares its parent's. tdb files must be opened again in a
 * forked child (their locks are the process's): every open set is on one
 * list, the fast path's only global state, and a pthread_atfork handler
 * reopens them in the child, while it still runs as root (smbd's children
 * later become the connected user).
 */

#ifndef DBWRAP_PY_NODECACHE_FILES_H
#define DBWRAP_PY_NODECACHE_FILES_H

#include "samba_abi.h"
#include "nodecache_core.h"

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
	unsigned holds;
	struct nodecache_files *prev, *next;
};

/* One database's use of the files; freeing it lets go (the last closes them). */
struct nodecache_hold {
	struct nodecache_files *files;
};

/*
 * The files `where` names, opened unless this process has them open
 * already (then its wipe revision and op_timeout are taken from `where`).
 * The hold is a talloc child of mem_ctx; NULL, with the cause in why, when
 * the files cannot be opened.
 */
struct nodecache_hold *nodecache_files_hold(TALLOC_CTX *mem_ctx,
					    const struct nodecache_where *where,
					    struct dbwrap_py_native_why *why);

#endif /* DBWRAP_PY_NODECACHE_FILES_H */
