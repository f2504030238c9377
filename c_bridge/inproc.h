/*
 * Private to the in-process transport: transport_inproc.c (open, close and
 * the database-wide operations), and its two tables of record operations,
 * inproc_python.c (through the record rules of dbwrap_py._records) and
 * inproc_native.c (an adapter's native records, without the GIL). The
 * table is chosen once, when the database opens.
 */

#ifndef DBWRAP_PY_INPROC_H
#define DBWRAP_PY_INPROC_H

#include "py_runtime.h" /* Python.h first, as CPython asks */

#include "native_records.h"
#include "records_api.h"
#include "transport.h"

/* Methods of the dbwrap_py.database.Database object. */
enum inproc_method {
	M_STORE, M_DELETE, M_EXISTS, M_TRAVERSE, M_SEQNUM, M_TXN_START,
	M_TXN_COMMIT, M_TXN_CANCEL, M_WIPE, M_CHECK, M_DB_ID, M_CLOSE,
	M_WRITE_THROUGH, M_COUNT
};

struct dbwrap_py_db {
	const char *name;
	PyObject *database;                /* dbwrap_py.database.Database */
	PyObject *methods[M_COUNT];        /* its bound methods */
	PyObject *records;                 /* Database.records: the record rules */
	const struct dbwrap_py_records_api *records_api;
	/* the adapter's native records (native_records.h), or NULL */
	const struct dbwrap_py_native_records *native;
	void *native_handle;
	PyObject *native_capsule;          /* keeps native_handle alive */
};

extern const char *const inproc_method_names[M_COUNT];

/* The pending exception as an NTSTATUS and one log line (GIL held). */
NTSTATUS inproc_failed(struct dbwrap_py_db *db, const char *op);
/* A result of the wrong type: one log line, NT_STATUS_INTERNAL_DB_ERROR. */
NTSTATUS inproc_contract(struct dbwrap_py_db *db, const char *op,
			 const char *expected, PyObject *got);
PyObject *inproc_bytes(TDB_DATA data);
/* The buffers joined into one bytes object (buffers.h). */
PyObject *inproc_join(const TDB_DATA *dbufs, int num_dbufs);
/* Database.store with a TDB_INSERT or TDB_MODIFY flag (takes the GIL). */
NTSTATUS inproc_store_flagged(struct dbwrap_py_db *db, TDB_DATA key,
			      const TDB_DATA *dbufs, int num_dbufs, int flag);

/* Database.write_through on a locked record (takes the GIL): transport.h. */
NTSTATUS inproc_write_through(struct dbwrap_py_db *db, TDB_DATA key);

/* inproc_python.c: records through dbwrap_py._records */
bool inproc_python_bind(struct dbwrap_py_db *db);
extern const struct dbwrap_py_record_ops inproc_python_records;

/* inproc_native.c: an adapter's native records; false if it has none */
bool inproc_native_bind(struct dbwrap_py_db *db, PyObject *adapter, bool *found);
extern const struct dbwrap_py_record_ops inproc_native_records;

#endif /* DBWRAP_PY_INPROC_H */
