/*
 * The hot record operations of the in-process transport.
 *
 * An SMB2 open plus close makes about twenty of these calls (counted under
 * smb2.bench.path-contention-shared: 8 lock+read, 7 store+unlock and 4 reads
 * on locking.tdb, 4 more on smbXsrv_open_global.tdb), and under contention
 * their cost is paid inside smbd's share-mode lock. So they call the
 * adapter's bound methods directly rather than the Database object's Python
 * methods, whose rules they follow exactly: Database.fetch, .lock, .unlock
 * and plain stores. The hold counts stay in Database._held, so Python callers
 * (a read-write traverse, the CLI) and this code see the same locks.
 * Everything else (TDB_INSERT/TDB_MODIFY stores, deletes, traverse, ...)
 * goes through Database.
 *
 * An adapter that offers native records (native_records.h) skips all of
 * this: inproc_native.c calls them without the GIL.
 */

#include "inproc.h"

#define TDB_REPLACE_FLAG 1 /* tdb.h's TDB_REPLACE; 0 means the same */

/*
 * Database._unusable (set by close or a failed after_fork), raised if set.
 * Read from the instance dict: a full attribute lookup cost ten times more.
 */
static bool records_usable(struct dbwrap_py_db *db)
{
	PyObject *reason = PyDict_GetItemWithError(db->attrs, db->unusable);

	if (reason == Py_None) {
		return true;
	}
	if (reason == NULL) {
		if (!PyErr_Occurred()) {
			PyErr_SetString(PyExc_AttributeError, "Database._unusable");
		}
		return false;
	}
	PyErr_SetObject((PyObject *)Py_TYPE(reason), reason);
	return false;
}

/* Database._held[key], 0 when absent; -1 with an exception set. */
static long held_count(struct dbwrap_py_db *db, PyObject *pykey)
{
	PyObject *count = PyDict_GetItemWithError(db->held, pykey);

	if (count == NULL) {
		return PyErr_Occurred() ? -1 : 0;
	}
	return PyLong_AsLong(count);
}

static int held_set(struct dbwrap_py_db *db, PyObject *pykey, long count)
{
	PyObject *value;
	int ret;

	if (count <= 0) {
		return PyDict_DelItem(db->held, pykey);
	}
	value = PyLong_FromLong(count);
	if (value == NULL) {
		return -1;
	}
	ret = PyDict_SetItem(db->held, pykey, value);
	Py_DECREF(value);
	return ret;
}

/* An adapter's value as bytes or None (new reference), like Database does. */
static PyObject *records_value(struct dbwrap_py_db *db, const char *op,
			       PyObject *result, NTSTATUS *status)
{
	PyObject *value;

	if (result == Py_None || PyBytes_CheckExact(result)) {
		return result;
	}
	if (PyByteArray_Check(result) || PyMemoryView_Check(result)) {
		value = PyBytes_FromObject(result);
		Py_DECREF(result);
		if (value == NULL) {
			*status = inproc_failed(db, op);
		}
		return value;
	}
	*status = inproc_contract(db, op, "bytes or None", result);
	Py_DECREF(result);
	return NULL;
}

static PyObject *call2(PyObject *fn, PyObject *a, PyObject *b)
{
	PyObject *args[2] = { a, b };

	return PyObject_Vectorcall(fn, args, 2, NULL);
}

/* Database.unlock: release one hold, storing `write` first if given. */
static NTSTATUS records_unlock(struct dbwrap_py_db *db, PyObject *pykey,
			       PyObject *write)
{
	const char *op = (write != NULL) ? "store+unlock" : "unlock";
	long held = held_count(db, pykey);
	PyObject *result;

	if (held < 0 || (held > 0 && held_set(db, pykey, held - 1) != 0)) {
		return inproc_failed(db, op);
	}
	if (write == NULL) {
		if (held != 1) {
			return NT_STATUS_OK; /* still held, or never held (fork) */
		}
		result = PyObject_CallOneArg(db->adapter[A_UNLOCK], pykey);
	} else if (held == 1) {
		result = call2(db->adapter[A_PUT_UNLOCK], pykey, write);
	} else {
		result = call2(db->adapter[A_PUT], pykey, write);
	}
	if (result == NULL) {
		return inproc_failed(db, op);
	}
	Py_DECREF(result);
	return NT_STATUS_OK;
}

/* Database.lock: take a hold (the adapter's lock with the first), then read. */
static PyObject *records_lock(struct dbwrap_py_db *db, PyObject *pykey,
			      NTSTATUS *status)
{
	long held;
	PyObject *result, *value;

	if (!records_usable(db) || (held = held_count(db, pykey)) < 0) {
		*status = inproc_failed(db, "lock");
		return NULL;
	}
	/* lock_get releases its lock itself when it raises */
	result = PyObject_CallOneArg(db->adapter[held > 0 ? A_GET : A_LOCK_GET],
				     pykey);
	if (result == NULL) {
		*status = inproc_failed(db, "lock");
		return NULL;
	}
	if (held_set(db, pykey, held + 1) != 0) {
		*status = inproc_failed(db, "lock");
		Py_DECREF(result);
		if (held == 0) {
			/* locked, but not recorded: let go */
			(void)records_unlock(db, pykey, NULL);
		}
		return NULL;
	}
	value = records_value(db, "lock", result, status);
	if (value == NULL) {
		(void)records_unlock(db, pykey, NULL);
	}
	return value;
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

/* Database.fetch: read without locking. */
static PyObject *records_fetch(struct dbwrap_py_db *db, PyObject *pykey,
			       NTSTATUS *status)
{
	PyObject *result;

	if (!records_usable(db) ||
	    (result = PyObject_CallOneArg(db->adapter[A_GET], pykey)) == NULL) {
		*status = inproc_failed(db, "fetch");
		return NULL;
	}
	return records_value(db, "fetch", result, status);
}

typedef PyObject *(*records_reader)(struct dbwrap_py_db *db, PyObject *pykey,
				    NTSTATUS *status);

/* Read with `reader` and hand the value to a short callback (GIL held). */
static NTSTATUS records_read(struct dbwrap_py_db *db, TDB_DATA key,
			     records_reader reader, const char *op,
			     dbwrap_py_value_fn fn, void *private_data)
{
	PyGILState_STATE gil = PyGILState_Ensure();
	PyObject *pykey = inproc_bytes(key), *value = NULL;
	NTSTATUS status = NT_STATUS_OK;

	if (pykey == NULL) {
		status = inproc_failed(db, op);
	} else {
		value = reader(db, pykey, &status);
	}
	if (value != NULL) {
		fn(value_data(value), value != Py_None, private_data);
		Py_DECREF(value);
	}
	Py_XDECREF(pykey);
	PyGILState_Release(gil);
	return status;
}

NTSTATUS inproc_fetch(struct dbwrap_py_db *db, TDB_DATA key,
		      dbwrap_py_value_fn fn, void *private_data)
{
	if (db->native != NULL) {
		return inproc_native_fetch(db, key, fn, private_data);
	}
	return records_read(db, key, records_fetch, "fetch", fn, private_data);
}

/* fetch_locked: the record stays locked until inproc_unlock. */
NTSTATUS inproc_lock(struct dbwrap_py_db *db, TDB_DATA key,
		     dbwrap_py_value_fn fn, void *private_data)
{
	if (db->native != NULL) {
		return inproc_native_lock(db, key, fn, private_data);
	}
	return records_read(db, key, records_lock, "lock", fn, private_data);
}

NTSTATUS inproc_unlock(struct dbwrap_py_db *db, TDB_DATA key)
{
	PyGILState_STATE gil;
	PyObject *pykey;
	NTSTATUS status;

	if (db->native != NULL) {
		return inproc_native_unlock(db, key);
	}
	gil = PyGILState_Ensure();
	pykey = inproc_bytes(key);
	status = (pykey != NULL) ? records_unlock(db, pykey, NULL)
				 : inproc_failed(db, "unlock");
	Py_XDECREF(pykey);
	PyGILState_Release(gil);
	return status;
}

/* do_locked: lock and read, fn, then store what fn returns with the unlock. */
NTSTATUS inproc_locked(struct dbwrap_py_db *db, TDB_DATA key,
		       dbwrap_py_locked_fn fn, void *private_data)
{
	PyGILState_STATE gil;
	PyObject *pykey, *value = NULL, *pywrite = NULL;
	const TDB_DATA *write = NULL;
	NTSTATUS status = NT_STATUS_OK, unlocked;

	if (db->native != NULL) {
		return inproc_native_locked(db, key, fn, private_data);
	}
	gil = PyGILState_Ensure();
	pykey = inproc_bytes(key);
	if (pykey == NULL) {
		status = inproc_failed(db, "lock");
	} else {
		value = records_lock(db, pykey, &status);
	}
	if (value != NULL) {
		write = fn(value_data(value), value != Py_None, private_data);
		Py_DECREF(value);
		if (write != NULL && (pywrite = inproc_bytes(*write)) == NULL) {
			status = inproc_failed(db, "store+unlock");
		}
		/* the lock is released even when the store cannot be made */
		unlocked = records_unlock(db, pykey, pywrite);
		if (NT_STATUS_IS_OK(status)) {
			status = unlocked;
		}
		Py_XDECREF(pywrite);
	}
	Py_XDECREF(pykey);
	PyGILState_Release(gil);
	return status;
}

/* A store on a locked record: plain ones straight to the adapter. */
NTSTATUS inproc_storev(struct dbwrap_py_db *db, TDB_DATA key,
		       const TDB_DATA *dbufs, int num_dbufs, int flag)
{
	bool plain = (flag == 0 || flag == TDB_REPLACE_FLAG);
	PyGILState_STATE gil;
	PyObject *pykey, *value, *pyflag = NULL, *result = NULL;
	NTSTATUS status = NT_STATUS_OK;

	if (plain && db->native != NULL) {
		return inproc_native_store(db, key, dbufs, num_dbufs);
	}
	gil = PyGILState_Ensure();
	pykey = inproc_bytes(key);
	value = inproc_join(dbufs, num_dbufs);

	if (pykey != NULL && value != NULL) {
		if (!plain) {
			/* TDB_INSERT/TDB_MODIFY: Database checks them */
			pyflag = PyLong_FromLong(flag);
			PyObject *args[3] = { pykey, value, pyflag };
			result = pyflag ? PyObject_Vectorcall(db->methods[M_STORE],
							      args, 3, NULL)
					: NULL;
		} else if (records_usable(db)) {
			result = call2(db->adapter[A_PUT], pykey, value);
		}
	}
	if (result == NULL) {
		status = inproc_failed(db, "store");
	}
	Py_XDECREF(result);
	Py_XDECREF(pyflag);
	Py_XDECREF(value);
	Py_XDECREF(pykey);
	PyGILState_Release(gil);
	return status;
}
