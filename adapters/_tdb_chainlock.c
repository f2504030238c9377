/*
 * dbwrap_py.adapters._tdb_chainlock: tdb chainlocks for the tdb adapter.
 *
 * python3-tdb has no chainlocks; calling them through ctypes cost about
 * 0.7 us a call (make bench-bridge), several times the lock itself when tdb
 * uses robust mutexes. This module takes the `struct tdb_context *` the
 * adapter has already verified, as an int.
 *
 * A lock is first tried without blocking and with the GIL held; only if
 * another process holds it is the GIL released for the blocking wait.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <tdb.h>

static bool parse_args(PyObject *const *args, Py_ssize_t nargs,
		       struct tdb_context **tdb, TDB_DATA *key)
{
	char *buf;
	Py_ssize_t len;

	if (nargs != 2 || !PyLong_Check(args[0]) || !PyBytes_Check(args[1])) {
		PyErr_SetString(PyExc_TypeError, "expected (context: int, key: bytes)");
		return false;
	}
	*tdb = PyLong_AsVoidPtr(args[0]);
	if (*tdb == NULL) {
		if (!PyErr_Occurred()) {
			PyErr_SetString(PyExc_ValueError, "no tdb context");
		}
		return false;
	}
	if (PyBytes_AsStringAndSize(args[1], &buf, &len) != 0) {
		return false;
	}
	*key = (TDB_DATA) { (unsigned char *)buf, (size_t)len };
	return true;
}

/* chainlock(ctx, key) -> 0, or -1 with tdb_error(ctx) set */
static PyObject *chainlock(PyObject *self, PyObject *const *args,
			   Py_ssize_t nargs)
{
	struct tdb_context *tdb;
	TDB_DATA key;
	int ret;

	if (!parse_args(args, nargs, &tdb, &key)) {
		return NULL;
	}
	ret = tdb_chainlock_nonblock(tdb, key);
	if (ret != 0 && tdb_error(tdb) == TDB_ERR_LOCK) {
		Py_BEGIN_ALLOW_THREADS
		ret = tdb_chainlock(tdb, key);
		Py_END_ALLOW_THREADS
	}
	return PyLong_FromLong(ret);
}

/* chainunlock(ctx, key) -> 0, or -1 with tdb_error(ctx) set */
static PyObject *chainunlock(PyObject *self, PyObject *const *args,
			     Py_ssize_t nargs)
{
	struct tdb_context *tdb;
	TDB_DATA key;

	if (!parse_args(args, nargs, &tdb, &key)) {
		return NULL;
	}
	return PyLong_FromLong(tdb_chainunlock(tdb, key));
}

static PyMethodDef methods[] = {
	{ "chainlock", (PyCFunction)(void (*)(void))chainlock, METH_FASTCALL,
	  "Lock the hash chain of key; waits for other processes." },
	{ "chainunlock", (PyCFunction)(void (*)(void))chainunlock, METH_FASTCALL,
	  "Unlock the hash chain of key." },
	{ NULL, NULL, 0, NULL },
};

static struct PyModuleDef module = {
	PyModuleDef_HEAD_INIT, "_tdb_chainlock",
	"tdb chainlocks for the dbwrap_py tdb adapter", -1, methods,
	NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__tdb_chainlock(void)
{
	return PyModule_Create(&module);
}
