/*
 * How dbwrap operations reach an adapter.
 *
 * db_ops.c implements struct db_context in terms of these calls and knows
 * nothing of Python. transport_inproc.c runs the adapter in an interpreter
 * embedded in this process; transport_proxy.c reaches it in the node daemon
 * over a unix socket. The option `transport` (inproc, the default, or
 * proxy) picks one per database.
 *
 * The hot record operations form a table of their own. A transport may
 * reach records in more than one way (the in-process one: through the
 * adapter's Python methods, or through its native records in C) and picks
 * the table once, when the database opens; db_ops.c then calls it without
 * asking again.
 *
 * Values handed to a callback are valid only during that callback, so a
 * transport can pass its own buffers without copying. Callbacks of fetch
 * and lock are short by dbwrap's rules (they run under a record lock) and
 * may run inside the transport's own critical section; traverse callbacks
 * run arbitrary code and must not.
 */

#ifndef DBWRAP_PY_TRANSPORT_H
#define DBWRAP_PY_TRANSPORT_H

#include "samba_abi.h"

struct dbwrap_py_db; /* a transport's open database */

/* What db_open_py() was asked for, passed on unchanged. */
struct dbwrap_py_open_args {
	const char *name;
	int hash_size;
	int tdb_flags;
	int open_flags;
	mode_t mode;
	int lock_order;
	uint64_t dbwrap_flags;
	const char *adapter;        /* short name or dotted module */
	const char *const *options; /* NULL-terminated "key=value" strings */
	/*
	 * The opener calls write_through (per_rec_persistent.c): the proxy's
	 * fast path stays off, as the daemon writes the records through.
	 */
	bool writes_through;
};

/* Gets a record's value: exists=false for a missing key. */
typedef void (*dbwrap_py_value_fn)(TDB_DATA value, bool exists,
				   void *private_data);
/*
 * Runs while a record is locked; returns the value to store before the
 * unlock, or NULL to store nothing.
 */
typedef const TDB_DATA *(*dbwrap_py_locked_fn)(TDB_DATA value, bool exists,
					       void *private_data);
/* Gets one traversed record; non-zero stops the traverse. */
typedef int (*dbwrap_py_record_fn)(TDB_DATA key, TDB_DATA value,
				   void *private_data);

enum dbwrap_py_txn_op {
	DBWRAP_PY_TXN_START,
	DBWRAP_PY_TXN_START_NONBLOCK,
	DBWRAP_PY_TXN_COMMIT,
	DBWRAP_PY_TXN_CANCEL,
};

struct dbwrap_py_record_ops {
	const char *name; /* for the log: how records are reached */
	/*
	 * true: a plain store made inside a do_locked callback may wait, and
	 * go with the unlock (locked_fn returns it); one crossing saved.
	 */
	bool defer_locked_stores;

	/* Read without locking (parse_record). */
	NTSTATUS (*fetch)(struct dbwrap_py_db *db, TDB_DATA key,
			  dbwrap_py_value_fn fn, void *private_data);
	/* Lock the record for this process, then read it. */
	NTSTATUS (*lock)(struct dbwrap_py_db *db, TDB_DATA key,
			 dbwrap_py_value_fn fn, void *private_data);
	NTSTATUS (*unlock)(struct dbwrap_py_db *db, TDB_DATA key);
	/*
	 * do_locked in one scope: lock and read, run fn, then store what fn
	 * returns together with the unlock. The value fn gets stays valid
	 * whatever fn writes meanwhile, as Samba's own backends promise. The
	 * lock is released even if the store fails, and that failure is the
	 * result.
	 */
	NTSTATUS (*locked)(struct dbwrap_py_db *db, TDB_DATA key,
			   dbwrap_py_locked_fn fn, void *private_data);
	/* Write a locked record; the buffers form one value. */
	NTSTATUS (*storev)(struct dbwrap_py_db *db, TDB_DATA key,
			   const TDB_DATA *dbufs, int num_dbufs, int flag);
	/* Delete a locked record; NOT_FOUND if it is missing. */
	NTSTATUS (*delete_rec)(struct dbwrap_py_db *db, TDB_DATA key);
	/*
	 * The locked record's value, or its absence, is in the backend when
	 * this returns. Every store is already but a write-back node cache's,
	 * which keeps records on the node that uses them: a persistent record
	 * (per_rec_persistent.c) must outlive that node.
	 */
	NTSTATUS (*write_through)(struct dbwrap_py_db *db, TDB_DATA key);
	NTSTATUS (*exists)(struct dbwrap_py_db *db, TDB_DATA key, bool *exists);
	NTSTATUS (*seqnum)(struct dbwrap_py_db *db, int *seqnum);
};

struct dbwrap_py_transport {
	const char *name;

	/*
	 * The returned handle is a talloc child of mem_ctx; freeing it closes.
	 * *records is the table of record operations for this database.
	 */
	NTSTATUS (*open)(TALLOC_CTX *mem_ctx,
			 const struct dbwrap_py_open_args *args,
			 struct dbwrap_py_db **pdb,
			 const struct dbwrap_py_record_ops **records);

	/*
	 * Every record; with write, each is locked while fn runs, so fn may
	 * store or delete it. *count includes the record fn stopped on.
	 */
	NTSTATUS (*traverse)(struct dbwrap_py_db *db, bool write,
			     dbwrap_py_record_fn fn, void *private_data,
			     int *count);
	NTSTATUS (*transaction)(struct dbwrap_py_db *db, enum dbwrap_py_txn_op op);
	NTSTATUS (*wipe)(struct dbwrap_py_db *db);
	NTSTATUS (*check)(struct dbwrap_py_db *db);
	/* The id is a talloc child of mem_ctx. */
	NTSTATUS (*db_id)(struct dbwrap_py_db *db, TALLOC_CTX *mem_ctx,
			  uint8_t **id, size_t *idlen);
};

extern const struct dbwrap_py_transport dbwrap_py_transport_inproc;
extern const struct dbwrap_py_transport dbwrap_py_transport_proxy;

#endif /* DBWRAP_PY_TRANSPORT_H */
