/*
 * The in-process transport: the adapter runs in this process's embedded
 * Python. The database is a dbwrap_py.database.Database object; its bound
 * methods are cached when it opens. Record operations go to one of two
 * tables, chosen here at open: inproc_native.c when the adapter offers
 * native records, else inproc_python.c. This file does the rest: open,
 * close, traverse, transactions, wipe, check and the id.
 *
 * Every entry takes the GIL and gives it back before returning, so it is
 * never held between dbwrap calls, nor while a caller's callback runs
 * (parse_record, do_locked, traverse): Samba's may block (g_lock's asks
 * ctdbd whether a holder lives), and the adapter's threads (lease
 * keepalives) must run meanwhile. A callback that re-enters the bridge
 * takes the GIL again. Keys cross as bytes (one
 * copy); values come back as bytes that callbacks read in place.
 */

#include "inproc.h"

#include "buffers.h"
#include "log.h"

const char *const inproc_method_names[M_COUNT] = {
	[M_STORE] = "store", [M_DELETE] = "delete", [M_EXISTS] = "exists",
	[M_TRAVERSE] = "traverse", [M_SEQNUM] = "seqnum",
	[M_TXN_START] = "transaction_start",
	[M_TXN_COMMIT] = "transaction_commit",
	[M_TXN_CANCEL] = "transaction_cancel", [M_WIPE] = "wipe",
	[M_CHECK] = "check", [M_DB_ID] = "db_id", [M_CLOSE] = "close",
	[M_WRITE_THROUGH] = "write_through",
};

/* -- helpers ---------------------------------------------------------------- */

NTSTATUS inproc_failed(struct dbwrap_py_db *db, const char *op)
{
	return py_runtime_status_from_exception(db->name, op);
}

NTSTATUS inproc_contract(struct dbwrap_py_db *db, const char *op,
			 const char *expected, PyObject *got)
{
	dbwrap_py_log(db->name, op,
		      "adapter returned %s, expected %s (NTSTATUS 0x%08x)",
		      Py_TYPE(got)->tp_name, expected,
		      (unsigned)NT_STATUS_V(NT_STATUS_INTERNAL_DB_ERROR));
	return NT_STATUS_INTERNAL_DB_ERROR;
}

PyObject *inproc_bytes(TDB_DATA data)
{
	return PyBytes_FromStringAndSize((const char *)data.dptr, data.dsize);
}

static NTSTATUS method_failed(struct dbwrap_py_db *db, enum inproc_method m)
{
	return inproc_failed(db, inproc_method_names[m]);
}

/* Call for its effect only: any result counts as success. */
static NTSTATUS call_void(struct dbwrap_py_db *db, enum inproc_method m,
			  PyObject *arg)
{
	PyGILState_STATE gil = PyGILState_Ensure();
	PyObject *result = (arg != NULL)
		? PyObject_CallOneArg(db->methods[m], arg)
		: PyObject_CallNoArgs(db->methods[m]);
	NTSTATUS status = (result != NULL) ? NT_STATUS_OK : method_failed(db, m);

	Py_XDECREF(result);
	PyGILState_Release(gil);
	return status;
}

static uint8_t *bytes_alloc(void *alloc_ctx, size_t len)
{
	PyObject **out = alloc_ctx;

	if (len > PY_SSIZE_T_MAX) {
		return NULL;
	}
	*out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len);
	return (*out != NULL) ? (uint8_t *)PyBytes_AS_STRING(*out) : NULL;
}

/* One copy; measured cheaper than passing a list (make bench-bridge). */
PyObject *inproc_join(const TDB_DATA *dbufs, int num_dbufs)
{
	PyObject *value = NULL;
	size_t len;

	if (dbwrap_py_join(dbufs, num_dbufs, bytes_alloc, &value, &len) == NULL) {
		return PyErr_Occurred() ? NULL : PyErr_NoMemory();
	}
	return value;
}

NTSTATUS inproc_store_flagged(struct dbwrap_py_db *db, TDB_DATA key,
			      const TDB_DATA *dbufs, int num_dbufs, int flag)
{
	PyGILState_STATE gil = PyGILState_Ensure();
	PyObject *pykey = inproc_bytes(key);
	PyObject *value = (pykey != NULL) ? inproc_join(dbufs, num_dbufs) : NULL;
	PyObject *pyflag = (value != NULL) ? PyLong_FromLong(flag) : NULL;
	PyObject *args[3] = { pykey, value, pyflag }, *result = NULL;
	NTSTATUS status = NT_STATUS_OK;

	/* TDB_INSERT/TDB_MODIFY: Database checks them under the record lock */
	if (pyflag != NULL) {
		result = PyObject_Vectorcall(db->methods[M_STORE], args, 3, NULL);
	}
	if (result == NULL) {
		status = method_failed(db, M_STORE);
	}
	Py_XDECREF(result);
	Py_XDECREF(pyflag);
	Py_XDECREF(value);
	Py_XDECREF(pykey);
	PyGILState_Release(gil);
	return status;
}

NTSTATUS inproc_write_through(struct dbwrap_py_db *db, TDB_DATA key)
{
	PyGILState_STATE gil = PyGILState_Ensure();
	PyObject *pykey = inproc_bytes(key);
	NTSTATUS status = NT_STATUS_NO_MEMORY;

	if (pykey != NULL) {
		PyObject *result = PyObject_CallOneArg(db->methods[M_WRITE_THROUGH], pykey);

		status = (result != NULL) ? NT_STATUS_OK
					  : method_failed(db, M_WRITE_THROUGH);
		Py_XDECREF(result);
		Py_DECREF(pykey);
	} else {
		PyErr_Clear();
	}
	PyGILState_Release(gil);
	return status;
}

/* -- open / close ----------------------------------------------------------- */

static int inproc_db_destructor(struct dbwrap_py_db *db)
{
	PyGILState_STATE gil = PyGILState_Ensure();
	PyObject *result;
	int i;

	if (db->methods[M_CLOSE] != NULL) {
		result = PyObject_CallNoArgs(db->methods[M_CLOSE]);
		if (result == NULL) {
			(void)method_failed(db, M_CLOSE);
		}
		Py_XDECREF(result);
	}
	for (i = 0; i < M_COUNT; i++) {
		Py_CLEAR(db->methods[i]);
	}
	Py_CLEAR(db->records);
	db->native = NULL;
	Py_CLEAR(db->native_capsule);
	Py_CLEAR(db->database);
	PyGILState_Release(gil);
	return 0;
}

static PyObject *inproc_options(const char *const *options)
{
	PyObject *list = PyList_New(0);
	size_t i;

	for (i = 0; list != NULL && options != NULL && options[i] != NULL; i++) {
		PyObject *item = PyUnicode_DecodeFSDefault(options[i]);

		if (item == NULL || PyList_Append(list, item) != 0) {
			Py_XDECREF(item);
			Py_CLEAR(list);
			break;
		}
		Py_DECREF(item);
	}
	return list;
}

static PyObject *inproc_open_database(const struct dbwrap_py_open_args *a)
{
	PyObject *options = inproc_options(a->options);
	PyObject *result;

	if (options == NULL) {
		return NULL;
	}
	result = PyObject_CallFunction(
		py_runtime_open_database(), "O&iiiiiKsO",
		PyUnicode_DecodeFSDefault, a->name, a->hash_size, a->tdb_flags,
		a->open_flags, (int)a->mode, a->lock_order,
		(unsigned long long)a->dbwrap_flags,
		a->adapter != NULL ? a->adapter : "", options);
	Py_DECREF(options);
	return result;
}

static bool bind_all(PyObject *obj, const char *const *names, PyObject **out,
		     int count)
{
	int i;

	for (i = 0; i < count; i++) {
		out[i] = PyObject_GetAttrString(obj, names[i]);
		if (out[i] == NULL) {
			return false;
		}
	}
	return true;
}

/* The Database's methods, and the record table for this adapter. */
static bool inproc_bind(struct dbwrap_py_db *db,
			const struct dbwrap_py_record_ops **records)
{
	PyObject *adapter = PyObject_GetAttrString(db->database, "adapter");
	bool native = false, ok;

	ok = adapter != NULL &&
	     bind_all(db->database, inproc_method_names, db->methods, M_COUNT) &&
	     inproc_native_bind(db, adapter, &native);
	Py_XDECREF(adapter);
	if (ok && !native) {
		ok = inproc_python_bind(db);
	}
	*records = native ? &inproc_native_records : &inproc_python_records;
	return ok;
}

static NTSTATUS inproc_open(TALLOC_CTX *mem_ctx,
			    const struct dbwrap_py_open_args *args,
			    struct dbwrap_py_db **pdb,
			    const struct dbwrap_py_record_ops **records)
{
	struct dbwrap_py_db *db;
	PyGILState_STATE gil;
	NTSTATUS status = NT_STATUS_OK;

	if (!py_runtime_start(args->name)) {
		return NT_STATUS_INTERNAL_DB_ERROR;
	}
	db = talloc_zero(mem_ctx, struct dbwrap_py_db);
	if (db == NULL) {
		return NT_STATUS_NO_MEMORY;
	}
	db->name = args->name;

	gil = PyGILState_Ensure();
	db->database = inproc_open_database(args);
	if (db->database == NULL || !inproc_bind(db, records)) {
		status = py_runtime_status_from_exception(db->name, "open");
	}
	PyGILState_Release(gil);

	talloc_set_destructor(db, inproc_db_destructor);
	if (!NT_STATUS_IS_OK(status)) {
		TALLOC_FREE(db);
		return status;
	}
	*pdb = db;
	return NT_STATUS_OK;
}

/* -- traverse --------------------------------------------------------------- */

static bool inproc_split_pair(PyObject *item, TDB_DATA *key, TDB_DATA *value)
{
	PyObject *k, *v;

	if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
		return false;
	}
	k = PyTuple_GET_ITEM(item, 0);
	v = PyTuple_GET_ITEM(item, 1);
	if (!PyBytes_Check(k) || !PyBytes_Check(v)) {
		return false;
	}
	*key = (TDB_DATA) { (uint8_t *)PyBytes_AS_STRING(k), PyBytes_GET_SIZE(k) };
	*value = (TDB_DATA) { (uint8_t *)PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v) };
	return true;
}

/* Walk the iterator; fn runs without the GIL. GIL held on entry and exit. */
static NTSTATUS inproc_walk(struct dbwrap_py_db *db, PyObject *iter,
			    dbwrap_py_record_fn fn, void *private_data,
			    int *count)
{
	PyObject *item;
	PyThreadState *ts;
	TDB_DATA key, value;
	int stop;

	while ((item = PyIter_Next(iter)) != NULL) {
		if (!inproc_split_pair(item, &key, &value)) {
			NTSTATUS status = inproc_contract(db, "traverse",
							  "(bytes, bytes)", item);
			Py_DECREF(item);
			return status;
		}
		*count += 1;
		ts = PyEval_SaveThread();
		stop = fn(key, value, private_data);
		PyEval_RestoreThread(ts);
		Py_DECREF(item);
		if (stop != 0) {
			return NT_STATUS_OK;
		}
	}
	return PyErr_Occurred() ? method_failed(db, M_TRAVERSE) : NT_STATUS_OK;
}

static NTSTATUS inproc_traverse(struct dbwrap_py_db *db, bool write,
				dbwrap_py_record_fn fn, void *private_data,
				int *count)
{
	PyGILState_STATE gil = PyGILState_Ensure();
	PyObject *iter = PyObject_CallOneArg(db->methods[M_TRAVERSE],
					     write ? Py_True : Py_False);
	NTSTATUS status;
	PyObject *closed;

	if (iter == NULL) {
		status = method_failed(db, M_TRAVERSE);
	} else if (!PyIter_Check(iter)) {
		status = inproc_contract(db, "traverse", "an iterator", iter);
	} else {
		status = inproc_walk(db, iter, fn, private_data, count);
		/* releases the lock of the record the walk stopped on */
		closed = PyObject_CallMethod(iter, "close", NULL);
		if (closed == NULL && NT_STATUS_IS_OK(status)) {
			status = method_failed(db, M_TRAVERSE);
		}
		Py_XDECREF(closed);
		PyErr_Clear();
	}
	Py_XDECREF(iter);
	PyGILState_Release(gil);
	return status;
}

/* -- database-wide ---------------------------------------------------------- */

static NTSTATUS inproc_transaction(struct dbwrap_py_db *db,
				   enum dbwrap_py_txn_op op)
{
	switch (op) {
	case DBWRAP_PY_TXN_START:
		return call_void(db, M_TXN_START, Py_False);
	case DBWRAP_PY_TXN_START_NONBLOCK:
		return call_void(db, M_TXN_START, Py_True);
	case DBWRAP_PY_TXN_COMMIT:
		return call_void(db, M_TXN_COMMIT, NULL);
	case DBWRAP_PY_TXN_CANCEL:
		return call_void(db, M_TXN_CANCEL, NULL);
	}
	return NT_STATUS_INVALID_PARAMETER;
}

static NTSTATUS inproc_wipe(struct dbwrap_py_db *db)
{
	return call_void(db, M_WIPE, NULL);
}

static NTSTATUS inproc_check(struct dbwrap_py_db *db)
{
	return call_void(db, M_CHECK, NULL);
}

static NTSTATUS inproc_db_id(struct dbwrap_py_db *db, TALLOC_CTX *mem_ctx,
			     uint8_t **id, size_t *idlen)
{
	PyGILState_STATE gil = PyGILState_Ensure();
	PyObject *result = PyObject_CallNoArgs(db->methods[M_DB_ID]);
	NTSTATUS status = NT_STATUS_OK;

	if (result == NULL) {
		status = method_failed(db, M_DB_ID);
	} else if (!PyBytes_Check(result) || PyBytes_GET_SIZE(result) == 0) {
		status = inproc_contract(db, "db_id", "non-empty bytes", result);
	} else {
		*idlen = PyBytes_GET_SIZE(result);
		*id = talloc_memdup(mem_ctx, PyBytes_AS_STRING(result), *idlen);
		if (*id == NULL) {
			status = NT_STATUS_NO_MEMORY;
		}
	}
	Py_XDECREF(result);
	PyGILState_Release(gil);
	return status;
}

const struct dbwrap_py_transport dbwrap_py_transport_inproc = {
	.name = "inproc",
	.open = inproc_open,
	.traverse = inproc_traverse,
	.transaction = inproc_transaction,
	.wipe = inproc_wipe,
	.check = inproc_check,
	.db_id = inproc_db_id,
};
