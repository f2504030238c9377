/*
 * Private to the in-process transport (transport_inproc.c for the database
 * as a whole, inproc_records.c for the hot record operations).
 */

#ifndef DBWRAP_PY_INPROC_H
#define DBWRAP_PY_INPROC_H

#include "py_runtime.h" /* Python.h first, as CPython asks */

#include "native_records.h"
#include "transport.h"

/* Methods of the dbwrap_py.database.Database object. */
enum inproc_method {
	M_STORE, M_DELETE, M_EXISTS, M_TRAVERSE, M_SEQNUM, M_TXN_START,
	M_TXN_COMMIT, M_TXN_CANCEL, M_WIPE, M_CHECK, M_DB_ID, M_CLOSE, M_COUNT
};

/* The adapter's record methods that the hot path calls directly. */
enum inproc_adapter_method {
	A_GET, A_LOCK_GET, A_UNLOCK, A_PUT, A_PUT_UNLOCK, A_COUNT
};

struct dbwrap_py_db {
	const char *name;
	PyObject *database;                /* dbwrap_py.database.Database */
	PyObject *methods[M_COUNT];        /* its bound methods */
	PyObject *adapter[A_COUNT];        /* the adapter's, bound */
	PyObject *held;                    /* Database._held, shared with Python */
	PyObject *attrs;                   /* Database.__dict__ */
	PyObject *unusable;                /* the interned name "_unusable" */
	/* the adapter's native records (native_records.h), or NULL */
	const struct dbwrap_py_native_records *native;
	void *native_handle;
	PyObject *native_capsule;          /* keeps native_handle alive */
};

extern const char *const inproc_method_names[M_COUNT];
extern const char *const inproc_adapter_method_names[A_COUNT];

/* The pending exception as an NTSTATUS and one log line (GIL held). */
NTSTATUS inproc_failed(struct dbwrap_py_db *db, const char *op);
/* A result of the wrong type: one log line, NT_STATUS_INTERNAL_DB_ERROR. */
NTSTATUS inproc_contract(struct dbwrap_py_db *db, const char *op,
			 const char *expected, PyObject *got);
PyObject *inproc_bytes(TDB_DATA data);
/* The buffers joined into one bytes object. */
PyObject *inproc_join(const TDB_DATA *dbufs, int num_dbufs);

/* inproc_records.c */
NTSTATUS inproc_fetch(struct dbwrap_py_db *db, TDB_DATA key,
		      dbwrap_py_value_fn fn, void *private_data);
NTSTATUS inproc_lock(struct dbwrap_py_db *db, TDB_DATA key,
		     dbwrap_py_value_fn fn, void *private_data);
NTSTATUS inproc_unlock(struct dbwrap_py_db *db, TDB_DATA key);
NTSTATUS inproc_locked(struct dbwrap_py_db *db, TDB_DATA key,
		       dbwrap_py_locked_fn fn, void *private_data);
NTSTATUS inproc_storev(struct dbwrap_py_db *db, TDB_DATA key,
		       const TDB_DATA *dbufs, int num_dbufs, int flag);

/* inproc_native.c: the same record operations on native records, no GIL */
bool inproc_native_bind(struct dbwrap_py_db *db, PyObject *adapter);
NTSTATUS inproc_native_fetch(struct dbwrap_py_db *db, TDB_DATA key,
			     dbwrap_py_value_fn fn, void *private_data);
NTSTATUS inproc_native_lock(struct dbwrap_py_db *db, TDB_DATA key,
			    dbwrap_py_value_fn fn, void *private_data);
NTSTATUS inproc_native_unlock(struct dbwrap_py_db *db, TDB_DATA key);
NTSTATUS inproc_native_locked(struct dbwrap_py_db *db, TDB_DATA key,
			      dbwrap_py_locked_fn fn, void *private_data);
NTSTATUS inproc_native_store(struct dbwrap_py_db *db, TDB_DATA key,
			     const TDB_DATA *dbufs, int num_dbufs);
NTSTATUS inproc_native_delete(struct dbwrap_py_db *db, TDB_DATA key);
NTSTATUS inproc_native_exists(struct dbwrap_py_db *db, TDB_DATA key,
			      bool *exists);
NTSTATUS inproc_native_seqnum(struct dbwrap_py_db *db, int *seqnum);

#endif /* DBWRAP_PY_INPROC_H */
