/*
 * The proxy transport (dbwrap_py:transport = proxy): the adapter runs in the
 * node daemon (python/dbwrap_py/proxy/), reached over a unix socket, so
 * this process needs neither Python nor the database's client.
 *
 * Options read here, never sent on: proxy_socket (the daemon's socket,
 * DEFAULT_SOCKET unless given) and proxy_timeout (seconds, DEFAULT_TIMEOUT:
 * how long any call may wait for its reply, a record lock's wait included)
 * and proxy_fastpath (yes, the default: a write-back node cache's records
 * are reached in this process, proxy_fastpath.c; no: every call goes to the
 * daemon). The rest go to the daemon with the open.
 *
 * The record rules (locks per connection, nesting, stores under a lock,
 * transactions) live in the daemon; this file only carries the calls. A
 * database opens again by itself on a new connection (after fork, or after
 * the daemon restarted); what it held on the old one is gone, and the
 * daemon says so when asked to release it.
 */

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "log.h"
#include "options.h"
#include "proxy_db.h"

#define DEFAULT_SOCKET "/run/dbwrap_py/proxy.sock"
#define DEFAULT_TIMEOUT_MS 60000
/* a lock's reply may come this much after the daemon's own wait ends */
#define LOCK_REPLY_SLACK_MS 5000

/* -- requests --------------------------------------------------------------- */

static NTSTATUS proxy_open_handle(struct dbwrap_py_db *db);

/*
 * The connection the database was opened on was lost right after its OPEN
 * (NODE_CACHE failed on it): a request with its handle must not go out on
 * the next connection, where the handle names nothing and the daemon
 * hangs up.
 */
static NTSTATUS proxy_lost_handle(struct dbwrap_py_db *db, enum proxy_op op)
{
	dbwrap_py_log(db->name, proxy_op_name(op), "the connection to the proxy "
		      "daemon was lost as the database opened (NTSTATUS 0x%08x)",
		      (unsigned)NT_STATUS_V(NT_STATUS_DEVICE_NOT_READY));
	return NT_STATUS_DEVICE_NOT_READY;
}

/* An op the version agreed on this connection does not have: never sent. */
static NTSTATUS proxy_too_old(struct dbwrap_py_db *db, enum proxy_op op)
{
	dbwrap_py_log(db->name, proxy_op_name(op), "the daemon speaks protocol %u, "
		      "without %s (protocol %u): update it (NTSTATUS 0x%08x)",
		      (unsigned)proxy_conn_version(db->conn), proxy_op_name(op),
		      (unsigned)proxy_op_version(op),
		      (unsigned)NT_STATUS_V(NT_STATUS_NOT_SUPPORTED));
	return NT_STATUS_NOT_SUPPORTED;
}

NTSTATUS proxy_call(struct dbwrap_py_db *db, TALLOC_CTX *mem_ctx,
		    enum proxy_op op, proxy_put_fn put, const void *arg,
		    unsigned timeout_ms, struct proxy_reader *r)
{
	struct proxy_writer w;

	if (db->generation != proxy_conn_generation(db->conn)) {
		NTSTATUS status = proxy_open_handle(db);

		if (!NT_STATUS_IS_OK(status)) {
			return status;
		}
	}
	if (db->generation != proxy_conn_generation(db->conn)) {
		/* lost after the OPEN (its NODE_CACHE): the handle went with it */
		return proxy_lost_handle(db, op);
	}
	/* after the open: a new connection may have agreed another version */
	if (proxy_conn_version(db->conn) < proxy_op_version(op)) {
		return proxy_too_old(db, op);
	}
	proxy_writer_request(&w, mem_ctx, op, db->handle);
	if (put != NULL) {
		put(&w, arg);
	}
	return proxy_conn_call(db->conn, db->name, op, &w, timeout_ms, mem_ctx, r);
}

/* A reply whose fields are not what the op promises. */
NTSTATUS proxy_malformed(struct dbwrap_py_db *db, enum proxy_op op)
{
	dbwrap_py_log(db->name, proxy_op_name(op),
		      "malformed reply from the proxy daemon (NTSTATUS 0x%08x)",
		      (unsigned)NT_STATUS_V(NT_STATUS_INTERNAL_DB_ERROR));
	return NT_STATUS_INTERNAL_DB_ERROR;
}

/* The reply's fields were all read, and nothing follows them. */
NTSTATUS proxy_reply_read(struct dbwrap_py_db *db, enum proxy_op op,
			  struct proxy_reader *r)
{
	return proxy_reader_done(r) ? NT_STATUS_OK : proxy_malformed(db, op);
}

/* An op whose reply has no fields. */
NTSTATUS proxy_simple(struct dbwrap_py_db *db, enum proxy_op op,
		      proxy_put_fn put, const void *arg)
{
	TALLOC_CTX *tmp = talloc_new(db);
	struct proxy_reader r;
	NTSTATUS status = proxy_call(db, tmp, op, put, arg, db->timeout_ms, &r);

	if (NT_STATUS_IS_OK(status)) {
		status = proxy_reply_read(db, op, &r);
	}
	talloc_free(tmp);
	return status;
}

void proxy_put_key(struct proxy_writer *w, const void *arg)
{
	proxy_put_bytes(w, *(const TDB_DATA *)arg);
}

struct proxy_key_wait {
	TDB_DATA key;
	uint32_t wait_ms;
};

static void put_key_wait(struct proxy_writer *w, const void *arg)
{
	const struct proxy_key_wait *a = arg;

	proxy_put_bytes(w, a->key);
	proxy_put_u32(w, a->wait_ms);
}

static void put_u32(struct proxy_writer *w, const void *arg)
{
	proxy_put_u32(w, *(const uint32_t *)arg);
}

static void put_u8(struct proxy_writer *w, const void *arg)
{
	proxy_put_u8(w, *(const uint8_t *)arg);
}

/* -- open / close ----------------------------------------------------------- */

static void put_open_args(struct proxy_writer *w,
			  const struct dbwrap_py_open_args *a)
{
	uint32_t n = 0, i;

	proxy_put_str(w, a->name);
	proxy_put_u32(w, (uint32_t)a->hash_size);
	proxy_put_u32(w, (uint32_t)a->tdb_flags);
	proxy_put_u32(w, (uint32_t)a->open_flags);
	proxy_put_u32(w, (uint32_t)a->mode);
	proxy_put_u32(w, (uint32_t)a->lock_order);
	proxy_put_u64(w, a->dbwrap_flags);
	proxy_put_str(w, a->adapter != NULL ? a->adapter : "");
	while (a->options != NULL && a->options[n] != NULL) {
		n++;
	}
	proxy_put_u32(w, n);
	for (i = 0; i < n; i++) {
		proxy_put_str(w, a->options[i]);
	}
}

/* OPEN on the current connection; the handle it gives is ours until it changes. */
static NTSTATUS proxy_open_handle(struct dbwrap_py_db *db)
{
	TALLOC_CTX *tmp = talloc_new(db);
	struct proxy_writer w;
	struct proxy_reader r;
	NTSTATUS status;
	uint32_t handle;

	/* not proxy_call: OPEN names no handle, and must not open first */
	proxy_writer_request(&w, tmp, PROXY_OPEN, 0);
	put_open_args(&w, &db->args);
	status = proxy_conn_call(db->conn, db->name, PROXY_OPEN, &w,
				 db->timeout_ms, tmp, &r);
	if (NT_STATUS_IS_OK(status)) {
		handle = proxy_get_u32(&r);
		status = proxy_reply_read(db, PROXY_OPEN, &r);
		if (NT_STATUS_IS_OK(status) && handle == 0) {
			status = proxy_malformed(db, PROXY_OPEN);
		}
		if (NT_STATUS_IS_OK(status)) {
			db->handle = handle;
			db->generation = proxy_conn_generation(db->conn);
		}
	}
	talloc_free(tmp);
	if (NT_STATUS_IS_OK(status) && db->want_fastpath) {
		proxy_fastpath_attach(db); /* without it, every call goes to the daemon */
	}
	return status;
}

static int proxy_db_destructor(struct dbwrap_py_db *db)
{
	/* on an old connection the handle is gone already */
	if (db->generation == proxy_conn_generation(db->conn)) {
		(void)proxy_simple(db, PROXY_CLOSE, NULL, NULL);
	}
	return 0;
}

static bool proxy_parse_timeout(const char *text, unsigned *ms)
{
	char *end = NULL;
	double seconds;

	if (text == NULL) {
		*ms = DEFAULT_TIMEOUT_MS;
		return true;
	}
	errno = 0;
	seconds = strtod(text, &end);
	if (errno != 0 || end == text || *end != '\0' || !(seconds > 0) ||
	    seconds > 86400) {
		return false;
	}
	*ms = (unsigned)(seconds * 1000);
	return true;
}

/* proxy_fastpath: on unless turned off (NULL: not given). */
static bool proxy_parse_bool(const char *text, bool *value)
{
	static const char *const yes[] = { "yes", "true", "on", "1" };
	static const char *const no[] = { "no", "false", "off", "0", "" };
	size_t i;

	*value = true;
	if (text == NULL) {
		return true;
	}
	for (i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
		if (strcasecmp(text, yes[i]) == 0) {
			*value = true;
			return true;
		}
	}
	for (i = 0; i < sizeof(no) / sizeof(no[0]); i++) {
		if (strcasecmp(text, no[i]) == 0) {
			*value = false;
			return true;
		}
	}
	return false;
}

/* The proxy_* options out of the list: what is left goes to the daemon. */
static NTSTATUS proxy_take_options(struct dbwrap_py_db *db,
				   const char **socket_path)
{
	const char *const *rest = NULL, *const *after = NULL, *const *last = NULL;
	const char *timeout, *fastpath;

	*socket_path = dbwrap_py_option_take(db, db->args.options,
					     "proxy_socket", &rest);
	timeout = dbwrap_py_option_take(db, rest, "proxy_timeout", &after);
	fastpath = (after != NULL)
		? dbwrap_py_option_take(db, after, "proxy_fastpath", &last) : NULL;
	if (rest == NULL || after == NULL || last == NULL) {
		return NT_STATUS_NO_MEMORY;
	}
	if (!proxy_parse_bool(fastpath, &db->want_fastpath)) {
		dbwrap_py_log(db->name, "open",
			      "proxy_fastpath=%s is neither yes nor no (NTSTATUS 0x%08x)",
			      fastpath, (unsigned)NT_STATUS_V(NT_STATUS_INVALID_PARAMETER));
		return NT_STATUS_INVALID_PARAMETER;
	}
	if (!proxy_parse_timeout(timeout, &db->timeout_ms)) {
		dbwrap_py_log(db->name, "open",
			      "proxy_timeout=%s is not a number of seconds in "
			      "(0, 86400] (NTSTATUS 0x%08x)", timeout,
			      (unsigned)NT_STATUS_V(NT_STATUS_INVALID_PARAMETER));
		return NT_STATUS_INVALID_PARAMETER;
	}
	if (*socket_path == NULL || **socket_path == '\0') {
		*socket_path = DEFAULT_SOCKET;
	}
	if (db->args.writes_through) {
		db->want_fastpath = false; /* the daemon writes the records through */
	}
	/* the caller's strings go with its open; we open again after a fork */
	db->args.options = dbwrap_py_options_copy(db, last);
	return (db->args.options != NULL) ? NT_STATUS_OK : NT_STATUS_NO_MEMORY;
}

/* -- record operations ------------------------------------------------------ */

/* FETCH or LOCK: the reply is an optional value, handed to fn. */
static NTSTATUS proxy_read(struct dbwrap_py_db *db, enum proxy_op op,
			   TDB_DATA key, dbwrap_py_value_fn fn,
			   void *private_data)
{
	TALLOC_CTX *tmp = talloc_new(db);
	/* a LOCK carries the daemon's wait, and its reply may take that long */
	struct proxy_key_wait lock = { .key = key, .wait_ms = db->timeout_ms };
	bool locking = (op == PROXY_LOCK);
	struct proxy_reader r;
	NTSTATUS status = proxy_call(
		db, tmp, op, locking ? put_key_wait : proxy_put_key,
		locking ? (const void *)&lock : (const void *)&key,
		db->timeout_ms + (locking ? LOCK_REPLY_SLACK_MS : 0), &r);
	TDB_DATA value;
	bool exists;

	if (NT_STATUS_IS_OK(status)) {
		value = proxy_get_opt(&r, &exists);
		status = proxy_reply_read(db, op, &r);
		if (NT_STATUS_IS_OK(status)) {
			fn(value, exists, private_data);
		}
	}
	talloc_free(tmp);
	return status;
}

static NTSTATUS proxy_fetch(struct dbwrap_py_db *db, TDB_DATA key,
			    dbwrap_py_value_fn fn, void *private_data)
{
	return proxy_read(db, PROXY_FETCH, key, fn, private_data);
}

static NTSTATUS proxy_lock(struct dbwrap_py_db *db, TDB_DATA key,
			   dbwrap_py_value_fn fn, void *private_data)
{
	return proxy_read(db, PROXY_LOCK, key, fn, private_data);
}

/* The fields of UNLOCK (the value to store first, if any) and of STORE. */
struct proxy_write_args {
	TDB_DATA key;
	const TDB_DATA *dbufs; /* NULL: an UNLOCK that stores nothing */
	int num_dbufs;
	int flag;
};

static void put_unlock(struct proxy_writer *w, const void *arg)
{
	const struct proxy_write_args *a = arg;

	proxy_put_bytes(w, a->key);
	proxy_put_u8(w, a->dbufs != NULL);
	if (a->dbufs != NULL) {
		proxy_put_bytesv(w, a->dbufs, a->num_dbufs);
	}
}

static void put_store(struct proxy_writer *w, const void *arg)
{
	const struct proxy_write_args *a = arg;

	proxy_put_bytes(w, a->key);
	proxy_put_u32(w, (uint32_t)a->flag);
	proxy_put_bytesv(w, a->dbufs, a->num_dbufs);
}

static NTSTATUS proxy_unlock_storing(struct dbwrap_py_db *db, TDB_DATA key,
				     const TDB_DATA *value)
{
	struct proxy_write_args a = { .key = key, .dbufs = value, .num_dbufs = 1 };

	return proxy_simple(db, PROXY_UNLOCK, put_unlock, &a);
}

static NTSTATUS proxy_unlock(struct dbwrap_py_db *db, TDB_DATA key)
{
	return proxy_unlock_storing(db, key, NULL);
}

struct proxy_locked_state {
	dbwrap_py_locked_fn fn;
	void *private_data;
	const TDB_DATA *write;
};

static void proxy_locked_value(TDB_DATA value, bool exists, void *private_data)
{
	struct proxy_locked_state *s = private_data;

	s->write = s->fn(value, exists, s->private_data);
}

/* do_locked: two round trips, the store riding on the unlock. */
static NTSTATUS proxy_locked(struct dbwrap_py_db *db, TDB_DATA key,
			     dbwrap_py_locked_fn fn, void *private_data)
{
	struct proxy_locked_state s = { .fn = fn, .private_data = private_data };
	NTSTATUS status = proxy_lock(db, key, proxy_locked_value, &s);

	return NT_STATUS_IS_OK(status)
		? proxy_unlock_storing(db, key, s.write) : status;
}

static NTSTATUS proxy_storev(struct dbwrap_py_db *db, TDB_DATA key,
			     const TDB_DATA *dbufs, int num_dbufs, int flag)
{
	struct proxy_write_args a = {
		.key = key, .dbufs = dbufs, .num_dbufs = num_dbufs, .flag = flag,
	};

	return proxy_simple(db, PROXY_STORE, put_store, &a);
}

static NTSTATUS proxy_delete_rec(struct dbwrap_py_db *db, TDB_DATA key)
{
	return proxy_simple(db, PROXY_DELETE, proxy_put_key, &key);
}

/* proxy_call refuses it on a connection older than PROXY_WRITE_THROUGH_VERSION */
static NTSTATUS proxy_write_through(struct dbwrap_py_db *db, TDB_DATA key)
{
	return proxy_simple(db, PROXY_WRITE_THROUGH, proxy_put_key, &key);
}

/* An op whose reply is one number: EXISTS (u8) and SEQNUM (i32). */
static NTSTATUS proxy_number(struct dbwrap_py_db *db, enum proxy_op op,
			     const TDB_DATA *key, uint32_t *out)
{
	TALLOC_CTX *tmp = talloc_new(db);
	struct proxy_reader r;
	NTSTATUS status = proxy_call(db, tmp, op, key != NULL ? proxy_put_key : NULL,
				     key, db->timeout_ms, &r);

	if (NT_STATUS_IS_OK(status)) {
		*out = (op == PROXY_EXISTS) ? proxy_get_u8(&r) : proxy_get_u32(&r);
		status = proxy_reply_read(db, op, &r);
	}
	talloc_free(tmp);
	return status;
}

static NTSTATUS proxy_exists(struct dbwrap_py_db *db, TDB_DATA key,
			     bool *exists)
{
	uint32_t v = 0;
	NTSTATUS status = proxy_number(db, PROXY_EXISTS, &key, &v);

	*exists = (v != 0);
	return status;
}

static NTSTATUS proxy_seqnum(struct dbwrap_py_db *db, int *seqnum)
{
	uint32_t v = 0;
	NTSTATUS status = proxy_number(db, PROXY_SEQNUM, NULL, &v);

	*seqnum = (int)v;
	return status;
}

const struct dbwrap_py_record_ops proxy_records = {
	.name = "proxy",
	.defer_locked_stores = true,
	.fetch = proxy_fetch,
	.lock = proxy_lock,
	.unlock = proxy_unlock,
	.locked = proxy_locked,
	.storev = proxy_storev,
	.delete_rec = proxy_delete_rec,
	.write_through = proxy_write_through,
	.exists = proxy_exists,
	.seqnum = proxy_seqnum,
};

/* -- open ------------------------------------------------------------------- */

static NTSTATUS proxy_open(TALLOC_CTX *mem_ctx,
			   const struct dbwrap_py_open_args *args,
			   struct dbwrap_py_db **pdb,
			   const struct dbwrap_py_record_ops **records)
{
	struct dbwrap_py_db *db = talloc_zero(mem_ctx, struct dbwrap_py_db);
	const char *socket_path = NULL;
	NTSTATUS status;

	if (db == NULL) {
		return NT_STATUS_NO_MEMORY;
	}
	db->args = *args;
	db->name = db->args.name = talloc_strdup(db, args->name);
	db->args.adapter = talloc_strdup(db, args->adapter != NULL ? args->adapter : "");
	if (db->name == NULL || db->args.adapter == NULL) {
		TALLOC_FREE(db);
		return NT_STATUS_NO_MEMORY;
	}
	status = proxy_take_options(db, &socket_path);
	if (NT_STATUS_IS_OK(status)) {
		db->conn = proxy_conn_get(socket_path);
		if (db->conn == NULL) {
			dbwrap_py_log(db->name, "open", "proxy_socket=%s: %s",
				      socket_path, strerror(errno));
			status = NT_STATUS_INVALID_PARAMETER;
		}
	}
	if (NT_STATUS_IS_OK(status)) {
		status = proxy_open_handle(db);
	}
	if (!NT_STATUS_IS_OK(status)) {
		TALLOC_FREE(db);
		return status;
	}
	talloc_set_destructor(db, proxy_db_destructor);
	*pdb = db;
	*records = db->want_fastpath ? &proxy_fast_records : &proxy_records;
	return NT_STATUS_OK;
}

/* -- traverse --------------------------------------------------------------- */

/* TRAVERSE_NEXT: *more false at the end; key and value live in mem_ctx. */
static NTSTATUS proxy_traverse_next(struct dbwrap_py_db *db, uint32_t id,
				    TALLOC_CTX *mem_ctx, bool *more,
				    TDB_DATA *key, TDB_DATA *value)
{
	struct proxy_reader r;
	/* the daemon may wait for the record's lock */
	NTSTATUS status = proxy_call(db, mem_ctx, PROXY_TRAVERSE_NEXT, put_u32, &id,
				     db->timeout_ms + LOCK_REPLY_SLACK_MS, &r);

	if (!NT_STATUS_IS_OK(status)) {
		return status;
	}
	*more = proxy_get_u8(&r) != 0;
	if (*more) {
		*key = proxy_get_bytes(&r);
		*value = proxy_get_bytes(&r);
	}
	return proxy_reply_read(db, PROXY_TRAVERSE_NEXT, &r);
}

static NTSTATUS proxy_traverse_start(struct dbwrap_py_db *db, bool write,
				     uint32_t *id)
{
	TALLOC_CTX *tmp = talloc_new(db);
	uint8_t writing = write;
	struct proxy_reader r;
	NTSTATUS status = proxy_call(db, tmp, PROXY_TRAVERSE_START, put_u8,
				     &writing, db->timeout_ms, &r);

	if (NT_STATUS_IS_OK(status)) {
		*id = proxy_get_u32(&r);
		status = proxy_reply_read(db, PROXY_TRAVERSE_START, &r);
	}
	talloc_free(tmp);
	return status;
}

/* fn runs between two requests, so it may call back into this database. */
static NTSTATUS proxy_traverse(struct dbwrap_py_db *db, bool write,
			       dbwrap_py_record_fn fn, void *private_data,
			       int *count)
{
	uint64_t generation;
	NTSTATUS status;
	TALLOC_CTX *tmp;
	TDB_DATA key, value;
	uint32_t id;
	bool more = true, stop;

	status = proxy_traverse_start(db, write, &id);
	generation = db->generation;
	while (NT_STATUS_IS_OK(status)) {
		if (generation != db->generation) {
			/* fn's own calls found the daemon gone: the traverse is too */
			dbwrap_py_log(db->name, "traverse",
				      "the connection to the proxy daemon was lost "
				      "(NTSTATUS 0x%08x)",
				      (unsigned)NT_STATUS_V(NT_STATUS_DEVICE_NOT_READY));
			return NT_STATUS_DEVICE_NOT_READY;
		}
		tmp = talloc_new(db);
		status = proxy_traverse_next(db, id, tmp, &more, &key, &value);
		if (NT_STATUS_IS_OK(status) && more) {
			*count += 1;
			/* the daemon holds this record: fn's writes to it go there */
			db->daemon_locked = write ? &key : NULL;
			stop = fn(key, value, private_data) != 0;
			db->daemon_locked = NULL;
			if (stop) {
				more = false;
				if (generation == proxy_conn_generation(db->conn)) {
					status = proxy_simple(db, PROXY_TRAVERSE_END,
							      put_u32, &id);
				}
			}
		}
		talloc_free(tmp);
		if (!more) {
			break;
		}
	}
	return status;
}

/* -- database-wide ---------------------------------------------------------- */

static NTSTATUS proxy_transaction(struct dbwrap_py_db *db,
				  enum dbwrap_py_txn_op op)
{
	uint8_t code;

	switch (op) {
	case DBWRAP_PY_TXN_START: code = PROXY_TXN_START; break;
	case DBWRAP_PY_TXN_START_NONBLOCK: code = PROXY_TXN_START_NONBLOCK; break;
	case DBWRAP_PY_TXN_COMMIT: code = PROXY_TXN_COMMIT; break;
	case DBWRAP_PY_TXN_CANCEL: code = PROXY_TXN_CANCEL; break;
	default: return NT_STATUS_INVALID_PARAMETER;
	}
	return proxy_simple(db, PROXY_TRANSACTION, put_u8, &code);
}

static NTSTATUS proxy_wipe(struct dbwrap_py_db *db)
{
	return proxy_simple(db, PROXY_WIPE, NULL, NULL);
}

static NTSTATUS proxy_check(struct dbwrap_py_db *db)
{
	return proxy_simple(db, PROXY_CHECK, NULL, NULL);
}

static NTSTATUS proxy_db_id(struct dbwrap_py_db *db, TALLOC_CTX *mem_ctx,
			    uint8_t **id, size_t *idlen)
{
	TALLOC_CTX *tmp = talloc_new(db);
	struct proxy_reader r;
	NTSTATUS status = proxy_call(db, tmp, PROXY_DB_ID, NULL, NULL,
				     db->timeout_ms, &r);
	TDB_DATA got = { 0 };

	if (NT_STATUS_IS_OK(status)) {
		got = proxy_get_bytes(&r);
		status = proxy_reply_read(db, PROXY_DB_ID, &r);
	}
	if (NT_STATUS_IS_OK(status)) {
		if (got.dsize == 0) {
			status = proxy_malformed(db, PROXY_DB_ID);
		} else {
			*id = talloc_memdup(mem_ctx, got.dptr, got.dsize);
			*idlen = got.dsize;
			status = (*id != NULL) ? NT_STATUS_OK : NT_STATUS_NO_MEMORY;
		}
	}
	talloc_free(tmp);
	return status;
}

const struct dbwrap_py_transport dbwrap_py_transport_proxy = {
	.name = "proxy",
	.open = proxy_open,
	.traverse = proxy_traverse,
	.transaction = proxy_transaction,
	.wipe = proxy_wipe,
	.check = proxy_check,
	.db_id = proxy_db_id,
};
