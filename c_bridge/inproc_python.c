/*
 * Record operations through the adapter's Python methods, for an adapter
 * without native records.
 *
 * The hot calls (fetch, lock, unlock, plain stores; an SMB2 open plus close
 * makes about twenty) go to the database's record rules, the
 * dbwrap_py._records.Records object that Database keeps, through its C
 * interface (records_api.h): the hold counts and usability live there, for
 * Python callers and this file alike, and no Python frame runs between the
 * bridge and the adapter. The others (flagged stores, deletes, exists,
 * seqnum) call Database's methods.
 *
 * A plain store inside do_locked is deferred by db_ops.c and arrives with
 * the unlock, so the adapter may write and release in one round trip.
 */

#include "inproc.h"

#define TDB_REPLACE_FLAG 1 /* tdb.h's TDB_REPLACE; 0 means the same */

bool inproc_python_bind(struct dbwrap_py_db *db)
{
	db->records_api = PyCapsule_Import(DBWRAP_PY_RECORDS_API, 0);
	if (db->records_api == NULL) {
		return false;
	}
	if (db->records_api->version != DBWRAP_PY_RECORDS_API_VERSION) {
		PyErr_Format(PyExc_ImportError, "%s is version %u, the bridge needs %u",
			     DBWRAP_PY_RECORDS_API, db->records_api->version,
			     DBWRAP_PY_RECORDS_API_VERSION);
		return false;
	}
	db->records = PyObject_GetAttrString(db->database, "records");
	return db->records != NULL;
}

/* A bytes-or-None value, read in place. */
static TDB_DATA value_data(PyObject *value)
{
	if (value == Py_None) {
		return tdb_null;
	}
	return (TDB_DATA) { (uint8_t *)PyBytes_AS_STRING(value),
			    PyBytes_GET_SIZE(value) };
}

typedef PyObject *(*records_reader)(PyObject *records, PyObject *key);

/*
 * A callback of the caller's on a value read in place, without the GIL.
 * Samba's callbacks may block: g_lock's, under do_locked, asks ctdbd
 * whether a holder's process lives, which waits out a ctdb recovery. The
 * GIL held meanwhile starved the adapter's own threads (etcd's lease
 * keepalive: the lease lapsed and took this process's locks with it).
 * The value is a bytes object we hold a reference to: nothing changes it.
 */
static void value_callback(dbwrap_py_value_fn fn, PyObject *value, void *private_data)
{
	PyThreadState *ts = PyEval_SaveThread();

	fn(value_data(value), value != Py_None, private_data);
	PyEval_RestoreThread(ts);
}

/* Read with `reader` and hand the value to a callback (without the GIL). */
static NTSTATUS python_read(struct dbwrap_py_db *db, TDB_DATA key,
			    records_reader reader, const char *op,
			    dbwrap_py_value_fn fn, void *private_data)
{
	PyGILState_STATE gil = PyGILState_Ensure();
	PyObject *pykey = inproc_bytes(key);
	PyObject *value = (pykey != NULL) ? reader(db->records, pykey) : NULL;
	NTSTATUS status = NT_STATUS_OK;

	if (value == NULL) {
		status = inproc_failed(db, op);
	} else {
		value_callback(fn, value, private_data);
		Py_DECREF(value);
	}
	Py_XDECREF(pykey);
	PyGILState_Release(gil);
	return status;
}

static NTSTATUS python_fetch(struct dbwrap_py_db *db, TDB_DATA key,
			     dbwrap_py_value_fn fn, void *private_data)
{
	return python_read(db, key, db->records_api->fetch, "fetch", fn, private_data);
}

/* fetch_locked: the record stays locked until python_unlock. */
static NTSTATUS python_lock(struct dbwrap_py_db *db, TDB_DATA key,
			    dbwrap_py_value_fn fn, void *private_data)
{
	return python_read(db, key, db->records_api->lock, "lock", fn, private_data);
}

static NTSTATUS python_unlock(struct dbwrap_py_db *db, TDB_DATA key)
{
	PyGILState_STATE gil = PyGILState_Ensure();
	PyObject *pykey = inproc_bytes(key);
	NTSTATUS status = NT_STATUS_OK;

	if (pykey == NULL || db->records_api->unlock(db->records, pykey, NULL) != 0) {
		status = inproc_failed(db, "unlock");
	}
	Py_XDECREF(pykey);
	PyGILState_Release(gil);
	return status;
}

/*
 * do_locked: lock and read, fn, then store what fn returns with the unlock.
 * fn reads the value in place: a bytes object nothing else can change.
 */
static NTSTATUS python_locked(struct dbwrap_py_db *db, TDB_DATA key,
			      dbwrap_py_locked_fn fn, void *private_data)
{
	PyGILState_STATE gil = PyGILState_Ensure();
	PyObject *pykey = inproc_bytes(key), *value, *pywrite = NULL;
	const TDB_DATA *write;
	NTSTATUS status = NT_STATUS_OK;

	value = (pykey != NULL) ? db->records_api->lock(db->records, pykey) : NULL;
	if (value == NULL) {
		status = inproc_failed(db, "lock");
		Py_XDECREF(pykey);
		PyGILState_Release(gil);
		return status;
	}
	{
		PyThreadState *ts = PyEval_SaveThread(); /* as value_callback */

		write = fn(value_data(value), value != Py_None, private_data);
		PyEval_RestoreThread(ts);
	}
	Py_DECREF(value);
	if (write != NULL && (pywrite = inproc_bytes(*write)) == NULL) {
		status = inproc_failed(db, "store+unlock");
	}
	/* the lock is released even when the store cannot be made */
	if (db->records_api->unlock(db->records, pykey, pywrite) != 0 &&
	    NT_STATUS_IS_OK(status)) {
		status = inproc_failed(db, pywrite != NULL ? "store+unlock" : "unlock");
	}
	PyErr_Clear();
	Py_XDECREF(pywrite);
	Py_DECREF(pykey);
	PyGILState_Release(gil);
	return status;
}

/* A store on a locked record: plain ones through the record rules. */
static NTSTATUS python_storev(struct dbwrap_py_db *db, TDB_DATA key,
			      const TDB_DATA *dbufs, int num_dbufs, int flag)
{
	PyGILState_STATE gil;
	PyObject *pykey, *value;
	NTSTATUS status = NT_STATUS_OK;

	if (flag != 0 && flag != TDB_REPLACE_FLAG) {
		return inproc_store_flagged(db, key, dbufs, num_dbufs, flag);
	}
	gil = PyGILState_Ensure();
	pykey = inproc_bytes(key);
	value = (pykey != NULL) ? inproc_join(dbufs, num_dbufs) : NULL;
	if (value == NULL || db->records_api->store(db->records, pykey, value) != 0) {
		status = inproc_failed(db, "store");
	}
	Py_XDECREF(value);
	Py_XDECREF(pykey);
	PyGILState_Release(gil);
	return status;
}

static PyObject *call_key(struct dbwrap_py_db *db, enum inproc_method m, TDB_DATA key)
{
	PyObject *pykey = inproc_bytes(key);
	PyObject *result = (pykey != NULL)
		? PyObject_CallOneArg(db->methods[m], pykey) : NULL;

	Py_XDECREF(pykey);
	return result;
}

static NTSTATUS python_delete(struct dbwrap_py_db *db, TDB_DATA key)
{
	PyGILState_STATE gil = PyGILState_Ensure();
	PyObject *result = call_key(db, M_DELETE, key);
	NTSTATUS status = (result != NULL) ? NT_STATUS_OK : inproc_failed(db, "delete");

	Py_XDECREF(result);
	PyGILState_Release(gil);
	return status;
}

static NTSTATUS python_exists(struct dbwrap_py_db *db, TDB_DATA key, bool *exists)
{
	PyGILState_STATE gil = PyGILState_Ensure();
	PyObject *result = call_key(db, M_EXISTS, key);
	NTSTATUS status = NT_STATUS_OK;

	if (result == NULL) {
		status = inproc_failed(db, "exists");
	} else if (!PyBool_Check(result)) {
		status = inproc_contract(db, "exists", "bool", result);
	} else {
		*exists = (result == Py_True);
	}
	Py_XDECREF(result);
	PyGILState_Release(gil);
	return status;
}

static NTSTATUS python_seqnum(struct dbwrap_py_db *db, int *seqnum)
{
	PyGILState_STATE gil = PyGILState_Ensure();
	PyObject *result = PyObject_CallNoArgs(db->methods[M_SEQNUM]);
	NTSTATUS status = NT_STATUS_OK;
	long value;

	if (result == NULL) {
		status = inproc_failed(db, "seqnum");
	} else if (!PyLong_Check(result)) {
		status = inproc_contract(db, "seqnum", "int", result);
	} else {
		value = PyLong_AsLong(result);
		if ((value == -1 && PyErr_Occurred()) || value < 0 || value > INT32_MAX) {
			PyErr_Clear();
			status = inproc_contract(db, "seqnum", "an int in 0..2^31-1", result);
		} else {
			*seqnum = (int)value;
		}
	}
	Py_XDECREF(result);
	PyGILState_Release(gil);
	return status;
}

const struct dbwrap_py_record_ops inproc_python_records = {
	.name = "python",
	.defer_locked_stores = true,
	.fetch = python_fetch,
	.lock = python_lock,
	.unlock = python_unlock,
	.locked = python_locked,
	.storev = python_storev,
	.delete_rec = python_delete,
	.write_through = inproc_write_through,
	.exists = python_exists,
	.seqnum = python_seqnum,
};
