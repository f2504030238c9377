/*
 * proxy_fastpath = yes (the default): a node cache's records in this
 * process, without the daemon. A database without a write-back node cache
 * learns so at open (NODE_CACHE answers NOT_SUPPORTED) and sends every call.
 *
 * The node daemon names the node cache's local files (NODE_CACHE); this
 * process opens them itself (nodecache_files.c) and runs the node cache's
 * rules (c_core/nodecache_core.c) on them: a record the node owns is read,
 * locked and written here, under its tdb chainlock, with no round trip.
 * Only a record the node does not own goes to the daemon: MOVE_IN, with
 * the chainlock let go first, since the daemon writes the record under it
 * (and its one thread never waits for a chainlock: it answers "not yet",
 * and this process asks again after a pause, within proxy_timeout). A
 * record another node waits for is handed over by the daemon after the
 * unlock (HAND_OVER). Everything else (traverse, wipe, ...), and every call
 * while the daemon names no files, goes through the daemon as before.
 */

#include <string.h>
#include <time.h>
#include <unistd.h>

#include "locked_copy.h"
#include "log.h"
#include "nodecache_files.h"
#include "proxy_db.h"

#define TDB_REPLACE_FLAG 1 /* tdb.h's TDB_REPLACE; 0 means the same */
#define TDB_INSERT_FLAG 2
#define TDB_MODIFY_FLAG 3
#define PAUSE_FIRST_US 500   /* the first pause after "not yet" */
#define PAUSE_MOST_US 50000  /* pauses double up to this */

static int64_t fast_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static NTSTATUS fast_failed(struct dbwrap_py_db *db, const char *op, uint32_t code,
			    const struct dbwrap_py_native_why *why)
{
	NTSTATUS status = NT_STATUS(code);
	int level = NT_STATUS_EQUAL(status, NT_STATUS_NOT_FOUND)
		? DBWRAP_PY_LOG_ROUTINE : DBWRAP_PY_LOG_ERROR;

	dbwrap_py_log_level(level, db->name, op, "node cache: %s (NTSTATUS 0x%08x)",
			    why->text, (unsigned)code);
	return status;
}

/* -- the daemon's part ------------------------------------------------------ */

/* NODE_CACHE's reply fields; the strings are copied into mem_ctx (none ends in NUL). */
static NTSTATUS fast_where(struct dbwrap_py_db *db, TALLOC_CTX *mem_ctx,
			   struct proxy_reader *r, struct nodecache_where *where)
{
	const char **strings[] = { &where->records_path, &where->buckets_path,
				   &where->cache_dir };
	size_t i;

	for (i = 0; i < sizeof(strings) / sizeof(strings[0]); i++) {
		TDB_DATA s = proxy_get_bytes(r);

		if (s.dptr == NULL) { /* a field cut short: not "no memory" */
			return proxy_malformed(db, PROXY_NODE_CACHE);
		}
		*strings[i] = talloc_strndup(mem_ctx, (const char *)s.dptr, s.dsize);
		if (*strings[i] == NULL) {
			return NT_STATUS_NO_MEMORY;
		}
	}
	where->cache_id = proxy_get_bytes(r);
	where->wipe_revision = (int64_t)proxy_get_u64(r);
	where->op_timeout = proxy_get_u32(r) / 1000.0;
	return proxy_reply_read(db, PROXY_NODE_CACHE, r);
}

void proxy_fastpath_attach(struct dbwrap_py_db *db)
{
	TALLOC_CTX *tmp;
	struct proxy_reader r;
	struct nodecache_where where;
	struct dbwrap_py_native_why why;
	NTSTATUS status;

	if (proxy_conn_version(db->conn) < PROXY_FAST_PATH_VERSION) {
		dbwrap_py_log_level(DBWRAP_PY_LOG_INFO, db->name, "open",
				    "proxy_fastpath: the daemon speaks protocol 1; every call goes to it");
		TALLOC_FREE(db->fast);
		return;
	}
	tmp = talloc_new(db);
	status = proxy_call(db, tmp, PROXY_NODE_CACHE, NULL, NULL, db->timeout_ms, &r);
	if (NT_STATUS_IS_OK(status)) {
		status = fast_where(db, tmp, &r, &where);
	}
	if (NT_STATUS_EQUAL(status, NT_STATUS_NOT_SUPPORTED)) {
		TALLOC_FREE(db->fast); /* no node cache (the daemon's log line) */
	} else if (!NT_STATUS_IS_OK(status)) {
		/*
		 * A reopen that could not ask (a timeout, a malformed reply): the
		 * files stay held, since chainlocks this process holds live in them.
		 */
		dbwrap_py_log(db->name, "open", "proxy_fastpath: NODE_CACHE failed (%s); %s",
			      nt_errstr(status), db->fast != NULL ? "the files open before stay "
			      "in use" : "every call goes to the daemon");
	} else {
		/* the same files stay open: the locks this process holds stay with them */
		struct nodecache_hold *old = db->fast;

		db->fast = nodecache_files_hold(db, &where, &why);
		TALLOC_FREE(old);
		if (db->fast == NULL) {
			dbwrap_py_log(db->name, "open", "proxy_fastpath: %s; every call goes to "
				      "the daemon", why.text);
		}
	}
	talloc_free(tmp);
}

/*
 * The daemon moves key in. The node owns it when *owned; if not yet, this
 * pauses (doubling *pause_us) unless the call's time is up.
 */
static NTSTATUS fast_move_in(struct dbwrap_py_db *db, TDB_DATA key, int64_t deadline,
			     unsigned *pause_us)
{
	TALLOC_CTX *tmp = talloc_new(db);
	struct proxy_reader r;
	NTSTATUS status;
	uint8_t owned = 0;

	if (fast_now_ms() >= deadline) {
		dbwrap_py_log(db->name, "lock", "node cache: the record did not move to this "
			      "node within proxy_timeout (%u ms) (NTSTATUS 0x%08x)",
			      db->timeout_ms, (unsigned)NT_STATUS_V(NT_STATUS_IO_TIMEOUT));
		talloc_free(tmp);
		return NT_STATUS_IO_TIMEOUT;
	}
	status = proxy_call(db, tmp, PROXY_MOVE_IN, proxy_put_key, &key, db->timeout_ms, &r);
	if (NT_STATUS_IS_OK(status)) {
		owned = proxy_get_u8(&r);
		status = proxy_reply_read(db, PROXY_MOVE_IN, &r);
	}
	talloc_free(tmp);
	if (NT_STATUS_IS_OK(status) && !owned) {
		usleep(*pause_us);
		*pause_us = (*pause_us * 2 < PAUSE_MOST_US) ? *pause_us * 2 : PAUSE_MOST_US;
	}
	return status;
}

/* -- record operations ------------------------------------------------------ */

/* Through the daemon: no files, or a write traverse's record, which the daemon holds locked. */
static bool fast_bypassed(const struct dbwrap_py_db *db, TDB_DATA key)
{
	const TDB_DATA *held = db->daemon_locked;

	return db->fast == NULL ||
	       (held != NULL && held->dsize == key.dsize &&
		(key.dsize == 0 || memcmp(held->dptr, key.dptr, key.dsize) == 0));
}

static NTSTATUS fast_fetch(struct dbwrap_py_db *db, TDB_DATA key,
			   dbwrap_py_value_fn fn, void *private_data)
{
	int64_t deadline = fast_now_ms() + db->timeout_ms;
	unsigned pause_us = PAUSE_FIRST_US;
	NTSTATUS status = NT_STATUS_OK;
	bool ask_owner = true;

	while (NT_STATUS_IS_OK(status) && db->fast != NULL) {
		/* never fails: a record the node does not own only asks the owner */
		(void)nc_fetch(&db->fast->files->rules, key, fn, private_data, &ask_owner);
		if (!ask_owner) {
			return NT_STATUS_OK;
		}
		status = fast_move_in(db, key, deadline, &pause_us);
	}
	return NT_STATUS_IS_OK(status) ? proxy_records.fetch(db, key, fn, private_data) : status;
}

static NTSTATUS fast_lock(struct dbwrap_py_db *db, TDB_DATA key,
			  dbwrap_py_value_fn fn, void *private_data)
{
	int64_t deadline = fast_now_ms() + db->timeout_ms;
	unsigned pause_us = PAUSE_FIRST_US;
	struct dbwrap_py_native_why why;
	NTSTATUS status = NT_STATUS_OK;
	bool ask_owner;
	uint32_t code;

	while (NT_STATUS_IS_OK(status) && db->fast != NULL) {
		code = nc_lock_fetch(&db->fast->files->rules, key, fn, private_data, &ask_owner, &why);
		if (code != 0) {
			return fast_failed(db, "lock", code, &why);
		}
		if (!ask_owner) {
			return NT_STATUS_OK;
		}
		/* the daemon writes the record under this chainlock: let it go first */
		(void)nc_unlock(&db->fast->files->rules, key, &why);
		status = fast_move_in(db, key, deadline, &pause_us);
	}
	return NT_STATUS_IS_OK(status) ? proxy_records.lock(db, key, fn, private_data) : status;
}

static NTSTATUS fast_unlock(struct dbwrap_py_db *db, TDB_DATA key)
{
	struct dbwrap_py_native_why why;
	bool hand_over = false;
	uint32_t code;

	if (db->fast == NULL) {
		return proxy_records.unlock(db, key);
	}
	code = nc_unlock_check(&db->fast->files->rules, key, &hand_over, &why);
	if (code == 0) {
		code = nc_unlock(&db->fast->files->rules, key, &why);
	}
	if (code != 0) {
		return fast_failed(db, "unlock", code, &why);
	}
	if (hand_over) { /* a failure is logged; the agent hands it over too */
		(void)proxy_simple(db, PROXY_HAND_OVER, proxy_put_key, &key);
	}
	return NT_STATUS_OK;
}

static void fast_exists_fn(TDB_DATA value, bool found, void *private_data)
{
	*(bool *)private_data = found;
}

static NTSTATUS fast_exists(struct dbwrap_py_db *db, TDB_DATA key, bool *exists)
{
	*exists = false;
	return fast_fetch(db, key, fast_exists_fn, exists);
}

static NTSTATUS fast_storev(struct dbwrap_py_db *db, TDB_DATA key,
			    const TDB_DATA *dbufs, int num_dbufs, int flag)
{
	struct dbwrap_py_native_why why;
	bool exists = false;
	uint32_t code;

	if (fast_bypassed(db, key)) {
		return proxy_records.storev(db, key, dbufs, num_dbufs, flag);
	}
	if (flag == TDB_INSERT_FLAG || flag == TDB_MODIFY_FLAG) {
		NTSTATUS status = fast_exists(db, key, &exists);

		if (!NT_STATUS_IS_OK(status)) {
			return status;
		}
		if (flag == TDB_INSERT_FLAG && exists) {
			return NT_STATUS_OBJECT_NAME_COLLISION;
		}
		if (flag == TDB_MODIFY_FLAG && !exists) {
			return NT_STATUS_NOT_FOUND;
		}
	}
	code = nc_storev(&db->fast->files->rules, key, dbufs, num_dbufs, &why);
	return code == 0 ? NT_STATUS_OK : fast_failed(db, "store", code, &why);
}

static NTSTATUS fast_delete(struct dbwrap_py_db *db, TDB_DATA key)
{
	struct dbwrap_py_native_why why;
	uint32_t code;

	if (fast_bypassed(db, key)) {
		return proxy_records.delete_rec(db, key);
	}
	code = nc_delete(&db->fast->files->rules, key, &why);
	return code == 0 ? NT_STATUS_OK : fast_failed(db, "delete", code, &why);
}

/* A database that writes through never has the fast path (transport_proxy.c). */
static NTSTATUS fast_write_through(struct dbwrap_py_db *db, TDB_DATA key)
{
	if (fast_bypassed(db, key)) {
		return proxy_records.write_through(db, key);
	}
	dbwrap_py_log(db->name, "write through", "a record this process holds "
		      "in the fast path (opened without writes_through?) "
		      "(NTSTATUS 0x%08x)", (unsigned)NT_STATUS_V(NT_STATUS_NOT_SUPPORTED));
	return NT_STATUS_NOT_SUPPORTED;
}

static NTSTATUS fast_seqnum(struct dbwrap_py_db *db, int *seqnum)
{
	struct dbwrap_py_native_why why;
	uint32_t code;

	if (db->fast == NULL) {
		return proxy_records.seqnum(db, seqnum);
	}
	code = nc_seqnum(&db->fast->files->rules, seqnum, &why);
	return code == 0 ? NT_STATUS_OK : fast_failed(db, "seqnum", code, &why);
}

static NTSTATUS fast_locked(struct dbwrap_py_db *db, TDB_DATA key,
			    dbwrap_py_locked_fn fn, void *private_data)
{
	if (db->fast == NULL) {
		return proxy_records.locked(db, key, fn, private_data);
	}
	return dbwrap_py_locked_copying(&proxy_fast_records, db, db->name, key, fn,
					private_data);
}

const struct dbwrap_py_record_ops proxy_fast_records = {
	.name = "proxy+node cache",
	.defer_locked_stores = false,
	.fetch = fast_fetch,
	.lock = fast_lock,
	.unlock = fast_unlock,
	.locked = fast_locked,
	.storev = fast_storev,
	.delete_rec = fast_delete,
	.write_through = fast_write_through,
	.exists = fast_exists,
	.seqnum = fast_seqnum,
};
