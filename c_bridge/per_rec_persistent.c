/*
 * Per-record persistence (Samba 4.25's DBWRAP_FLAG_PER_REC_PERSISTENT), the
 * same for every adapter, because it is built here from two ordinary
 * bridge databases on that adapter.
 *
 * Samba opens smbXsrv_open_global, locking and brlock so when "persistent
 * handles" is on. They are volatile (CLEAR_IF_FIRST), but a record stored
 * with DBWRAP_STORE_PERSISTENT must outlive their clearing at an smbd
 * restart: a persistent handle's open and its locks are reclaimed after it.
 * What Samba's dbwrap_tdb does, and what this layer does in its format (so
 * that the tdb adapter's files are native 4.25 ones):
 * - every value in the volatile database carries a 16-byte header: version
 *   1, flags (bit 0: the record is persistent), two reserved words, in host
 *   order; the header is hidden from every caller, who sees the record's
 *   persistence as db_record.flags.persistent;
 * - "<dir>/<base>_persistent.tdb" (persistent) keeps a copy of each
 *   persistent record, written in a transaction before the store returns:
 *   on a replicated backend, its quorum write; a node cache never holds it
 *   (it caches volatile databases only);
 * - a plain store or a delete of a persistent record removes the copy;
 * - a persistent record, and the next write of it (a plain store or a
 *   delete), is written through to the backend before the store returns,
 *   as is a restored one: with a write-back node cache the volatile
 *   database's records stay on the node, and a survivor of that node must
 *   find its persistent opens and locks (prp_write_through);
 * - a read-write open of a volatile database without the migration marker
 *   record (a cleared one) stores the copies back, then the marker; the
 *   marker's record lock keeps concurrent openers waiting meanwhile;
 * - wipe clears the volatile database (wipe_default) and the copies
 *   (wipe_persistent_backup_db, DBWRAP_DROP_PERSISTENT) as asked;
 *   traverse_per_rec_persistent_read visits the copies.
 */

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <time.h>

#include "db_ops.h"
#include "dbwrap_py.h"
#include "log.h"
#include "per_rec_persistent.h"

#if DBWRAP_PY_SAMBA_4_25_LAYOUT

#define PRP_HEADER_VERSION 1
#define PRP_FLAG_PERSISTENT 0x1
#define PRP_TDB_STORE_FLAGS 0x3 /* TDB_REPLACE, TDB_INSERT, TDB_MODIFY */
#define PRP_MARKER "DBWRAP_PERSISTENT_MIGRATION_MARKER"

struct prp_header {
	uint32_t version;
	uint32_t flags;
	uint32_t reserved[2];
};

struct prp_ctx {
	struct db_context *volatile_db; /* values with headers */
	struct db_context *backup;	/* <base>_persistent.tdb */
	const char *name;
};

static struct prp_ctx *prp_ctx(struct db_context *db)
{
	return talloc_get_type_abort(db->private_data, struct prp_ctx);
}

static const TDB_DATA prp_marker_key = {
	.dptr = (uint8_t *)PRP_MARKER, .dsize = sizeof(PRP_MARKER),
};

static bool prp_is_marker(TDB_DATA key)
{
	return key.dsize == prp_marker_key.dsize &&
	       memcmp(key.dptr, prp_marker_key.dptr, key.dsize) == 0;
}

/* A stored value without its header; false for one that has none. */
static bool prp_split(TDB_DATA stored, TDB_DATA *value, bool *persistent)
{
	struct prp_header h;

	*persistent = false;
	if (stored.dsize == 0) {
		*value = stored;
		return true;
	}
	if (stored.dsize < sizeof(h)) {
		return false;
	}
	memcpy(&h, stored.dptr, sizeof(h));
	if (h.version != PRP_HEADER_VERSION) {
		return false;
	}
	*persistent = (h.flags & PRP_FLAG_PERSISTENT) != 0;
	*value = (TDB_DATA) { .dptr = stored.dptr + sizeof(h),
			      .dsize = stored.dsize - sizeof(h) };
	return true;
}

static void prp_log_bad_record(struct prp_ctx *ctx, const char *op)
{
	dbwrap_py_log(ctx->name, op, "a record without the per-record header "
		      "(written by something other than a 4.25 opener?)");
}

/* -- the copies ------------------------------------------------------------ */

/* Store (num_dbufs > 0) or delete the copy of `key`, in one transaction. */
static NTSTATUS prp_backup_write(struct prp_ctx *ctx, TDB_DATA key,
				 const TDB_DATA *dbufs, int num_dbufs)
{
	struct db_context *b = ctx->backup;
	const char *op = num_dbufs > 0 ? "persistent store" : "persistent delete";
	struct db_record *rec;
	NTSTATUS status;

	if (b->transaction_start(b) != 0) {
		dbwrap_py_log(ctx->name, op, "the copy's transaction did not start");
		return NT_STATUS_INTERNAL_DB_ERROR;
	}
	rec = b->fetch_locked(b, ctx, key);
	if (rec == NULL) {
		status = NT_STATUS_INTERNAL_DB_ERROR;
	} else if (num_dbufs > 0) {
		status = rec->storev(rec, dbufs, num_dbufs, 0);
	} else {
		status = (rec->value.dsize == 0) ? NT_STATUS_OK
						 : rec->delete_rec(rec);
	}
	TALLOC_FREE(rec);
	if (!NT_STATUS_IS_OK(status)) {
		b->transaction_cancel(b);
		dbwrap_py_log(ctx->name, op, "the copy was not written: %s",
			      nt_errstr(status));
		return status;
	}
	if (b->transaction_commit(b) != 0) {
		dbwrap_py_log(ctx->name, op, "the copy's commit failed");
		return NT_STATUS_INTERNAL_DB_ERROR;
	}
	return NT_STATUS_OK;
}

/* -- records ----------------------------------------------------------------- */

/*
 * A persistent record, and every write of a record that was persistent, is
 * in the backend before the store returns, even where a write-back node
 * cache keeps the volatile database's records on the node: a survivor must
 * find the open of a node that died, and must not find one that its client
 * closed. The copy (prp_backup_write) only outlives a restart of this node.
 */
static NTSTATUS prp_write_through(struct prp_ctx *ctx, struct db_record *inner,
				  const char *op)
{
	NTSTATUS status = dbwrap_py_record_write_through(inner);

	if (!NT_STATUS_IS_OK(status)) {
		dbwrap_py_log(ctx->name, op, "the record was not written "
			      "through to the backend: %s", nt_errstr(status));
	}
	return status;
}

/* Every outer record's private_data is the volatile database's record. */
static NTSTATUS prp_storev(struct db_record *rec, const TDB_DATA *dbufs,
			   int num_dbufs, int flag)
{
	struct prp_ctx *ctx = prp_ctx(rec->db);
	struct db_record *inner = rec->private_data;
	bool persistent = (flag & DBWRAP_STORE_PERSISTENT) != 0;
	struct prp_header h = {
		.version = PRP_HEADER_VERSION,
		.flags = persistent ? PRP_FLAG_PERSISTENT : 0,
	};
	TDB_DATA *bufs;
	NTSTATUS status;

	if (num_dbufs < 0) {
		return NT_STATUS_INVALID_PARAMETER;
	}
	bufs = talloc_array(ctx, TDB_DATA, num_dbufs + 1);
	if (bufs == NULL) {
		return NT_STATUS_NO_MEMORY;
	}
	bufs[0] = (TDB_DATA) { .dptr = (uint8_t *)&h, .dsize = sizeof(h) };
	if (num_dbufs > 0) {
		memcpy(&bufs[1], dbufs, num_dbufs * sizeof(TDB_DATA));
	}
	status = inner->storev(inner, bufs, num_dbufs + 1,
			       flag & PRP_TDB_STORE_FLAGS);
	if (NT_STATUS_IS_OK(status) && (persistent || rec->flags.persistent)) {
		status = prp_write_through(ctx, inner, "persistent store");
	}
	if (NT_STATUS_IS_OK(status) && (persistent || rec->flags.persistent)) {
		status = prp_backup_write(ctx, rec->key, bufs,
					  persistent ? num_dbufs + 1 : 0);
	}
	if (NT_STATUS_IS_OK(status)) {
		rec->flags.persistent = persistent;
	}
	TALLOC_FREE(bufs);
	return status;
}

static NTSTATUS prp_delete(struct db_record *rec)
{
	struct db_record *inner = rec->private_data;
	NTSTATUS status = NT_STATUS_OK;

	if (rec->flags.persistent) {
		status = prp_backup_write(prp_ctx(rec->db), rec->key, NULL, 0);
	}
	if (NT_STATUS_IS_OK(status)) {
		status = inner->delete_rec(inner);
	}
	if (NT_STATUS_IS_OK(status) && rec->flags.persistent) {
		status = prp_write_through(prp_ctx(rec->db), inner,
					   "persistent delete");
	}
	if (NT_STATUS_IS_OK(status)) {
		rec->flags.persistent = false;
	}
	return status;
}

static NTSTATUS prp_storev_denied(struct db_record *rec, const TDB_DATA *dbufs,
				  int num_dbufs, int flag)
{
	return NT_STATUS_MEDIA_WRITE_PROTECTED;
}

static NTSTATUS prp_delete_denied(struct db_record *rec)
{
	return NT_STATUS_MEDIA_WRITE_PROTECTED;
}

/* The caller's view of `inner`: its value without the header. */
static bool prp_wrap(struct db_record *rec, struct db_context *db,
		     struct db_record *inner, TDB_DATA stored, bool writable)
{
	TDB_DATA value;
	bool persistent;

	if (!prp_split(stored, &value, &persistent)) {
		return false;
	}
	*rec = (struct db_record) {
		.db = db,
		.key = inner->key,
		.value = value,
		.value_valid = inner->value_valid,
		.storev = writable ? prp_storev : prp_storev_denied,
		.delete_rec = writable ? prp_delete : prp_delete_denied,
		.flags = { .persistent = persistent },
		.private_data = inner,
	};
	return true;
}

static struct db_record *prp_fetch_locked(struct db_context *db,
					  TALLOC_CTX *mem_ctx, TDB_DATA key)
{
	struct prp_ctx *ctx = prp_ctx(db);
	struct db_record *rec = talloc(mem_ctx, struct db_record);
	struct db_record *inner;

	if (rec == NULL) {
		return NULL;
	}
	/* a child of the outer record: freeing that unlocks */
	inner = ctx->volatile_db->fetch_locked(ctx->volatile_db, rec, key);
	if (inner == NULL) {
		TALLOC_FREE(rec);
		return NULL;
	}
	if (!prp_wrap(rec, db, inner, inner->value, true)) {
		prp_log_bad_record(ctx, "fetch_locked");
		TALLOC_FREE(rec);
		return NULL;
	}
	return rec;
}

struct prp_do_locked_state {
	struct db_context *db;
	dbwrap_do_locked_fn fn;
	void *private_data;
	NTSTATUS status;
};

static void prp_do_locked_fn(struct db_record *inner, TDB_DATA stored,
			     void *private_data)
{
	struct prp_do_locked_state *state = private_data;
	struct db_record rec;

	if (!prp_wrap(&rec, state->db, inner, stored, true)) {
		prp_log_bad_record(prp_ctx(state->db), "do_locked");
		state->status = NT_STATUS_INTERNAL_DB_CORRUPTION;
		return;
	}
	state->fn(&rec, rec.value, state->private_data);
}

static NTSTATUS prp_do_locked(struct db_context *db, TDB_DATA key,
			      dbwrap_do_locked_fn fn, void *private_data)
{
	struct prp_ctx *ctx = prp_ctx(db);
	struct prp_do_locked_state state = {
		.db = db, .fn = fn, .private_data = private_data,
		.status = NT_STATUS_OK,
	};
	NTSTATUS status;

	status = ctx->volatile_db->do_locked(ctx->volatile_db, key,
					     prp_do_locked_fn, &state);
	return NT_STATUS_IS_OK(status) ? state.status : status;
}

struct prp_parse_state {
	struct prp_ctx *ctx;
	dbwrap_parser_fn parser;
	void *private_data;
	NTSTATUS status;
};

static void prp_parser(TDB_DATA key, TDB_DATA stored, void *private_data)
{
	struct prp_parse_state *state = private_data;
	TDB_DATA value;
	bool persistent;

	if (!prp_split(stored, &value, &persistent)) {
		prp_log_bad_record(state->ctx, "parse_record");
		state->status = NT_STATUS_INTERNAL_DB_CORRUPTION;
		return;
	}
	if (state->parser != NULL) {
		state->parser(key, value, state->private_data);
	}
}

static NTSTATUS prp_parse_record(struct db_context *db, TDB_DATA key,
				 dbwrap_parser_fn parser, void *private_data)
{
	struct prp_ctx *ctx = prp_ctx(db);
	struct prp_parse_state state = {
		.ctx = ctx, .parser = parser, .private_data = private_data,
		.status = NT_STATUS_OK,
	};
	NTSTATUS status;

	status = ctx->volatile_db->parse_record(ctx->volatile_db, key,
						prp_parser, &state);
	return NT_STATUS_IS_OK(status) ? state.status : status;
}

/* -- traverse -------------------------------------------------------------- */

struct prp_traverse_state {
	struct db_context *db;
	dbwrap_traverse_fn fn;
	void *private_data;
	bool writable;
	int hidden; /* the marker and records without a header: not counted */
};

static int prp_traverse_fn(struct db_record *inner, void *private_data)
{
	struct prp_traverse_state *state = private_data;
	struct db_record rec;

	if (prp_is_marker(inner->key)) {
		state->hidden += 1;
		return 0;
	}
	if (!prp_wrap(&rec, state->db, inner, inner->value, state->writable)) {
		prp_log_bad_record(prp_ctx(state->db), "traverse");
		state->hidden += 1;
		return 0;
	}
	return state->fn(&rec, state->private_data);
}

static int prp_traverse_on(struct db_context *db, struct db_context *on,
			   dbwrap_traverse_fn f, void *private_data,
			   bool writable)
{
	struct prp_traverse_state state = {
		.db = db, .fn = f, .private_data = private_data,
		.writable = writable,
	};
	int count = writable ? on->traverse(on, prp_traverse_fn, &state)
			     : on->traverse_read(on, prp_traverse_fn, &state);

	return count < 0 ? count : count - state.hidden;
}

static int prp_traverse(struct db_context *db, dbwrap_traverse_fn f,
			void *private_data)
{
	return prp_traverse_on(db, prp_ctx(db)->volatile_db, f, private_data,
			       true);
}

static int prp_traverse_read(struct db_context *db, dbwrap_traverse_fn f,
			     void *private_data)
{
	return prp_traverse_on(db, prp_ctx(db)->volatile_db, f, private_data,
			       false);
}

static int prp_traverse_persistent(struct db_context *db, dbwrap_traverse_fn f,
				   void *private_data)
{
	return prp_traverse_on(db, prp_ctx(db)->backup, f, private_data, false);
}

/* -- database-wide: the volatile database's ---------------------------------- */

static int prp_get_seqnum(struct db_context *db)
{
	struct db_context *v = prp_ctx(db)->volatile_db;

	return v->get_seqnum(v);
}

static int prp_transaction_start(struct db_context *db)
{
	struct db_context *v = prp_ctx(db)->volatile_db;

	return v->transaction_start(v);
}

static NTSTATUS prp_transaction_start_nonblock(struct db_context *db)
{
	struct db_context *v = prp_ctx(db)->volatile_db;

	return v->transaction_start_nonblock(v);
}

static int prp_transaction_commit(struct db_context *db)
{
	struct db_context *v = prp_ctx(db)->volatile_db;

	return v->transaction_commit(v);
}

static int prp_transaction_cancel(struct db_context *db)
{
	struct db_context *v = prp_ctx(db)->volatile_db;

	return v->transaction_cancel(v);
}

static int prp_exists(struct db_context *db, TDB_DATA key)
{
	struct db_context *v = prp_ctx(db)->volatile_db;

	return v->exists(v, key);
}

static int prp_wipe(struct db_context *db, struct dbwrap_wipe_flags flags)
{
	struct prp_ctx *ctx = prp_ctx(db);
	const struct dbwrap_wipe_flags all = { .wipe_default = true };

	if (flags.wipe_persistent_backup_db &&
	    ctx->backup->wipe(ctx->backup, all) != 0) {
		return -1;
	}
	if (flags.wipe_default &&
	    ctx->volatile_db->wipe(ctx->volatile_db, all) != 0) {
		return -1;
	}
	return 0;
}

static int prp_check(struct db_context *db)
{
	struct db_context *v = prp_ctx(db)->volatile_db;

	return v->check(v);
}

static size_t prp_id(struct db_context *db, uint8_t *id, size_t idlen)
{
	struct db_context *v = prp_ctx(db)->volatile_db;

	return v->id(v, id, idlen);
}

/* -- open ------------------------------------------------------------------ */

/* "<dir>/<base>_persistent.tdb" for "<dir>/<base>.<ext>", as Samba names it. */
static char *prp_backup_name(TALLOC_CTX *mem_ctx, const char *name)
{
	const char *slash = strrchr(name, '/');
	const char *base = slash != NULL ? slash + 1 : name;
	const char *dot = strrchr(base, '.');
	size_t stem = dot != NULL ? (size_t)(dot - name) : strlen(name);
	/* no "%.*s": its precision is an int, and a size_t need not fit */
	char *backup = talloc_strndup(mem_ctx, name, stem);

	return backup != NULL ? talloc_strdup_append_buffer(backup, "_persistent.tdb")
			      : NULL;
}

struct prp_restore_state {
	struct prp_ctx *ctx;
	int restored;
	bool failed;
};

/* One copy, header and all, back into the volatile database. */
static int prp_restore_fn(struct db_record *copy, void *private_data)
{
	struct prp_restore_state *state = private_data;
	struct db_context *v = state->ctx->volatile_db;
	struct db_record *rec = v->fetch_locked(v, state->ctx, copy->key);
	NTSTATUS status = NT_STATUS_NO_MEMORY;

	if (rec != NULL) {
		status = rec->storev(rec, &copy->value, 1, 0);
		if (NT_STATUS_IS_OK(status)) {
			status = dbwrap_py_record_write_through(rec);
		}
		TALLOC_FREE(rec);
	}
	if (!NT_STATUS_IS_OK(status)) {
		dbwrap_py_log(state->ctx->name, "open", "a persistent record "
			      "was not restored: %s", nt_errstr(status));
		state->failed = true;
		return -1;
	}
	state->restored += 1;
	return 0;
}

/*
 * A volatile database without the marker was cleared: the copies go back,
 * then the marker, all under the marker's record lock.
 */
static bool prp_restore(struct db_context *db)
{
	struct prp_ctx *ctx = prp_ctx(db);
	struct prp_restore_state state = { .ctx = ctx };
	TALLOC_CTX *frame = talloc_new(ctx);
	struct db_record *marker;
	char when[64];
	time_t now = time(NULL);
	struct tm tm;
	TDB_DATA stamp;
	NTSTATUS status;
	bool ok = false;

	marker = (frame != NULL) ? prp_fetch_locked(db, frame, prp_marker_key) : NULL;
	if (marker == NULL) {
		dbwrap_py_log(ctx->name, "open", "the migration marker could not be locked");
		goto done;
	}
	if (marker->value.dptr != NULL) {
		ok = true; /* restored by an earlier opener */
		goto done;
	}
	if (ctx->backup->traverse_read(ctx->backup, prp_restore_fn, &state) < 0 ||
	    state.failed) {
		goto done;
	}
	strftime(when, sizeof(when), "%Y/%m/%d %H:%M:%S",
		 localtime_r(&now, &tm));
	stamp = (TDB_DATA) { .dptr = (uint8_t *)when, .dsize = strlen(when) + 1 };
	status = marker->storev(marker, &stamp, 1, 0);
	if (!NT_STATUS_IS_OK(status)) {
		dbwrap_py_log(ctx->name, "open", "the migration marker was not "
			      "stored: %s", nt_errstr(status));
		goto done;
	}
	if (state.restored > 0) {
		dbwrap_py_log_level(DBWRAP_PY_LOG_INFO, ctx->name, "open",
				    "%d persistent records restored",
				    state.restored);
	}
	ok = true;
done:
	TALLOC_FREE(frame); /* unlocks the marker */
	return ok;
}

static void prp_set_ops(struct db_context *db)
{
	db->fetch_locked = prp_fetch_locked;
	db->traverse = prp_traverse;
	db->traverse_read = prp_traverse_read;
	db->traverse_per_rec_persistent_read = prp_traverse_persistent;
	db->get_seqnum = prp_get_seqnum;
	db->transaction_start = prp_transaction_start;
	db->transaction_start_nonblock = prp_transaction_start_nonblock;
	db->transaction_commit = prp_transaction_commit;
	db->transaction_cancel = prp_transaction_cancel;
	db->parse_record = prp_parse_record;
	db->do_locked = prp_do_locked;
	db->exists = prp_exists;
	db->wipe = prp_wipe;
	db->check = prp_check;
	db->id = prp_id;
}

struct db_context *dbwrap_py_open_per_rec_persistent(
	TALLOC_CTX *mem_ctx, const char *name, int hash_size, int tdb_flags,
	int open_flags, mode_t mode, enum dbwrap_lock_order lock_order,
	uint64_t dbwrap_flags, const char *adapter, const char *const *options)
{
	/* the callers' lock order is the outer database's: none inside */
	struct dbwrap_py_open_args volatile_args = {
		.name = name, .hash_size = hash_size, .tdb_flags = tdb_flags,
		.open_flags = open_flags, .mode = mode,
		.lock_order = DBWRAP_LOCK_ORDER_NONE,
		.dbwrap_flags = dbwrap_flags & ~DBWRAP_FLAG_PER_REC_PERSISTENT,
		.adapter = adapter, .options = options, .writes_through = true,
	};
	struct dbwrap_py_open_args backup_args = volatile_args;
	struct db_context *db;
	struct prp_ctx *ctx;
	char *backup_name;

	if (name == NULL || !(tdb_flags & TDB_CLEAR_IF_FIRST)) {
		dbwrap_py_log(name != NULL ? name : "?", "open", "per-record "
			      "persistence is for a volatile (CLEAR_IF_FIRST) database");
		errno = EINVAL;
		return NULL;
	}
	db = talloc_zero(mem_ctx, struct db_context);
	if (db == NULL) {
		errno = ENOMEM;
		return NULL;
	}
	ctx = talloc_zero(db, struct prp_ctx);
	db->name = talloc_strdup(db, name);
	backup_name = (ctx != NULL) ? prp_backup_name(ctx, name) : NULL;
	if (ctx == NULL || db->name == NULL || backup_name == NULL) {
		TALLOC_FREE(db);
		errno = ENOMEM;
		return NULL;
	}
	ctx->name = db->name;
	backup_args.name = backup_name;
	backup_args.tdb_flags = tdb_flags & ~(TDB_CLEAR_IF_FIRST | TDB_MUTEX_LOCKING);
	backup_args.writes_through = false;
	ctx->volatile_db = dbwrap_py_open(ctx, &volatile_args);
	ctx->backup = (ctx->volatile_db == NULL) ? NULL
		: dbwrap_py_open(ctx, &backup_args);
	if (ctx->backup == NULL) {
		int err = errno;

		TALLOC_FREE(db); /* each failed open logged its cause */
		errno = err;
		return NULL;
	}
	db->private_data = ctx;
	db->lock_order = lock_order;
	db->flags = dbwrap_flags;
	db->persistent = false;
	prp_set_ops(db);
	if ((open_flags & O_ACCMODE) == O_RDWR && !prp_restore(db)) {
		TALLOC_FREE(db);
		errno = EIO;
		return NULL;
	}
	return db;
}

#endif /* DBWRAP_PY_SAMBA_4_25_LAYOUT */
