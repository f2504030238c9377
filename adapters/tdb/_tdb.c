/*
 * dbwrap_py.adapters.tdb._tdb: the module, and the error map its types share.
 *
 * The mapping from tdb error codes to dbwrap_py exceptions is the
 * adapter's (adapters/tdb/adapter.py), handed over as a dict; this file only turns
 * it into raised exceptions and, for the native records, which run without
 * the GIL, into a table of NTSTATUS codes read from each class's ntstatus.
 */

#include "_tdb.h"
#include "tdb_api.h"

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

/* The dict's classes as NTSTATUS codes, by tdb error code. */
static int status_table(struct tdb_error_map *map)
{
	PyObject *code, *cls;
	Py_ssize_t pos = 0;
	long err;
	int i;

	if (!ntstatus_of(map->fallback, &map->fallback_status)) {
		return -1;
	}
	for (i = 0; i < TDB_ERROR_CODES; i++) {
		map->status_by_error[i] = map->fallback_status;
	}
	map->closed_status = map->fallback_status;
	/* the Python calls raise MemoryError for it, whatever the dict says */
	map->status_by_error[TDB_ERR_OOM] = NTSTATUS_NO_MEMORY;
	while (PyDict_Next(map->errors, &pos, &code, &cls)) {
		err = PyLong_AsLong(code);
		if (err == -1 && PyErr_Occurred()) {
			return -1;
		}
		if (err == TDB_ERROR_CLOSED &&
		    !ntstatus_of(cls, &map->closed_status)) {
			return -1;
		}
		if (err >= 0 && err < TDB_ERROR_CODES && err != TDB_ERR_OOM &&
		    !ntstatus_of(cls, &map->status_by_error[err])) {
			return -1;
		}
	}
	return 0;
}

int tdb_error_map_init(struct tdb_error_map *map, PyObject *errors,
		       PyObject *fallback)
{
	if (!PyDict_Check(errors)) {
		PyErr_SetString(PyExc_TypeError, "errors must be a dict");
		return -1;
	}
	Py_INCREF(errors);
	Py_XSETREF(map->errors, errors);
	Py_INCREF(fallback);
	Py_XSETREF(map->fallback, fallback);
	return status_table(map);
}

void tdb_error_map_clear(struct tdb_error_map *map)
{
	Py_CLEAR(map->errors);
	Py_CLEAR(map->fallback);
}

/* The class for code (borrowed): the dict's, else the fallback. */
PyObject *tdb_error_map_class(const struct tdb_error_map *map, int code)
{
	PyObject *key = PyLong_FromLong(code);
	PyObject *cls = NULL;

	if (key == NULL) {
		return NULL;
	}
	cls = PyDict_GetItemWithError(map->errors, key);
	Py_DECREF(key);
	if (cls == NULL && PyErr_Occurred()) {
		return NULL;
	}
	return cls != NULL ? cls : map->fallback;
}

uint32_t tdb_error_status(const struct tdb_error_map *map, int code)
{
	if (code >= 0 && code < TDB_ERROR_CODES) {
		return map->status_by_error[code];
	}
	return map->fallback_status;
}

/* Raise what tdb's last error on tdb maps to (tdb NULL: closed); NULL. */
PyObject *tdb_raise(const struct tdb_error_map *map, struct tdb_context *tdb,
		    const char *what)
{
	int code = (tdb != NULL) ? (int)tdb_error(tdb) : TDB_ERROR_CLOSED;
	PyObject *cls;

	if (code == TDB_ERR_OOM) {
		return PyErr_NoMemory();
	}
	cls = tdb_error_map_class(map, code);
	if (cls == NULL) {
		return NULL;
	}
	if (tdb == NULL) {
		PyErr_Format(cls, "%s: the database is closed", what);
		return NULL;
	}
	PyErr_Format(cls, "%s: %s (tdb error %d)", what, tdb_errorstr(tdb), code);
	return NULL;
}

static struct tdb_context *const *records_context_slot(PyObject *records)
{
	if (!PyObject_TypeCheck(records, &TdbRecordsType)) {
		PyErr_Format(PyExc_TypeError, "%s is not a tdb adapter", Py_TYPE(records)->tp_name);
		return NULL;
	}
	return &((TdbRecords *)records)->tdb;
}

static const struct dbwrap_py_tdb_api api = {
	.version = DBWRAP_PY_TDB_API_VERSION,
	.context_slot = records_context_slot,
};

/* tdb's own test (it forks a child); the caller keeps the answer. */
static PyObject *robust_mutexes(PyObject *module, PyObject *unused)
{
	bool supported;

	Py_BEGIN_ALLOW_THREADS
	supported = tdb_runtime_check_for_robust_mutexes();
	Py_END_ALLOW_THREADS
	return PyBool_FromLong(supported);
}

static PyMethodDef module_methods[] = {
	{ "robust_mutexes", robust_mutexes, METH_NOARGS,
	  "robust_mutexes() -> bool: whether TDB_MUTEX_LOCKING works here" },
	{ NULL }
};

static struct PyModuleDef module = {
	PyModuleDef_HEAD_INIT, "_tdb",
	"The dbwrap_py tdb adapter's way into libtdb: TdbFile (one open tdb) "
	"and TdbRecords (the adapter's record operations).",
	-1, module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__tdb(void)
{
	PyObject *m, *capsule;

	if (PyType_Ready(&TdbFileType) < 0 || PyType_Ready(&TdbRecordsType) < 0) {
		return NULL;
	}
	m = PyModule_Create(&module);
	if (m == NULL) {
		return NULL;
	}
	capsule = PyCapsule_New((void *)&api, DBWRAP_PY_TDB_API, NULL);
	if (PyModule_AddType(m, &TdbFileType) != 0 ||
	    PyModule_AddType(m, &TdbRecordsType) != 0 ||
	    PyModule_AddObject(m, "api", capsule) != 0) {
		Py_XDECREF(capsule);
		Py_DECREF(m);
		return NULL;
	}
	return m;
}
