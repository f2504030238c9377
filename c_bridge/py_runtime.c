/*
 * The embedded CPython of dbwrap_py.
 *
 * Lifecycle (see the reference notes on forking servers):
 * - Python starts lazily, on the first db_open_py() of a process, with no
 *   signal handlers of its own, and releases the GIL straight away.
 * - pthread_atfork handlers bracket every fork of the host: the GIL is taken
 *   and PyOS_BeforeFork() runs before, PyOS_AfterFork_Parent/Child() after.
 *   The child's hook runs os.register_at_fork callbacks, which is how every
 *   open adapter gets after_fork() to drop inherited connections.
 *
 * `runtime` is the interpreter handle, the in-process transport's only global
 * state (the proxy transport's is its daemon connections, proxy_conn.c).
 */

/* Python.h first: it defines _GNU_SOURCE, which dladdr() needs */
#include "py_runtime.h"

#include <dlfcn.h>
#include <limits.h>
#include <libgen.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "inproc_loader.h"
#include "log.h"

#ifndef DBWRAP_PY_PYTHON
#define DBWRAP_PY_PYTHON "/usr/bin/python3"
#endif

static struct {
	bool started;
	bool atfork_registered;
	/* set by the prepare handler when it took the GIL for this fork */
	bool fork_bracketed;
	PyGILState_STATE fork_gil;
	PyObject *open_database;  /* dbwrap_py.database.open_database */
	PyObject *error_base;     /* dbwrap_py.errors.DbwrapError */
} runtime;

static void atfork_prepare(void)
{
	runtime.fork_bracketed = false;
	if (!Py_IsInitialized() || PyGILState_Check()) {
		/* no Python yet, or os.fork() from Python, which brackets itself */
		return;
	}
	runtime.fork_gil = PyGILState_Ensure();
	PyOS_BeforeFork();
	runtime.fork_bracketed = true;
}

static void atfork_parent(void)
{
	if (!runtime.fork_bracketed) {
		return;
	}
	runtime.fork_bracketed = false;
	PyOS_AfterFork_Parent();
	PyGILState_Release(runtime.fork_gil);
}

static void atfork_child(void)
{
	if (!runtime.fork_bracketed) {
		return;
	}
	runtime.fork_bracketed = false;
	PyOS_AfterFork_Child();
	PyGILState_Release(runtime.fork_gil);
}

#ifndef DBWRAP_PY_INSTALLED
/* <root>/.venv for the library at <root>/build/libdbwrap_py.so */
static bool venv_next_to_library(char *buf, size_t len)
{
	Dl_info info;
	char path[PATH_MAX];
	char *dir;

	if (dladdr((void *)venv_next_to_library, &info) == 0 ||
	    info.dli_fname == NULL || realpath(info.dli_fname, path) == NULL) {
		return false;
	}
	dir = dirname(dirname(path));
	return snprintf(buf, len, "%s/.venv", dir) < (int)len;
}
#endif

/*
 * Where the venv is: smb.conf's dbwrap_py:venv, else (a checkout's build)
 * $DBWRAP_PY_VENV, else the .venv next to this library. An installed build
 * (DBWRAP_PY_INSTALLED, make deb) takes smb.conf's word only: root never
 * runs code that the environment or a checkout's owner chose.
 */
static void choose_venv(char *venv, size_t len)
{
#ifndef DBWRAP_PY_INSTALLED
	const char *env = getenv("DBWRAP_PY_VENV");
#endif

	if (dbwrap_py_configured_venv()[0] != '\0') {
		snprintf(venv, len, "%s", dbwrap_py_configured_venv());
		return;
	}
	venv[0] = '\0';
#ifndef DBWRAP_PY_INSTALLED
	if (env != NULL && env[0] != '\0') {
		snprintf(venv, len, "%s", env);
	} else if (!venv_next_to_library(venv, len)) {
		venv[0] = '\0';
	}
#endif
}

/* The python3 to start as: the venv's, so pyvenv.cfg sets up sys.path. */
static void choose_program(const char *dbname, char *buf, size_t len)
{
	char venv[PATH_MAX];
	struct stat st;

	choose_venv(venv, sizeof(venv));
	if (venv[0] != '\0') {
		snprintf(buf, len, "%s/bin/python3", venv);
		if (stat(buf, &st) == 0) {
			return;
		}
		dbwrap_py_log(dbname, "start",
			      "no venv at %s (set dbwrap_py:venv or "
			      "DBWRAP_PY_VENV); using %s", venv, DBWRAP_PY_PYTHON);
	}
	snprintf(buf, len, "%s", DBWRAP_PY_PYTHON);
}

static bool init_interpreter(const char *dbname)
{
	char program[PATH_MAX];
	PyConfig config;
	PyStatus status;

	choose_program(dbname, program, sizeof(program));
	/* isolated: the host's PYTHON* variables must not redirect us */
	PyConfig_InitIsolatedConfig(&config);
	config.install_signal_handlers = 0;
	config.parse_argv = 0;
	status = PyConfig_SetBytesString(&config, &config.program_name, program);
	if (!PyStatus_Exception(status)) {
		status = Py_InitializeFromConfig(&config);
	}
	PyConfig_Clear(&config);
	if (PyStatus_Exception(status)) {
		dbwrap_py_log(dbname, "start", "Python failed to start: %s",
			      status.err_msg ? status.err_msg : "unknown error");
		return false;
	}
	return true;
}

static PyObject *import_attr(const char *module, const char *attr)
{
	PyObject *mod = PyImport_ImportModule(module);
	PyObject *result;

	if (mod == NULL) {
		return NULL;
	}
	result = PyObject_GetAttrString(mod, attr);
	Py_DECREF(mod);
	return result;
}

/* Extra module folders (colon-separated) for adapters, in front of sys.path. */
static bool add_module_paths_from(const char *env)
{
	PyObject *sys_path = PySys_GetObject("path"); /* borrowed */
	PyObject *entries = NULL, *item, *sep;
	Py_ssize_t i, n;
	bool ok = true;

	if (env == NULL || env[0] == '\0' || sys_path == NULL) {
		return true;
	}
	item = PyUnicode_DecodeFSDefault(env);
	sep = PyUnicode_FromString(":");
	if (item != NULL && sep != NULL) {
		entries = PyUnicode_Split(item, sep, -1);
	}
	Py_XDECREF(item);
	Py_XDECREF(sep);
	if (entries == NULL) {
		return false;
	}
	n = PyList_GET_SIZE(entries);
	for (i = n - 1; i >= 0 && ok; i--) {
		item = PyList_GET_ITEM(entries, i);
		ok = PyUnicode_GET_LENGTH(item) == 0 ||
		     PyList_Insert(sys_path, 0, item) == 0;
	}
	Py_DECREF(entries);
	return ok;
}

/* smb.conf's dbwrap_py:pythonpath; a checkout's build also $DBWRAP_PY_PATH */
static bool add_module_paths(void)
{
#ifndef DBWRAP_PY_INSTALLED
	if (!add_module_paths_from(getenv("DBWRAP_PY_PATH"))) {
		return false;
	}
#endif
	return add_module_paths_from(dbwrap_py_configured_module_path());
}

static bool import_framework(const char *dbname)
{
	if (!add_module_paths()) {
		py_runtime_status_from_exception(dbname, "start");
		return false;
	}
	runtime.open_database = import_attr("dbwrap_py.database", "open_database");
	runtime.error_base = import_attr("dbwrap_py.errors", "DbwrapError");
	if (runtime.open_database != NULL && runtime.error_base != NULL) {
		return true;
	}
	py_runtime_status_from_exception(dbname, "start");
	Py_CLEAR(runtime.open_database);
	Py_CLEAR(runtime.error_base);
	return false;
}

bool py_runtime_start(const char *dbname)
{
	bool we_started = false;
	PyGILState_STATE gil;
	bool ok;

	if (runtime.started) {
		return true;
	}
	if (!Py_IsInitialized()) {
		if (!init_interpreter(dbname)) {
			return false;
		}
		we_started = true;
	}
	gil = PyGILState_Ensure();
	ok = import_framework(dbname);
	PyGILState_Release(gil);
	if (we_started) {
		/* hold the GIL only inside calls; entry points take it back */
		(void)PyEval_SaveThread();
	}
	if (!runtime.atfork_registered) {
		/* registrations survive fork, so once per process image */
		pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
		runtime.atfork_registered = true;
	}
	runtime.started = ok;
	return ok;
}

PyObject *py_runtime_open_database(void)
{
	return runtime.open_database;
}

/* The exception's `routine` flag: a normal answer rather than a failure. */
static bool is_routine(PyObject *exc)
{
	PyObject *attr;
	bool routine;

	if (runtime.error_base == NULL ||
	    PyObject_IsInstance(exc, runtime.error_base) != 1) {
		PyErr_Clear();
		return false;
	}
	attr = PyObject_GetAttrString(exc, "routine");
	routine = (attr == Py_True);
	Py_XDECREF(attr);
	PyErr_Clear();
	return routine;
}

static uint32_t status_of(PyObject *exc)
{
	PyObject *attr;
	unsigned long value;

	if (PyErr_GivenExceptionMatches(exc, PyExc_MemoryError)) {
		return NT_STATUS_V(NT_STATUS_NO_MEMORY);
	}
	if (runtime.error_base == NULL ||
	    PyObject_IsInstance(exc, runtime.error_base) != 1) {
		PyErr_Clear();
		return NT_STATUS_V(NT_STATUS_INTERNAL_DB_ERROR);
	}
	attr = PyObject_GetAttrString(exc, "ntstatus");
	value = (attr != NULL && PyLong_Check(attr)) ? PyLong_AsUnsignedLong(attr)
						      : 0;
	Py_XDECREF(attr);
	PyErr_Clear();
	/* an OK or out-of-range status would hide the failure */
	if (value == 0 || value > UINT32_MAX) {
		return NT_STATUS_V(NT_STATUS_INTERNAL_DB_ERROR);
	}
	return (uint32_t)value;
}

NTSTATUS py_runtime_status_from_exception(const char *dbname, const char *op)
{
	PyObject *type = NULL, *exc = NULL, *tb = NULL;
	PyObject *text;
	const char *msg = NULL;
	uint32_t status;

	PyErr_Fetch(&type, &exc, &tb);
	PyErr_NormalizeException(&type, &exc, &tb);
	Py_XDECREF(type);
	Py_XDECREF(tb);
	if (exc == NULL) {
		dbwrap_py_log(dbname, op, "failed without a Python exception");
		return NT_STATUS_INTERNAL_DB_ERROR;
	}
	status = status_of(exc);
	text = PyObject_Str(exc);
	if (text != NULL) {
		msg = PyUnicode_AsUTF8(text);
	}
	dbwrap_py_log_level(is_routine(exc) ? DBWRAP_PY_LOG_ROUTINE
					    : DBWRAP_PY_LOG_ERROR,
			    dbname, op, "%s: %s (NTSTATUS 0x%08x)",
			    Py_TYPE(exc)->tp_name, msg ? msg : "<unprintable>",
			    (unsigned)status);
	Py_XDECREF(text);
	Py_DECREF(exc);
	PyErr_Clear();
	return NT_STATUS(status);
}
