/*
 * dbwrap_py.adapters._tdb_records: the tdb adapter's record operations in C.
 *
 * python3-tdb has no chainlocks, and every SMB2 open and close makes some
 * twenty record calls, paid inside smbd's share-mode lock under contention.
 * So the hot operations (get, lock_get, put, put_unlock, unlock, lock) are
 * methods of a small C object; the adapter installs its bound methods, and
 * the bridge then calls libtdb without a Python frame in between (make
 * bench-bridge and bench-smb measured the difference).
 *
 * Records(context, errors, default) works on the `struct tdb_context *`
 * the adapter has verified, given as an int; `context` may be changed (after
 * fork the adapter reopens) and is 0 once the adapter is closed. Failures
 * raise the exception class errors[tdb_error] (default otherwise; errors[-1]
 * once closed), so the mapping to dbwrap_py exceptions stays in the adapter.
 *
 * A lock is first tried without blocking and with the GIL held; only if
 * another process holds it is the GIL released for the blocking wait.
 *
 * The same operations are offered to the bridge as native records
 * (c_bridge/native_records.h, the `native_records` capsule), which it calls
 * without the GIL; failures then come back as the NTSTATUS of the exception
 * class the Python methods would raise, so both paths answer alike.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <tdb.h>

#include "native_records.h"

#define TDB_ERROR_CODES 32 /* tdb's error codes are small; others use fallback */

typedef struct {
	PyObject_HEAD
	struct tdb_context *tdb;
	PyObject *errors;   /* dict: tdb error code -> exception class */
	PyObject *fallback; /* exception class for other codes */
	/* the same mapping as NTSTATUS codes, for the native records */
	uint32_t status_by_error[TDB_ERROR_CODES];
	uint32_t closed_status;
	uint32_t fallback_status;
} Records;

static PyObject *records_error(Records *self, const char *what)
{
	PyObject *code, *cls;
	int err = (self->tdb != NULL) ? (int)tdb_error(self->tdb) : -1;

	if (err == TDB_ERR_OOM) {
		return PyErr_NoMemory();
	}
	code = PyLong_FromLong(err);
	cls = (code != NULL) ? PyDict_GetItemWithError(self->errors, code) : NULL;
	Py_XDECREF(code);
	if (cls == NULL && PyErr_Occurred()) {
		return NULL;
	}
	PyErr_Format(cls != NULL ? cls : self->fallback, "%s: %s (tdb error %d)",
		     what, self->tdb != NULL ? tdb_errorstr(self->tdb) : "closed",
		     err);
	return NULL;
}

static bool key_of(Records *self, PyObject *arg, TDB_DATA *key, const char *what)
{
	char *buf;
	Py_ssize_t len;

	if (self->tdb == NULL) {
		records_error(self, what);
		return false;
	}
	if (PyBytes_AsStringAndSize(arg, &buf, &len) != 0) {
		return false;
	}
	*key = (TDB_DATA) { (unsigned char *)buf, (size_t)len };
	return true;
}

static int chainlock(struct tdb_context *tdb, TDB_DATA key)
{
	int ret = tdb_chainlock_nonblock(tdb, key);

	if (ret != 0 && tdb_error(tdb) == TDB_ERR_LOCK) {
		Py_BEGIN_ALLOW_THREADS
		ret = tdb_chainlock(tdb, key);
		Py_END_ALLOW_THREADS
	}
	return ret;
}

/* The value as bytes, or None for a missing key. */
static PyObject *fetch(Records *self, TDB_DATA key)
{
	TDB_DATA value = tdb_fetch(self->tdb, key);
	PyObject *result;

	if (value.dptr == NULL) {
		if (tdb_error(self->tdb) == TDB_ERR_NOEXIST) {
			Py_RETURN_NONE;
		}
		return records_error(self, "tdb_fetch");
	}
	result = PyBytes_FromStringAndSize((const char *)value.dptr, value.dsize);
	free(value.dptr);
	return result;
}

static PyObject *records_get(Records *self, PyObject *arg)
{
	TDB_DATA key;

	return key_of(self, arg, &key, "tdb_fetch") ? fetch(self, key) : NULL;
}

static PyObject *records_lock(Records *self, PyObject *arg)
{
	TDB_DATA key;

	if (!key_of(self, arg, &key, "tdb_chainlock")) {
		return NULL;
	}
	if (chainlock(self->tdb, key) != 0) {
		return records_error(self, "tdb_chainlock");
	}
	Py_RETURN_NONE;
}

/* Lock the key's chain if nobody holds it: True, else False at once. */
static PyObject *records_try_lock(Records *self, PyObject *arg)
{
	TDB_DATA key;

	if (!key_of(self, arg, &key, "tdb_chainlock_nonblock")) {
		return NULL;
	}
	if (tdb_chainlock_nonblock(self->tdb, key) == 0) {
		Py_RETURN_TRUE;
	}
	if (tdb_error(self->tdb) == TDB_ERR_LOCK) {
		Py_RETURN_FALSE;
	}
	return records_error(self, "tdb_chainlock_nonblock");
}

static PyObject *records_unlock(Records *self, PyObject *arg)
{
	TDB_DATA key;

	if (!key_of(self, arg, &key, "tdb_chainunlock")) {
		return NULL;
	}
	if (tdb_chainunlock(self->tdb, key) != 0) {
		return records_error(self, "tdb_chainunlock");
	}
	Py_RETURN_NONE;
}

/* Lock, then read; the lock is not kept when the read fails. */
static PyObject *records_lock_get(Records *self, PyObject *arg)
{
	TDB_DATA key;
	PyObject *value;

	if (!key_of(self, arg, &key, "tdb_chainlock")) {
		return NULL;
	}
	if (chainlock(self->tdb, key) != 0) {
		return records_error(self, "tdb_chainlock");
	}
	value = fetch(self, key);
	if (value == NULL) {
		tdb_chainunlock(self->tdb, key);
	}
	return value;
}

static bool parse_put(Records *self, PyObject *const *args, Py_ssize_t nargs,
		      TDB_DATA *key, TDB_DATA *value, const char *what)
{
	char *buf;
	Py_ssize_t len;

	if (nargs != 2) {
		PyErr_SetString(PyExc_TypeError, "expected (key: bytes, value: bytes)");
		return false;
	}
	if (!key_of(self, args[0], key, what) ||
	    PyBytes_AsStringAndSize(args[1], &buf, &len) != 0) {
		return false;
	}
	*value = (TDB_DATA) { (unsigned char *)buf, (size_t)len };
	return true;
}

static PyObject *records_put(Records *self, PyObject *const *args,
			     Py_ssize_t nargs)
{
	TDB_DATA key, value;

	if (!parse_put(self, args, nargs, &key, &value, "tdb_store")) {
		return NULL;
	}
	if (tdb_store(self->tdb, key, value, TDB_REPLACE) != 0) {
		return records_error(self, "tdb_store");
	}
	Py_RETURN_NONE;
}

/* Store, then unlock; the lock is released even when the store fails. */
static PyObject *records_put_unlock(Records *self, PyObject *const *args,
				    Py_ssize_t nargs)
{
	TDB_DATA key, value;
	PyObject *result = Py_None;

	if (!parse_put(self, args, nargs, &key, &value, "tdb_store")) {
		return NULL;
	}
	if (tdb_store(self->tdb, key, value, TDB_REPLACE) != 0) {
		result = records_error(self, "tdb_store");
	}
	if (tdb_chainunlock(self->tdb, key) != 0 && result != NULL) {
		result = records_error(self, "tdb_chainunlock");
	}
	Py_XINCREF(result);
	return result;
}

/* cls.ntstatus as a code; false with an exception set if it has none. */
static bool ntstatus_of(PyObject *cls, uint32_t *status)
{
	PyObject *code = PyObject_GetAttrString(cls, "ntstatus");

	if (code == NULL) {
		return false;
	}
	*status = (uint32_t)PyLong_AsUnsignedLongMask(code);
	Py_DECREF(code);
	return !PyErr_Occurred();
}

/* The errors dict, and the fallback, as NTSTATUS codes. */
static int status_table(Records *self)
{
	PyObject *code, *cls;
	Py_ssize_t pos = 0;
	long err;
	int i;

	if (!ntstatus_of(self->fallback, &self->fallback_status)) {
		return -1;
	}
	for (i = 0; i < TDB_ERROR_CODES; i++) {
		self->status_by_error[i] = self->fallback_status;
	}
	self->closed_status = self->fallback_status;
	while (PyDict_Next(self->errors, &pos, &code, &cls)) {
		err = PyLong_AsLong(code);
		if (err == -1 && PyErr_Occurred()) {
			return -1;
		}
		if (err == -1 && !ntstatus_of(cls, &self->closed_status)) {
			return -1;
		}
		if (err >= 0 && err < TDB_ERROR_CODES &&
		    !ntstatus_of(cls, &self->status_by_error[err])) {
			return -1;
		}
	}
	return 0;
}

static int records_init(Records *self, PyObject *args, PyObject *kwargs)
{
	PyObject *context, *errors, *fallback;

	if (!PyArg_ParseTuple(args, "OO!O", &context, &PyDict_Type, &errors,
			      &fallback)) {
		return -1;
	}
	self->tdb = PyLong_AsVoidPtr(context);
	if (self->tdb == NULL && PyErr_Occurred()) {
		return -1;
	}
	Py_INCREF(errors);
	Py_XSETREF(self->errors, errors);
	Py_INCREF(fallback);
	Py_XSETREF(self->fallback, fallback);
	return status_table(self);
}

static void records_dealloc(Records *self)
{
	Py_XDECREF(self->errors);
	Py_XDECREF(self->fallback);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *records_get_context(Records *self, void *closure)
{
	return PyLong_FromVoidPtr(self->tdb);
}

static int records_set_context(Records *self, PyObject *value, void *closure)
{
	void *tdb = (value != NULL) ? PyLong_AsVoidPtr(value) : NULL;

	if (tdb == NULL && PyErr_Occurred()) {
		return -1;
	}
	self->tdb = tdb;
	return 0;
}

/* -- native records: the same operations for the bridge, without the GIL -- */

static uint32_t native_error(Records *self, const char *what,
			     struct dbwrap_py_native_why *why)
{
	int err;

	if (self->tdb == NULL) {
		snprintf(why->text, sizeof(why->text), "%s: the tdb adapter is closed", what);
		return self->closed_status;
	}
	err = (int)tdb_error(self->tdb);
	snprintf(why->text, sizeof(why->text), "%s: %s (tdb error %d)", what,
		 tdb_errorstr(self->tdb), err);
	return (err >= 0 && err < TDB_ERROR_CODES) ? self->status_by_error[err]
						    : self->fallback_status;
}

struct native_parse {
	dbwrap_py_native_value_fn fn;
	void *private_data;
};

static int native_parser(TDB_DATA key, TDB_DATA data, void *private_data)
{
	struct native_parse *p = private_data;

	p->fn(data, true, p->private_data);
	return 0;
}

/* tdb_parse_record, with a missing key handed over as not found. */
static uint32_t native_parse(Records *self, TDB_DATA key,
			     dbwrap_py_native_value_fn fn, void *private_data,
			     struct dbwrap_py_native_why *why)
{
	struct native_parse p = { fn, private_data };

	if (tdb_parse_record(self->tdb, key, native_parser, &p) == 0) {
		return 0;
	}
	if (tdb_error(self->tdb) == TDB_ERR_NOEXIST) {
		fn(tdb_null, false, private_data);
		return 0;
	}
	return native_error(self, "tdb_parse_record", why);
}

static uint32_t native_fetch(void *handle, TDB_DATA key,
			     dbwrap_py_native_value_fn fn, void *private_data,
			     struct dbwrap_py_native_why *why)
{
	Records *self = handle;

	if (self->tdb == NULL) {
		return native_error(self, "tdb_parse_record", why);
	}
	return native_parse(self, key, fn, private_data, why);
}

static uint32_t native_lock_fetch(void *handle, TDB_DATA key,
				  dbwrap_py_native_value_fn fn,
				  void *private_data,
				  struct dbwrap_py_native_why *why)
{
	Records *self = handle;
	uint32_t status;

	if (self->tdb == NULL || tdb_chainlock(self->tdb, key) != 0) {
		return native_error(self, "tdb_chainlock", why);
	}
	status = native_parse(self, key, fn, private_data, why);
	if (status != 0) {
		tdb_chainunlock(self->tdb, key);
	}
	return status;
}

static uint32_t native_unlock(void *handle, TDB_DATA key,
			      struct dbwrap_py_native_why *why)
{
	Records *self = handle;

	if (self->tdb == NULL) {
		return native_error(self, "tdb_chainunlock", why);
	}
	if (tdb_chainunlock(self->tdb, key) == 0) {
		return 0;
	}
	/*
	 * A record locked before fork() and freed in the child: the child
	 * never held the lock (the Python path skips it by its hold count).
	 */
	if (tdb_error(self->tdb) == TDB_ERR_LOCK) {
		return 0;
	}
	return native_error(self, "tdb_chainunlock", why);
}

static uint32_t native_storev(void *handle, TDB_DATA key, const TDB_DATA *dbufs,
			      int num_dbufs, struct dbwrap_py_native_why *why)
{
	Records *self = handle;

	if (self->tdb == NULL ||
	    tdb_storev(self->tdb, key, dbufs, num_dbufs, TDB_REPLACE) != 0) {
		return native_error(self, "tdb_storev", why);
	}
	return 0;
}

static uint32_t native_delete(void *handle, TDB_DATA key,
			      struct dbwrap_py_native_why *why)
{
	Records *self = handle;

	if (self->tdb == NULL || tdb_delete(self->tdb, key) != 0) {
		return native_error(self, "tdb_delete", why);
	}
	return 0;
}

static uint32_t native_exists(void *handle, TDB_DATA key, bool *exists,
			      struct dbwrap_py_native_why *why)
{
	Records *self = handle;

	if (self->tdb == NULL) {
		return native_error(self, "tdb_exists", why);
	}
	*exists = tdb_exists(self->tdb, key) == 1;
	return 0;
}

static uint32_t native_seqnum(void *handle, int *seqnum,
			      struct dbwrap_py_native_why *why)
{
	Records *self = handle;

	if (self->tdb == NULL) {
		return native_error(self, "tdb_get_seqnum", why);
	}
	*seqnum = tdb_get_seqnum(self->tdb) & 0x7FFFFFFF;
	return 0;
}

static const struct dbwrap_py_native_records native_ops = {
	.fetch = native_fetch,
	.lock_fetch = native_lock_fetch,
	.unlock = native_unlock,
	.storev = native_storev,
	.delete_rec = native_delete,
	.exists = native_exists,
	.seqnum = native_seqnum,
};

static void native_capsule_free(PyObject *capsule)
{
	Py_XDECREF((PyObject *)PyCapsule_GetPointer(capsule,
						    DBWRAP_PY_NATIVE_RECORDS));
}

static PyObject *records_get_native(Records *self, void *closure)
{
	PyObject *capsule = PyCapsule_New(self, DBWRAP_PY_NATIVE_RECORDS,
					  native_capsule_free);

	if (capsule == NULL) {
		return NULL;
	}
	if (PyCapsule_SetContext(capsule, (void *)&native_ops) != 0) {
		Py_DECREF(capsule);
		return NULL;
	}
	Py_INCREF(self); /* the capsule keeps the handle alive */
	return capsule;
}

static PyMethodDef records_methods[] = {
	{ "get", (PyCFunction)records_get, METH_O, "The value, or None." },
	{ "lock", (PyCFunction)records_lock, METH_O, "Lock the key's chain." },
	{ "try_lock", (PyCFunction)records_try_lock, METH_O,
	  "Lock the key's chain if free: True, else False without waiting." },
	{ "unlock", (PyCFunction)records_unlock, METH_O, "Unlock the key's chain." },
	{ "lock_get", (PyCFunction)records_lock_get, METH_O, "Lock, then read." },
	{ "put", (PyCFunction)(void (*)(void))records_put, METH_FASTCALL,
	  "Store (TDB_REPLACE)." },
	{ "put_unlock", (PyCFunction)(void (*)(void))records_put_unlock,
	  METH_FASTCALL, "Store, then unlock." },
	{ NULL, NULL, 0, NULL },
};

static PyGetSetDef records_getset[] = {
	{ "context", (getter)records_get_context, (setter)records_set_context,
	  "the struct tdb_context * as an int; 0 when closed", NULL },
	{ "native_records", (getter)records_get_native, NULL,
	  "these operations for the bridge, as a capsule (native_records.h)", NULL },
	{ NULL, NULL, NULL, NULL, NULL },
};

static PyTypeObject RecordsType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "dbwrap_py.adapters._tdb_records.Records",
	.tp_basicsize = sizeof(Records),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "tdb record operations on one verified tdb context",
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)records_init,
	.tp_dealloc = (destructor)records_dealloc,
	.tp_methods = records_methods,
	.tp_getset = records_getset,
};

static struct PyModuleDef module = {
	PyModuleDef_HEAD_INIT, "_tdb_records",
	"record operations in C for the dbwrap_py tdb adapter", -1, NULL,
	NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__tdb_records(void)
{
	PyObject *m;

	if (PyType_Ready(&RecordsType) < 0) {
		return NULL;
	}
	m = PyModule_Create(&module);
	if (m != NULL && PyModule_AddType(m, &RecordsType) != 0) {
		Py_CLEAR(m);
	}
	return m;
}
