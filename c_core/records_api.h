/*
 * The record rules' C interface, between the dbwrap_py._records extension
 * (python/dbwrap_py/_records.c, their one owner) and the bridge.
 *
 * A dbwrap_py.database.Database keeps its record rules in a
 * dbwrap_py._records.Records object, its `records` attribute: re-entrant
 * record locks within a process (hold counts), whether the database is
 * still usable (closed, or a failed after_fork), and the type checks on
 * what the adapter returns. Python code calls its methods; the bridge calls
 * the same functions through this table, found in the module's `api`
 * capsule, without a Python frame in between.
 *
 * Every function runs with the GIL held. Values are new references to
 * bytes, or to Py_None for a missing key; NULL or -1 means failure, with a
 * Python exception set for the caller to map to an NTSTATUS.
 */

#ifndef DBWRAP_PY_RECORDS_API_H
#define DBWRAP_PY_RECORDS_API_H

#include <Python.h>

#define DBWRAP_PY_RECORDS_API "dbwrap_py._records.api"
#define DBWRAP_PY_RECORDS_API_VERSION 1

struct dbwrap_py_records_api {
	unsigned version;
	/* Read without locking. */
	PyObject *(*fetch)(PyObject *records, PyObject *key);
	/* Take a hold on the record (the adapter's lock with the first), then read. */
	PyObject *(*lock)(PyObject *records, PyObject *key);
	/*
	 * Release one hold; the adapter's lock goes with the last. `write`, if
	 * not NULL, is stored first (with the last hold: put_unlock, one round
	 * trip). The lock is released even when that store fails.
	 */
	int (*unlock)(PyObject *records, PyObject *key, PyObject *write);
	/* Store on a record this process holds locked. */
	int (*store)(PyObject *records, PyObject *key, PyObject *value);
};

#endif /* DBWRAP_PY_RECORDS_API_H */
