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
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <tdb.h>

typedef struct {
	PyObject_HEAD
	struct tdb_context *tdb;
	PyObject *errors;   /* dict: tdb error code -> exception class */
	PyObject *fallback; /* exception class for other codes */
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
	return 0;
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

static PyMethodDef records_methods[] = {
	{ "get", (PyCFunction)records_get, METH_O, "The value, or None." },
	{ "lock", (PyCFunction)records_lock, METH_O, "Lock the key's chain." },
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
