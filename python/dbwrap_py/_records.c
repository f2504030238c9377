/*
 * dbwrap_py._records: the record rules of one open database, in one place.
 *
 * Records(adapter, max_value_size=0) keeps what dbwrap asks of record
 * operations that an adapter need not do itself:
 *   - re-entrant record locks within a process: the adapter's lock is taken
 *     with the first hold and released with the last (hold counts);
 *   - read-your-writes for the holder: a nested hold reads with get, and
 *     writes reach the adapter at once;
 *   - whether the database can still be used (closed, or after_fork failed);
 *   - type checks on the adapter's answers (AdapterContractError);
 *   - the adapter's declared max_value_size (InvalidParameter).
 *
 * dbwrap_py.database.Database calls these methods from Python; the C bridge
 * calls the same functions through the `api` capsule (c_core/records_api.h)
 * on every hot record call of an adapter without native records. Neither
 * side keeps a copy of these rules.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdbool.h>

#include "records_api.h"

/* the adapter's record methods this object calls, bound once */
enum adapter_method { A_GET, A_LOCK_GET, A_UNLOCK, A_PUT, A_PUT_UNLOCK, A_COUNT };
static const char *const adapter_method_names[A_COUNT] = {
	"get", "lock_get", "unlock", "put", "put_unlock",
};

typedef struct {
	PyObject_HEAD
	PyObject *adapter[A_COUNT];
	PyObject *held;     /* dict: key -> hold count (positive int) */
	PyObject *unusable; /* the exception to raise, or NULL while usable */
	Py_ssize_t max_value_size; /* the adapter's declared limit; 0: none */
} Records;

static PyObject *contract_error;  /* dbwrap_py.errors.AdapterContractError */
static PyObject *invalid_param;   /* dbwrap_py.errors.InvalidParameter */

/* -- the rules --------------------------------------------------------------- */

static int check_usable(Records *self)
{
	if (self->unusable == NULL) {
		return 0;
	}
	PyErr_SetObject((PyObject *)Py_TYPE(self->unusable), self->unusable);
	return -1;
}

/* A value the adapter declared it cannot store fails here, before it gets it. */
static int check_size(Records *self, PyObject *value)
{
	if (self->max_value_size == 0 || PyBytes_GET_SIZE(value) <= self->max_value_size) {
		return 0;
	}
	PyErr_Format(invalid_param, "a %zd-byte value is over the adapter's declared"
		     " max_value_size of %zd bytes", PyBytes_GET_SIZE(value),
		     self->max_value_size);
	return -1;
}

/* An adapter's answer as bytes or None (steals `result`). */
static PyObject *checked_value(PyObject *result, const char *method)
{
	PyObject *value;

	if (result == NULL || result == Py_None || PyBytes_CheckExact(result)) {
		return result;
	}
	if (PyByteArray_Check(result) || PyMemoryView_Check(result)) {
		value = PyBytes_FromObject(result);
		Py_DECREF(result);
		return value;
	}
	PyErr_Format(contract_error, "%s returned %s, expected bytes or None", method,
		     Py_TYPE(result)->tp_name);
	Py_DECREF(result);
	return NULL;
}

/* The hold count of key: 0 when not held, -1 with an exception set. */
static long hold_count(Records *self, PyObject *key)
{
	PyObject *count = PyDict_GetItemWithError(self->held, key);

	if (count == NULL) {
		return PyErr_Occurred() ? -1 : 0;
	}
	return PyLong_AsLong(count);
}

static int set_hold_count(Records *self, PyObject *key, long count)
{
	PyObject *value;
	int ret;

	if (count <= 0) {
		return PyDict_DelItem(self->held, key);
	}
	value = PyLong_FromLong(count);
	if (value == NULL) {
		return -1;
	}
	ret = PyDict_SetItem(self->held, key, value);
	Py_DECREF(value);
	return ret;
}

static PyObject *call2(PyObject *fn, PyObject *a, PyObject *b)
{
	PyObject *args[2] = { a, b };

	return PyObject_Vectorcall(fn, args, 2, NULL);
}

static PyObject *records_fetch_key(PyObject *obj, PyObject *key)
{
	Records *self = (Records *)obj;

	if (check_usable(self) != 0) {
		return NULL;
	}
	return checked_value(PyObject_CallOneArg(self->adapter[A_GET], key), "get");
}

/* The adapter's unlock, keeping the pending exception. */
static void undo_lock(Records *self, PyObject *key)
{
	PyObject *type, *value, *traceback, *result;

	PyErr_Fetch(&type, &value, &traceback);
	result = PyObject_CallOneArg(self->adapter[A_UNLOCK], key);
	Py_XDECREF(result);
	PyErr_Clear();
	PyErr_Restore(type, value, traceback);
}

static int records_unlock_key(PyObject *obj, PyObject *key, PyObject *write)
{
	Records *self = (Records *)obj;
	long held = hold_count(self, key);
	PyObject *result;

	if (held < 0 || (held > 0 && set_hold_count(self, key, held - 1) != 0)) {
		return -1;
	}
	if (write != NULL && check_size(self, write) != 0) {
		if (held == 1) {
			undo_lock(self, key); /* the lock goes even when the store cannot be made */
		}
		return -1;
	}
	if (write == NULL) {
		if (held != 1) {
			return 0; /* still held; or never held here (locked before fork) */
		}
		result = PyObject_CallOneArg(self->adapter[A_UNLOCK], key);
	} else if (held == 1) {
		result = call2(self->adapter[A_PUT_UNLOCK], key, write);
	} else {
		result = call2(self->adapter[A_PUT], key, write);
	}
	Py_XDECREF(result);
	return result != NULL ? 0 : -1;
}

/* Let go of a hold taken by records_lock_key, keeping the pending exception. */
static void undo_hold(Records *self, PyObject *key)
{
	PyObject *type, *value, *traceback;

	PyErr_Fetch(&type, &value, &traceback);
	if (records_unlock_key((PyObject *)self, key, NULL) != 0) {
		PyErr_Clear();
	}
	PyErr_Restore(type, value, traceback);
}

static PyObject *records_lock_key(PyObject *obj, PyObject *key)
{
	Records *self = (Records *)obj;
	long held;
	PyObject *result, *value;

	if (check_usable(self) != 0 || (held = hold_count(self, key)) < 0) {
		return NULL;
	}
	/* lock_get releases its lock itself when it raises */
	result = PyObject_CallOneArg(self->adapter[held > 0 ? A_GET : A_LOCK_GET], key);
	if (result == NULL) {
		return NULL;
	}
	if (set_hold_count(self, key, held + 1) != 0) {
		Py_DECREF(result);
		if (held == 0) {
			undo_lock(self, key); /* locked, but not counted: let go */
		}
		return NULL;
	}
	value = checked_value(result, held > 0 ? "get" : "lock_get");
	if (value == NULL) {
		undo_hold(self, key);
	}
	return value;
}

static int records_store_key(PyObject *obj, PyObject *key, PyObject *value)
{
	Records *self = (Records *)obj;
	PyObject *result;

	if (check_usable(self) != 0 || check_size(self, value) != 0) {
		return -1;
	}
	result = call2(self->adapter[A_PUT], key, value);
	Py_XDECREF(result);
	return result != NULL ? 0 : -1;
}

/* -- the Python methods -------------------------------------------------------- */

static bool is_bytes(PyObject *arg, const char *what)
{
	if (PyBytes_Check(arg)) {
		return true;
	}
	PyErr_Format(PyExc_TypeError, "%s must be bytes, not %s", what, Py_TYPE(arg)->tp_name);
	return false;
}

static PyObject *py_fetch(Records *self, PyObject *key)
{
	return is_bytes(key, "key") ? records_fetch_key((PyObject *)self, key) : NULL;
}

static PyObject *py_lock(Records *self, PyObject *key)
{
	return is_bytes(key, "key") ? records_lock_key((PyObject *)self, key) : NULL;
}

static PyObject *py_unlock(Records *self, PyObject *const *args, Py_ssize_t nargs)
{
	PyObject *write = (nargs > 1 && args[1] != Py_None) ? args[1] : NULL;

	if (nargs < 1 || nargs > 2) {
		PyErr_SetString(PyExc_TypeError, "unlock(key, value=None)");
		return NULL;
	}
	if (!is_bytes(args[0], "key") || (write != NULL && !is_bytes(write, "value")) ||
	    records_unlock_key((PyObject *)self, args[0], write) != 0) {
		return NULL;
	}
	Py_RETURN_NONE;
}

static PyObject *py_store(Records *self, PyObject *const *args, Py_ssize_t nargs)
{
	if (nargs != 2) {
		PyErr_SetString(PyExc_TypeError, "store(key, value)");
		return NULL;
	}
	if (!is_bytes(args[0], "key") || !is_bytes(args[1], "value") ||
	    records_store_key((PyObject *)self, args[0], args[1]) != 0) {
		return NULL;
	}
	Py_RETURN_NONE;
}

static PyObject *py_held(Records *self, PyObject *key)
{
	long held = hold_count(self, key);

	return held < 0 ? NULL : PyLong_FromLong(held);
}

static PyObject *py_check_usable(Records *self, PyObject *unused)
{
	if (check_usable(self) != 0) {
		return NULL;
	}
	Py_RETURN_NONE;
}

static PyObject *py_mark_unusable(Records *self, PyObject *exc)
{
	if (!PyExceptionInstance_Check(exc)) {
		PyErr_SetString(PyExc_TypeError, "mark_unusable needs an exception instance");
		return NULL;
	}
	Py_INCREF(exc);
	Py_XSETREF(self->unusable, exc);
	Py_RETURN_NONE;
}

static PyObject *py_forget_holds(Records *self, PyObject *unused)
{
	PyDict_Clear(self->held);
	Py_RETURN_NONE;
}

/* The keys held, forgotten: their adapter locks are the caller's to release. */
static PyObject *py_take_holds(Records *self, PyObject *unused)
{
	PyObject *keys = PyDict_Keys(self->held);

	if (keys != NULL) {
		PyDict_Clear(self->held);
	}
	return keys;
}

static PyMethodDef records_methods[] = {
	{ "fetch", (PyCFunction)py_fetch, METH_O, "parse_record: the value, or None." },
	{ "lock", (PyCFunction)py_lock, METH_O,
	  "Take a hold on the record (the adapter's lock with the first), then read it." },
	{ "unlock", (PyCFunction)(void (*)(void))py_unlock, METH_FASTCALL,
	  "unlock(key, value=None): release one hold, storing value first if given." },
	{ "store", (PyCFunction)(void (*)(void))py_store, METH_FASTCALL,
	  "store(key, value): a plain store on a record this process holds." },
	{ "held", (PyCFunction)py_held, METH_O, "How many holds this process has on key." },
	{ "check_usable", (PyCFunction)py_check_usable, METH_NOARGS,
	  "Raise why the database cannot be used, if it cannot." },
	{ "mark_unusable", (PyCFunction)py_mark_unusable, METH_O,
	  "From now on every record call raises this exception." },
	{ "forget_holds", (PyCFunction)py_forget_holds, METH_NOARGS,
	  "In a forked child: the parent's holds are not ours." },
	{ "take_holds", (PyCFunction)py_take_holds, METH_NOARGS,
	  "The held keys, forgotten (at close, to release their locks)." },
	{ NULL, NULL, 0, NULL },
};

/* -- the type ------------------------------------------------------------------ */

static int records_init(Records *self, PyObject *args, PyObject *kwargs)
{
	PyObject *adapter;
	Py_ssize_t max_value_size = 0;
	int i;

	if (!PyArg_ParseTuple(args, "O|n", &adapter, &max_value_size)) {
		return -1;
	}
	self->max_value_size = max_value_size > 0 ? max_value_size : 0;
	for (i = 0; i < A_COUNT; i++) {
		PyObject *method = PyObject_GetAttrString(adapter, adapter_method_names[i]);

		if (method == NULL) {
			return -1;
		}
		Py_XSETREF(self->adapter[i], method);
	}
	Py_XSETREF(self->held, PyDict_New());
	return self->held != NULL ? 0 : -1;
}

static int records_traverse(Records *self, visitproc visit, void *arg)
{
	int i;

	for (i = 0; i < A_COUNT; i++) {
		Py_VISIT(self->adapter[i]);
	}
	Py_VISIT(self->held);
	Py_VISIT(self->unusable);
	return 0;
}

static int records_clear(Records *self)
{
	int i;

	for (i = 0; i < A_COUNT; i++) {
		Py_CLEAR(self->adapter[i]);
	}
	Py_CLEAR(self->held);
	Py_CLEAR(self->unusable);
	return 0;
}

static void records_dealloc(Records *self)
{
	PyObject_GC_UnTrack(self);
	records_clear(self);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject RecordsType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "dbwrap_py._records.Records",
	.tp_basicsize = sizeof(Records),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
	.tp_doc = "The record rules of one open database (hold counts, usability, type checks).",
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)records_init,
	.tp_traverse = (traverseproc)records_traverse,
	.tp_clear = (inquiry)records_clear,
	.tp_dealloc = (destructor)records_dealloc,
	.tp_methods = records_methods,
};

/* -- the module ---------------------------------------------------------------- */

static const struct dbwrap_py_records_api api = {
	.version = DBWRAP_PY_RECORDS_API_VERSION,
	.fetch = records_fetch_key,
	.lock = records_lock_key,
	.unlock = records_unlock_key,
	.store = records_store_key,
};

static struct PyModuleDef module = {
	PyModuleDef_HEAD_INIT, "_records",
	"The record rules of dbwrap_py's databases (hold counts, usability), in one place.",
	-1, NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__records(void)
{
	PyObject *m, *errors, *capsule;

	if (PyType_Ready(&RecordsType) < 0) {
		return NULL;
	}
	errors = PyImport_ImportModule("dbwrap_py.errors");
	if (errors == NULL) {
		return NULL;
	}
	Py_XSETREF(contract_error, PyObject_GetAttrString(errors, "AdapterContractError"));
	Py_XSETREF(invalid_param, PyObject_GetAttrString(errors, "InvalidParameter"));
	Py_DECREF(errors);
	if (contract_error == NULL || invalid_param == NULL) {
		return NULL;
	}
	m = PyModule_Create(&module);
	if (m == NULL) {
		return NULL;
	}
	capsule = PyCapsule_New((void *)&api, DBWRAP_PY_RECORDS_API, NULL);
	if (PyModule_AddType(m, &RecordsType) != 0 ||
	    PyModule_AddObject(m, "api", capsule) != 0) {
		Py_XDECREF(capsule);
		Py_DECREF(m);
		return NULL;
	}
	return m;
}
