/*
 * struct db_context for dbwrap_py: every operation goes to a transport.
 *
 * Records follow dbwrap's rules (lib/dbwrap/dbwrap.c, Samba 4.17.12):
 * fetch_locked records are talloc children of the caller's context and keep
 * the lock until they are freed; do_locked and traverse records live on the
 * stack for the duration of the callback.
 *
 * Record operations go to the table the transport chose at open
 * (ctx->records); where that table asks for it, a plain store inside a
 * do_locked callback waits for the unlock (deferred_store.h).
 */

#include <errno.h>
#include <string.h>

#include "dbwrap_py.h"
#include "db_ops.h"
#include "deferred_store.h"
#include "errno_map.h"
#include "inproc_loader.h"
#include "log.h"
#include "options.h"
#include "per_rec_persistent.h"
#include "transport.h"

typedef NTSTATUS (*db_py_storev_fn)(struct db_record *rec, const TDB_DATA *dbufs,
				    int num_dbufs, int flag);

struct db_py_ctx {
	struct dbwrap_py_deferred *deferred; /* the innermost do_locked, or NULL */
	const struct dbwrap_py_transport *transport;
	const struct dbwrap_py_record_ops *records;
	struct dbwrap_py_db *backend;
	/* storev of a do_locked record: deferring or not, chosen at open */
	db_py_storev_fn locked_storev;
	const char *name;
	/* writes are refused while a traverse_read runs, as in rbt */
	unsigned traverse_read_depth;
	/* handed out when the adapter's seqnum fails: negative, never repeated */
	int seqnum_on_error;
	uint8_t *id;
	size_t idlen;
};

static struct db_py_ctx *db_py_ctx(struct db_context *db)
{
	return talloc_get_type_abort(db->private_data, struct db_py_ctx);
}

/* Write the innermost deferred store now: before any other operation. */
static NTSTATUS db_py_flush(struct db_py_ctx *ctx)
{
	struct dbwrap_py_deferred *d = ctx->deferred;
	NTSTATUS status;

	if (d == NULL || !d->pending) {
		return NT_STATUS_OK;
	}
	status = ctx->records->storev(ctx->backend, d->key, &d->value, 1, 0);
	dbwrap_py_deferred_clear(d);
	return status;
}

/* A read of the key whose store is deferred: answered from here. */
static bool db_py_read_deferred(struct db_py_ctx *ctx, TDB_DATA key,
				dbwrap_py_value_fn fn, void *private_data)
{
	if (!dbwrap_py_deferred_covers(ctx->deferred, key)) {
		return false;
	}
	fn(ctx->deferred->value, true, private_data);
	return true;
}

/* -- record writes ------------------------------------------------------- */

/* Before a write: none inside traverse_read, and a deferred store goes first. */
static NTSTATUS db_py_before_write(struct db_py_ctx *ctx)
{
	if (ctx->traverse_read_depth > 0) {
		return NT_STATUS_MEDIA_WRITE_PROTECTED;
	}
	return db_py_flush(ctx);
}

static NTSTATUS db_py_storev(struct db_record *rec, const TDB_DATA *dbufs,
			     int num_dbufs, int flag)
{
	struct db_py_ctx *ctx = rec->private_data;
	NTSTATUS status = db_py_before_write(ctx);

	/* value_valid stays false: like tdb, we do not re-read after a store */
	return NT_STATUS_IS_OK(status)
		? ctx->records->storev(ctx->backend, rec->key, dbufs, num_dbufs, flag)
		: status;
}

/* storev of a do_locked record, where the table defers: plain stores wait. */
static NTSTATUS db_py_deferring_storev(struct db_record *rec,
				       const TDB_DATA *dbufs, int num_dbufs,
				       int flag)
{
	struct db_py_ctx *ctx = rec->private_data;
	struct dbwrap_py_deferred *d = ctx->deferred;
	bool plain = (flag == 0 || flag == TDB_REPLACE);

	if (ctx->traverse_read_depth == 0 && plain &&
	    dbwrap_py_deferred_is_for(d, rec->key)) {
		return dbwrap_py_deferred_set(d, dbufs, num_dbufs);
	}
	/* TDB_INSERT/TDB_MODIFY need the adapter's answer now */
	return db_py_storev(rec, dbufs, num_dbufs, flag);
}

static NTSTATUS db_py_delete_rec(struct db_record *rec)
{
	struct db_py_ctx *ctx = rec->private_data;
	NTSTATUS status = db_py_before_write(ctx);

	return NT_STATUS_IS_OK(status)
		? ctx->records->delete_rec(ctx->backend, rec->key) : status;
}

NTSTATUS dbwrap_py_record_write_through(struct db_record *rec)
{
	struct db_py_ctx *ctx = rec->private_data;
	NTSTATUS status = db_py_before_write(ctx); /* a deferred store first */

	return NT_STATUS_IS_OK(status)
		? ctx->records->write_through(ctx->backend, rec->key) : status;
}

static NTSTATUS db_py_write_protected_storev(struct db_record *rec,
					     const TDB_DATA *dbufs,
					     int num_dbufs, int flag)
{
	return NT_STATUS_MEDIA_WRITE_PROTECTED;
}

static NTSTATUS db_py_write_protected_delete(struct db_record *rec)
{
	return NT_STATUS_MEDIA_WRITE_PROTECTED;
}

static void db_py_init_record(struct db_record *rec, struct db_context *db,
			      TDB_DATA key, TDB_DATA value, bool writable)
{
	*rec = (struct db_record) {
		.db = db,
		.key = key,
		.value = value,
		.storev = writable ? db_py_storev : db_py_write_protected_storev,
		.delete_rec = writable ? db_py_delete_rec
				       : db_py_write_protected_delete,
		.private_data = db_py_ctx(db),
	};
}

/* -- fetch_locked ---------------------------------------------------------- */

static int db_py_record_destructor(struct db_record *rec)
{
	struct db_py_ctx *ctx = rec->private_data;

	ctx->records->unlock(ctx->backend, rec->key);
	return 0;
}

struct db_py_copy_state {
	struct db_record *rec;
	bool copied;
};

static void db_py_copy_value(TDB_DATA value, bool exists, void *private_data)
{
	struct db_py_copy_state *state = private_data;

	if (!exists || value.dsize == 0) {
		state->copied = true;
		return;
	}
	state->rec->value.dptr = talloc_memdup(state->rec, value.dptr,
					       value.dsize);
	if (state->rec->value.dptr != NULL) {
		state->rec->value.dsize = value.dsize;
		state->copied = true;
	}
}

static struct db_record *db_py_fetch_locked(struct db_context *db,
					    TALLOC_CTX *mem_ctx, TDB_DATA key)
{
	struct db_py_ctx *ctx = db_py_ctx(db);
	struct db_py_copy_state state = { .copied = false };
	struct db_record *rec;
	NTSTATUS status;

	if (!NT_STATUS_IS_OK(db_py_flush(ctx))) {
		return NULL;
	}
	rec = talloc(mem_ctx, struct db_record);
	if (rec == NULL) {
		return NULL;
	}
	db_py_init_record(rec, db, key, tdb_null, true);
	rec->key.dptr = talloc_memdup(rec, key.dptr, key.dsize);
	if (rec->key.dptr == NULL && key.dsize != 0) {
		TALLOC_FREE(rec);
		return NULL;
	}
	state.rec = rec;

	status = ctx->records->lock(ctx->backend, rec->key, db_py_copy_value,
				    &state);
	if (!NT_STATUS_IS_OK(status)) {
		TALLOC_FREE(rec);
		return NULL;
	}
	talloc_set_destructor(rec, db_py_record_destructor);
	if (!state.copied) {
		dbwrap_py_log(ctx->name, "fetch_locked", "out of memory");
		TALLOC_FREE(rec); /* unlocks */
		return NULL;
	}
	rec->value_valid = true;
	return rec;
}

/* -- do_locked ------------------------------------------------------------- */

struct db_py_do_locked_state {
	struct db_context *db;
	TDB_DATA key;
	dbwrap_do_locked_fn fn;
	void *private_data;
	struct dbwrap_py_deferred *deferred;
};

static const TDB_DATA *db_py_do_locked_fn(TDB_DATA value, bool exists,
					   void *private_data)
{
	struct db_py_do_locked_state *state = private_data;
	struct db_record rec;

	/* dbwrap: "nobody shall assume it's set from within dbwrap_do_locked()" */
	db_py_init_record(&rec, state->db, state->key, value, true);
	rec.value_valid = false;
	rec.storev = db_py_ctx(state->db)->locked_storev;
	state->fn(&rec, value, state->private_data);
	/* the deferred store, if any, goes with the unlock */
	return state->deferred->pending ? &state->deferred->value : NULL;
}

static NTSTATUS db_py_do_locked(struct db_context *db, TDB_DATA key,
				dbwrap_do_locked_fn fn, void *private_data)
{
	struct db_py_ctx *ctx = db_py_ctx(db);
	struct dbwrap_py_deferred deferred; /* not zeroed: see dbwrap_py_deferred_init */
	struct db_py_do_locked_state state = {
		.db = db, .key = key, .fn = fn, .private_data = private_data,
		.deferred = &deferred,
	};
	NTSTATUS status;

	status = db_py_flush(ctx);
	if (!NT_STATUS_IS_OK(status)) {
		return status;
	}
	dbwrap_py_deferred_init(&deferred, key, ctx->deferred, ctx);
	ctx->deferred = &deferred;
	status = ctx->records->locked(ctx->backend, key, db_py_do_locked_fn, &state);
	ctx->deferred = deferred.outer;
	dbwrap_py_deferred_clear(&deferred);
	return status;
}

/* -- reads ------------------------------------------------------------------ */

struct db_py_parse_state {
	TDB_DATA key;
	dbwrap_parser_fn parser;
	void *private_data;
	bool found;
};

static void db_py_parse_fn(TDB_DATA value, bool exists, void *private_data)
{
	struct db_py_parse_state *state = private_data;

	state->found = exists;
	if (exists && state->parser != NULL) {
		state->parser(state->key, value, state->private_data);
	}
}

static NTSTATUS db_py_parse_record(struct db_context *db, TDB_DATA key,
				   dbwrap_parser_fn parser, void *private_data)
{
	struct db_py_ctx *ctx = db_py_ctx(db);
	struct db_py_parse_state state = {
		.key = key, .parser = parser, .private_data = private_data,
	};
	NTSTATUS status = NT_STATUS_OK;

	if (!db_py_read_deferred(ctx, key, db_py_parse_fn, &state)) {
		status = ctx->records->fetch(ctx->backend, key, db_py_parse_fn,
					     &state);
	}
	if (!NT_STATUS_IS_OK(status)) {
		return status;
	}
	return state.found ? NT_STATUS_OK : NT_STATUS_NOT_FOUND;
}

static void db_py_exists_fn(TDB_DATA value, bool exists, void *private_data)
{
	*(bool *)private_data = exists;
}

static int db_py_exists(struct db_context *db, TDB_DATA key)
{
	struct db_py_ctx *ctx = db_py_ctx(db);
	bool exists = false;
	NTSTATUS status = NT_STATUS_OK;

	if (!db_py_read_deferred(ctx, key, db_py_exists_fn, &exists)) {
		status = ctx->records->exists(ctx->backend, key, &exists);
	}
	return (NT_STATUS_IS_OK(status) && exists) ? 1 : 0;
}

/* -- traverse ------------------------------------------------------------- */

struct db_py_traverse_state {
	struct db_context *db;
	dbwrap_traverse_fn fn;
	void *private_data;
	bool writable;
};

static int db_py_traverse_fn(TDB_DATA key, TDB_DATA value, void *private_data)
{
	struct db_py_traverse_state *state = private_data;
	struct db_record rec;

	db_py_init_record(&rec, state->db, key, value, state->writable);
	rec.value_valid = true;
	return state->fn(&rec, state->private_data);
}

static int db_py_traverse_common(struct db_context *db, dbwrap_traverse_fn f,
				 void *private_data, bool writable)
{
	struct db_py_ctx *ctx = db_py_ctx(db);
	struct db_py_traverse_state state = {
		.db = db, .fn = f, .private_data = private_data,
		.writable = writable,
	};
	NTSTATUS status;
	int count = 0;

	if (!NT_STATUS_IS_OK(db_py_flush(ctx))) {
		return -1;
	}
	if (!writable) {
		ctx->traverse_read_depth += 1;
	}
	status = ctx->transport->traverse(ctx->backend, writable,
					  db_py_traverse_fn, &state, &count);
	if (!writable) {
		ctx->traverse_read_depth -= 1;
	}
	return NT_STATUS_IS_OK(status) ? count : -1;
}

static int db_py_traverse(struct db_context *db, dbwrap_traverse_fn f,
			  void *private_data)
{
	return db_py_traverse_common(db, f, private_data, true);
}

static int db_py_traverse_read(struct db_context *db, dbwrap_traverse_fn f,
			       void *private_data)
{
	return db_py_traverse_common(db, f, private_data, false);
}

/* -- database-wide ---------------------------------------------------------- */

static int db_py_get_seqnum(struct db_context *db)
{
	struct db_py_ctx *ctx = db_py_ctx(db);
	int seqnum = 0;
	NTSTATUS status;

	status = db_py_flush(ctx);
	if (NT_STATUS_IS_OK(status)) {
		status = ctx->records->seqnum(ctx->backend, &seqnum);
	}
	if (!NT_STATUS_IS_OK(status)) {
		/*
		 * Callers compare seqnums to validate caches. A value never
		 * returned before makes them re-read instead of trusting a
		 * stale cache.
		 */
		ctx->seqnum_on_error -= 1;
		return ctx->seqnum_on_error;
	}
	return seqnum;
}

static NTSTATUS db_py_transaction_op(struct db_py_ctx *ctx,
				     enum dbwrap_py_txn_op op)
{
	NTSTATUS status = db_py_flush(ctx);

	return NT_STATUS_IS_OK(status)
		? ctx->transport->transaction(ctx->backend, op) : status;
}

static int db_py_transaction(struct db_context *db, enum dbwrap_py_txn_op op)
{
	return NT_STATUS_IS_OK(db_py_transaction_op(db_py_ctx(db), op)) ? 0 : -1;
}

static int db_py_transaction_start(struct db_context *db)
{
	return db_py_transaction(db, DBWRAP_PY_TXN_START);
}

static NTSTATUS db_py_transaction_start_nonblock(struct db_context *db)
{
	return db_py_transaction_op(db_py_ctx(db), DBWRAP_PY_TXN_START_NONBLOCK);
}

static int db_py_transaction_commit(struct db_context *db)
{
	return db_py_transaction(db, DBWRAP_PY_TXN_COMMIT);
}

static int db_py_transaction_cancel(struct db_context *db)
{
	return db_py_transaction(db, DBWRAP_PY_TXN_CANCEL);
}

#if DBWRAP_PY_SAMBA_4_25_LAYOUT
/*
 * 4.25's flags matter to a per-record-persistent database only, which is
 * per_rec_persistent.c's; this one has no persistent records to keep.
 */
static int db_py_wipe(struct db_context *db, struct dbwrap_wipe_flags flags)
#else
static int db_py_wipe(struct db_context *db)
#endif
{
	struct db_py_ctx *ctx = db_py_ctx(db);

	return (NT_STATUS_IS_OK(db_py_flush(ctx)) &&
		NT_STATUS_IS_OK(ctx->transport->wipe(ctx->backend))) ? 0 : -1;
}

static int db_py_check(struct db_context *db)
{
	struct db_py_ctx *ctx = db_py_ctx(db);

	return (NT_STATUS_IS_OK(db_py_flush(ctx)) &&
		NT_STATUS_IS_OK(ctx->transport->check(ctx->backend))) ? 0 : -1;
}

static size_t db_py_id(struct db_context *db, uint8_t *id, size_t idlen)
{
	struct db_py_ctx *ctx = db_py_ctx(db);
	NTSTATUS status;

	if (ctx->id == NULL) {
		status = ctx->transport->db_id(ctx->backend, ctx, &ctx->id,
					       &ctx->idlen);
		if (!NT_STATUS_IS_OK(status)) {
			/* the name is unique per node, which is what the watch layer needs */
			ctx->id = (uint8_t *)talloc_strdup(ctx, ctx->name);
			ctx->idlen = (ctx->id != NULL) ? strlen(ctx->name) : 0;
		}
	}
	if (id != NULL && idlen >= ctx->idlen) {
		memcpy(id, ctx->id, ctx->idlen);
	}
	return ctx->idlen;
}

/* -- open ------------------------------------------------------------------ */

static void db_py_set_ops(struct db_context *db)
{
	db->fetch_locked = db_py_fetch_locked;
	db->traverse = db_py_traverse;
	db->traverse_read = db_py_traverse_read;
	/* 4.25's traverse_per_rec_persistent_read stays NULL: per_rec_persistent.c has it */
	db->get_seqnum = db_py_get_seqnum;
	db->transaction_start = db_py_transaction_start;
	db->transaction_start_nonblock = db_py_transaction_start_nonblock;
	db->transaction_commit = db_py_transaction_commit;
	db->transaction_cancel = db_py_transaction_cancel;
	db->parse_record = db_py_parse_record;
	/* parse_record_send/recv stay NULL: dbwrap falls back to parse_record */
	db->do_locked = db_py_do_locked;
	db->exists = db_py_exists;
	db->wipe = db_py_wipe;
	db->check = db_py_check;
	db->id = db_py_id;
}

/* The `transport` option's choice; NULL, after a log line, for an unknown one. */
static const struct dbwrap_py_transport *db_py_pick_transport(const char *dbname,
							      const char *choice)
{
	if (choice == NULL || strcmp(choice, "inproc") == 0) {
		return dbwrap_py_inproc_transport(dbname);
	}
	if (strcmp(choice, "proxy") == 0) {
		return &dbwrap_py_transport_proxy;
	}
	dbwrap_py_log(dbname, "open", "transport=%s: not inproc or proxy", choice);
	return NULL;
}

struct db_context *db_open_py(TALLOC_CTX *mem_ctx, const char *name,
			      int hash_size, int tdb_flags, int open_flags,
			      mode_t mode, enum dbwrap_lock_order lock_order,
			      uint64_t dbwrap_flags, const char *adapter,
			      const char *const *options)
{
	struct dbwrap_py_open_args args = {
		.name = name, .hash_size = hash_size, .tdb_flags = tdb_flags,
		.open_flags = open_flags, .mode = mode,
		.lock_order = (int)lock_order, .dbwrap_flags = dbwrap_flags,
		.adapter = adapter, .options = options,
	};

#if DBWRAP_PY_SAMBA_4_25_LAYOUT
	if (dbwrap_flags & DBWRAP_FLAG_PER_REC_PERSISTENT) {
		return dbwrap_py_open_per_rec_persistent(
			mem_ctx, name, hash_size, tdb_flags, open_flags, mode,
			lock_order, dbwrap_flags, adapter, options);
	}
#endif
	return dbwrap_py_open(mem_ctx, &args);
}

struct db_context *dbwrap_py_open(TALLOC_CTX *mem_ctx,
				  const struct dbwrap_py_open_args *given)
{
	const struct dbwrap_py_transport *transport;
	struct dbwrap_py_open_args args = *given;
	const char *name = given->name;
	struct db_context *db;
	struct db_py_ctx *ctx;
	NTSTATUS status;

	db = talloc_zero(mem_ctx, struct db_context);
	if (db == NULL) {
		errno = ENOMEM;
		return NULL;
	}
	ctx = talloc_zero(db, struct db_py_ctx);
	/* dbwrap's lock-order check compares the name pointer: keep it stable */
	db->name = talloc_strdup(db, name != NULL ? name : "");
	if (ctx == NULL || db->name == NULL) {
		TALLOC_FREE(db);
		errno = ENOMEM;
		return NULL;
	}
	ctx->name = db->name;
	args.name = db->name;
	transport = db_py_pick_transport(db->name,
		dbwrap_py_option_take(ctx, given->options, "transport", &args.options));
	if (transport == NULL || args.options == NULL) {
		errno = (transport == NULL) ? EINVAL : ENOMEM;
		TALLOC_FREE(db);
		return NULL;
	}
	ctx->transport = transport;

	status = transport->open(ctx, &args, &ctx->backend, &ctx->records);
	if (!NT_STATUS_IS_OK(status)) {
		TALLOC_FREE(db);
		errno = dbwrap_py_errno_from_ntstatus(status);
		return NULL;
	}
	ctx->locked_storev = ctx->records->defer_locked_stores
		? db_py_deferring_storev : db_py_storev;

	dbwrap_py_log_level(DBWRAP_PY_LOG_INFO, db->name, "open",
			    "adapter %s, %s transport, %s records", given->adapter,
			    transport->name, ctx->records->name);
	db->private_data = ctx;
	db->lock_order = (enum dbwrap_lock_order)given->lock_order;
#if DBWRAP_PY_SAMBA_4_25_LAYOUT
	db->flags = given->dbwrap_flags;
#endif
	db->persistent = (given->tdb_flags & TDB_CLEAR_IF_FIRST) == 0;
	db_py_set_ops(db);
	return db;
}
