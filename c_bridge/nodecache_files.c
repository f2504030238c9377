/*
 * A node cache's local files in this process (nodecache_files.h).
 */

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>

#include "nodecache_files.h"

/* as the node cache opens them (cache.py open_local); the files exist already */
#define LOCAL_TDB_FLAGS (TDB_SEQNUM | TDB_INCOMPATIBLE_HASH)

static struct nodecache_files *open_files; /* reopened in a forked child */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void nodecache_files_reopen_all(void)
{
	struct nodecache_files *f;

	for (f = open_files; f != NULL; f = f->next) {
		/* tdb_reopen frees the context when it fails: the rules then say "closed" */
		if (f->records != NULL && tdb_reopen(f->records) != 0) {
			f->records = NULL;
		}
		if (f->buckets != NULL && tdb_reopen(f->buckets) != 0) {
			f->buckets = NULL;
		}
	}
}

static void nodecache_files_atfork(void)
{
	(void)pthread_atfork(NULL, NULL, nodecache_files_reopen_all);
}

static int nodecache_files_destructor(struct nodecache_files *f)
{
	if (f->prev != NULL) {
		f->prev->next = f->next;
	} else if (open_files == f) {
		open_files = f->next;
	}
	if (f->next != NULL) {
		f->next->prev = f->prev;
	}
	if (f->records != NULL) {
		tdb_close(f->records);
	}
	if (f->buckets != NULL) {
		tdb_close(f->buckets);
	}
	nc_state_close(&f->state);
	return 0;
}

static struct tdb_context *nodecache_tdb_open(const char *path,
					      struct dbwrap_py_native_why *why)
{
	int flags = LOCAL_TDB_FLAGS |
		(tdb_runtime_check_for_robust_mutexes() ? TDB_MUTEX_LOCKING : 0);
	struct tdb_context *tdb = tdb_open(path, 0, flags, O_RDWR, 0);

	if (tdb == NULL) {
		int err = errno;

		nc_why(why, NC_NT_INTERNAL_DB_ERROR, "tdb_open %s: %s", path, strerror(err));
		errno = err;
	}
	return tdb;
}

static struct nodecache_files *nodecache_files_open(const struct nodecache_where *where,
						    struct dbwrap_py_native_why *why)
{
	struct nodecache_files *f = talloc_zero(NULL, struct nodecache_files);
	int err;

	if (f == NULL) {
		nc_why(why, NC_NT_NO_MEMORY, "out of memory");
		errno = ENOMEM;
		return NULL;
	}
	f->records_path = talloc_strdup(f, where->records_path);
	f->buckets_path = talloc_strdup(f, where->buckets_path);
	f->cache_id = talloc_memdup(f, where->cache_id.dptr, where->cache_id.dsize);
	if (f->records_path == NULL || f->buckets_path == NULL ||
	    (f->cache_id == NULL && where->cache_id.dsize > 0)) {
		nc_why(why, NC_NT_NO_MEMORY, "out of memory");
		TALLOC_FREE(f);
		errno = ENOMEM;
		return NULL;
	}
	talloc_set_destructor(f, nodecache_files_destructor);
	(void)pthread_once(&atfork_once, nodecache_files_atfork);
	f->next = open_files;
	if (open_files != NULL) {
		open_files->prev = f;
	}
	open_files = f;

	f->records = nodecache_tdb_open(f->records_path, why);
	f->buckets = (f->records != NULL) ? nodecache_tdb_open(f->buckets_path, why) : NULL;
	if (f->buckets == NULL) {
		TALLOC_FREE(f);
		return NULL;
	}
	err = nc_state_open(&f->state, where->cache_dir);
	if (err != 0) {
		nc_why(why, NC_NT_INTERNAL_DB_ERROR, "the node agent's state in %s: %s",
		       where->cache_dir, strerror(err));
		TALLOC_FREE(f);
		errno = err;
		return NULL;
	}
	nc_records_init(&f->rules, &f->records, &f->buckets, &f->state,
			(TDB_DATA) { f->cache_id, where->cache_id.dsize }, where->op_timeout);
	f->rules.wipe_revision = where->wipe_revision;
	return f;
}

static int nodecache_hold_destructor(struct nodecache_hold *hold)
{
	if (--hold->files->holds == 0) {
		talloc_free(hold->files);
	}
	return 0;
}

struct nodecache_hold *nodecache_files_hold(TALLOC_CTX *mem_ctx,
					    const struct nodecache_where *where,
					    struct dbwrap_py_native_why *why)
{
	struct nodecache_hold *hold = talloc_zero(mem_ctx, struct nodecache_hold);
	struct nodecache_files *f;

	if (hold == NULL) {
		nc_why(why, NC_NT_NO_MEMORY, "out of memory");
		return NULL;
	}
	for (f = open_files; f != NULL; f = f->next) {
		if (strcmp(f->records_path, where->records_path) == 0) {
			break;
		}
	}
	if (f == NULL) {
		f = nodecache_files_open(where, why);
		if (f == NULL) {
			TALLOC_FREE(hold);
			return NULL;
		}
	}
	f->rules.wipe_revision = where->wipe_revision;
	f->rules.op_timeout = where->op_timeout;
	f->holds += 1;
	hold->files = f;
	talloc_set_destructor(hold, nodecache_hold_destructor);
	return hold;
}
