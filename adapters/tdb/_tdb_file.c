/*
 * TdbFile: one open tdb in this process.
 *
 * tdb_open fails with EBUSY when a process opens one file twice, so the
 * adapter shares one TdbFile between the opens of a file (adapters/tdb/adapter.py
 * keeps that bookkeeping). The TdbRecords of each open keep a copy of the
 * context, for the hot path; the file sets them all whenever its context
 * changes (a fresh open after fork, a close), so none is ever stale.
 *
 * Calls that may wait for another process (opening, transactions, wipe,
 * check, the traverse) release the GIL meanwhile, so the host's other
 * Python threads do not stall behind a lock held elsewhere.
 */

#include "_tdb.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <talloc.h>
#include <unistd.h>

/* The file's context, and that of every TdbRecords using it. */
static void file_set_tdb(TdbFile *self, struct tdb_context *tdb)
{
	TdbRecords *user;

	self->tdb = tdb;
	for (user = self->users; user != NULL; user = user->next_user) {
		user->tdb = tdb;
	}
}

void tdb_file_attach(TdbFile *file, TdbRecords *user)
{
	user->next_user = file->users;
	file->users = user;
	user->tdb = file->tdb;
}

void tdb_file_detach(TdbFile *file, TdbRecords *user)
{
	TdbRecords **p;

	for (p = &file->users; *p != NULL; p = &(*p)->next_user) {
		if (*p == user) {
			*p = user->next_user;
			break;
		}
	}
	user->next_user = NULL;
	user->tdb = NULL;
}

/* tdb_open with this file's parameters; 0, or -1 with OSError set. */
static int file_open(TdbFile *self)
{
	struct tdb_context *tdb;
	int err;

	Py_BEGIN_ALLOW_THREADS
	errno = 0;
	tdb = tdb_open(self->name, self->hash_size, self->tdb_flags,
		       self->open_flags, self->mode);
	err = errno;
	Py_END_ALLOW_THREADS
	if (tdb == NULL) {
		/* the adapter maps errno (EACCES, EINVAL, EBUSY...) to its errors */
		errno = err;
		PyErr_SetFromErrnoWithFilename(PyExc_OSError, self->name);
		return -1;
	}
	if (self->seqnum_enabled) {
		tdb_enable_seqnum(tdb);
	}
	file_set_tdb(self, tdb);
	self->pid = getpid();
	return 0;
}

static int file_init(TdbFile *self, PyObject *args, PyObject *kwargs)
{
	static char *kwlist[] = { "name", "hash_size", "tdb_flags", "open_flags",
				  "mode", "errors", "fallback", NULL };
	PyObject *name, *errors, *fallback;
	int mode, ret = -1;

	if (self->tdb != NULL || self->name != NULL) {
		PyErr_SetString(PyExc_RuntimeError, "TdbFile is opened only once");
		return -1;
	}
	if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&iiiiO!O", kwlist,
					 PyUnicode_FSConverter, &name,
					 &self->hash_size, &self->tdb_flags,
					 &self->open_flags, &mode, &PyDict_Type,
					 &errors, &fallback)) {
		return -1;
	}
	self->mode = (mode_t)mode;
	self->name = talloc_strdup(NULL, PyBytes_AS_STRING(name));
	if (self->name == NULL) {
		PyErr_NoMemory();
	} else if (tdb_error_map_init(&self->map, errors, fallback) == 0) {
		ret = file_open(self);
	}
	Py_DECREF(name);
	return ret;
}

static void file_dealloc(TdbFile *self)
{
	/*
	 * No TdbRecords uses the file now: each holds a reference. A context
	 * inherited over fork and never reopened is the parent's: closing it
	 * here would cancel the parent's transaction on disk.
	 */
	if (self->tdb != NULL && self->pid == getpid()) {
		tdb_close(self->tdb);
	}
	TALLOC_FREE(self->name);
	tdb_error_map_clear(&self->map);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The open context, or NULL with the "closed" error raised. */
static struct tdb_context *open_tdb(TdbFile *self, const char *what)
{
	if (self->tdb == NULL) {
		tdb_raise(&self->map, NULL, what);
	}
	return self->tdb;
}

static PyObject *file_close(TdbFile *self, PyObject *unused)
{
	struct tdb_context *tdb = self->tdb;

	if (tdb != NULL) {
		file_set_tdb(self, NULL);
		tdb_close(tdb);
	}
	Py_RETURN_NONE;
}

/*
 * In a forked child: give this process its own fd, fcntl locks and
 * CLEAR_IF_FIRST "active" lock. True if it reopened, False if the file
 * was opened in this process already (or is closed).
 */
static PyObject *file_reopen_in_child(TdbFile *self, PyObject *unused)
{
	pid_t pid = getpid();
	int ret;

	if (self->tdb == NULL || self->pid == pid) {
		Py_RETURN_FALSE;
	}
	self->pid = pid;
	Py_BEGIN_ALLOW_THREADS
	ret = tdb_reopen(self->tdb);
	Py_END_ALLOW_THREADS
	if (ret == 0) {
		Py_RETURN_TRUE;
	}
	/*
	 * tdb refuses to reopen a context that records the parent's locks or
	 * transaction, and frees it; this process holds neither, so it opens
	 * the file afresh.
	 */
	file_set_tdb(self, NULL);
	if (file_open(self) != 0) {
		return NULL;
	}
	Py_RETURN_TRUE;
}

/* -- the traverse ---------------------------------------------------------- */

struct scan_records {
	TALLOC_CTX *mem; /* the copies, and the array of them */
	TDB_DATA *items; /* key, value, key, value, ... */
	size_t count, allocated;
	bool out_of_memory;
};

static bool scan_copy(TALLOC_CTX *mem, TDB_DATA in, TDB_DATA *out)
{
	out->dsize = in.dsize;
	out->dptr = talloc_memdup(mem, in.dsize > 0 ? in.dptr : (uint8_t *)"",
				  in.dsize);
	return out->dptr != NULL;
}

/* tdb_traverse_read's callback; runs without the GIL, so only talloc here. */
static int scan_collect(struct tdb_context *tdb, TDB_DATA key, TDB_DATA value,
			void *private_data)
{
	struct scan_records *s = private_data;
	TDB_DATA *items = s->items;

	if (s->count + 2 > s->allocated) {
		size_t allocated = (s->allocated > 0) ? s->allocated * 2 : 64;

		items = talloc_realloc(s->mem, s->items, TDB_DATA, allocated);
		if (items == NULL) {
			s->out_of_memory = true;
			return 1; /* stop the traverse */
		}
		s->items = items;
		s->allocated = allocated;
	}
	if (!scan_copy(s->mem, key, &items[s->count]) ||
	    !scan_copy(s->mem, value, &items[s->count + 1])) {
		s->out_of_memory = true;
		return 1;
	}
	s->count += 2;
	return 0;
}

/* The collected records as a list of (key, value) bytes pairs. */
static PyObject *scan_list(const struct scan_records *s)
{
	PyObject *list = PyList_New((Py_ssize_t)(s->count / 2));
	PyObject *pair;
	size_t i;

	for (i = 0; list != NULL && i < s->count; i += 2) {
		pair = Py_BuildValue("(y#y#)", (const char *)s->items[i].dptr,
				     (Py_ssize_t)s->items[i].dsize,
				     (const char *)s->items[i + 1].dptr,
				     (Py_ssize_t)s->items[i + 1].dsize);
		if (pair == NULL) {
			Py_CLEAR(list);
			break;
		}
		PyList_SET_ITEM(list, (Py_ssize_t)(i / 2), pair);
	}
	return list;
}

/*
 * Every record, collected by one tdb_traverse_read before the caller sees
 * the first. Not firstkey/nextkey: tdb keeps a fcntl read lock on the
 * record such a walk stopped at until it reaches the end, so a walk the
 * caller stops early would block other processes' transaction commits and
 * wipes (they lock the whole file) indefinitely.
 */
static PyObject *file_scan(TdbFile *self, PyObject *unused)
{
	struct tdb_context *tdb = open_tdb(self, "tdb_traverse_read");
	struct scan_records s = { NULL, NULL, 0, 0, false };
	PyObject *result;
	int ret;

	if (tdb == NULL) {
		return NULL;
	}
	s.mem = talloc_new(NULL);
	if (s.mem == NULL) {
		return PyErr_NoMemory();
	}
	Py_BEGIN_ALLOW_THREADS
	ret = tdb_traverse_read(tdb, scan_collect, &s);
	Py_END_ALLOW_THREADS
	if (s.out_of_memory) {
		result = PyErr_NoMemory();
	} else if (ret < 0) {
		result = tdb_raise(&self->map, tdb, "tdb_traverse_read");
	} else {
		result = scan_list(&s);
	}
	TALLOC_FREE(s.mem);
	return result;
}

/* -- database-wide operations ----------------------------------------------- */

/* None if ret is 0, else the error tdb recorded. */
static PyObject *file_result(TdbFile *self, struct tdb_context *tdb, int ret,
			     const char *what)
{
	if (ret != 0) {
		return tdb_raise(&self->map, tdb, what);
	}
	Py_RETURN_NONE;
}

/* Run fn on the open context without the GIL: it may wait for others. */
static PyObject *file_call(TdbFile *self, int (*fn)(struct tdb_context *),
			   const char *what)
{
	struct tdb_context *tdb = open_tdb(self, what);
	int ret;

	if (tdb == NULL) {
		return NULL;
	}
	Py_BEGIN_ALLOW_THREADS
	ret = fn(tdb);
	Py_END_ALLOW_THREADS
	return file_result(self, tdb, ret, what);
}

static PyObject *file_transaction_start(TdbFile *self, PyObject *args)
{
	int nonblock = 0;

	if (!PyArg_ParseTuple(args, "|p", &nonblock)) {
		return NULL;
	}
	if (nonblock) {
		return file_call(self, tdb_transaction_start_nonblock,
				 "tdb_transaction_start_nonblock");
	}
	return file_call(self, tdb_transaction_start, "tdb_transaction_start");
}

static PyObject *file_transaction_commit(TdbFile *self, PyObject *unused)
{
	return file_call(self, tdb_transaction_commit, "tdb_transaction_commit");
}

static PyObject *file_transaction_cancel(TdbFile *self, PyObject *unused)
{
	return file_call(self, tdb_transaction_cancel, "tdb_transaction_cancel");
}

static PyObject *file_wipe(TdbFile *self, PyObject *unused)
{
	return file_call(self, tdb_wipe_all, "tdb_wipe_all");
}

static int check_all(struct tdb_context *tdb)
{
	return tdb_check(tdb, NULL, NULL);
}

static PyObject *file_check(TdbFile *self, PyObject *unused)
{
	struct tdb_context *tdb = open_tdb(self, "tdb_check");

	if (tdb == NULL) {
		return NULL;
	}
	if (tdb_get_flags(tdb) & TDB_INTERNAL) {
		Py_RETURN_NONE; /* nothing on disk, and tdb_check does not handle it */
	}
	return file_call(self, check_all, "tdb_check");
}

static PyObject *file_seqnum(TdbFile *self, PyObject *unused)
{
	struct tdb_context *tdb = open_tdb(self, "tdb_get_seqnum");

	return (tdb != NULL) ? PyLong_FromLong(tdb_get_seqnum(tdb)) : NULL;
}

static PyObject *file_enable_seqnum(TdbFile *self, PyObject *unused)
{
	struct tdb_context *tdb = open_tdb(self, "tdb_enable_seqnum");

	if (tdb == NULL) {
		return NULL;
	}
	tdb_enable_seqnum(tdb);
	self->seqnum_enabled = true;
	Py_RETURN_NONE;
}

/* (st_dev, st_ino) of the open file, as native dbwrap_tdb's id; None if internal. */
static PyObject *file_identity(TdbFile *self, PyObject *unused)
{
	struct tdb_context *tdb = open_tdb(self, "tdb_fd");
	struct stat st;
	int fd;

	if (tdb == NULL) {
		return NULL;
	}
	fd = tdb_fd(tdb);
	if (fd < 0) {
		Py_RETURN_NONE; /* TDB_INTERNAL */
	}
	if (fstat(fd, &st) != 0) {
		return PyErr_SetFromErrnoWithFilename(PyExc_OSError, self->name);
	}
	return Py_BuildValue("(KK)", (unsigned long long)st.st_dev,
			     (unsigned long long)st.st_ino);
}

static PyObject *file_get_flags(TdbFile *self, void *closure)
{
	struct tdb_context *tdb = open_tdb(self, "tdb_get_flags");

	return (tdb != NULL) ? PyLong_FromLong(tdb_get_flags(tdb)) : NULL;
}

static PyObject *file_get_writable(TdbFile *self, void *closure)
{
	return PyBool_FromLong((self->open_flags & O_ACCMODE) != O_RDONLY);
}

static PyObject *file_get_closed(TdbFile *self, void *closure)
{
	return PyBool_FromLong(self->tdb == NULL);
}

static PyObject *file_get_name(TdbFile *self, void *closure)
{
	return PyUnicode_DecodeFSDefault(self->name != NULL ? self->name : "");
}

static PyMethodDef file_methods[] = {
	{ "close", (PyCFunction)file_close, METH_NOARGS, "tdb_close; once is enough." },
	{ "reopen_in_child", (PyCFunction)file_reopen_in_child, METH_NOARGS,
	  "After fork: reopen (afresh if tdb refuses). True if it reopened." },
	{ "scan", (PyCFunction)file_scan, METH_NOARGS,
	  "Every (key, value), from one tdb_traverse_read." },
	{ "seqnum", (PyCFunction)file_seqnum, METH_NOARGS, "tdb_get_seqnum." },
	{ "enable_seqnum", (PyCFunction)file_enable_seqnum, METH_NOARGS,
	  "tdb_enable_seqnum, kept after a fresh open." },
	{ "transaction_start", (PyCFunction)file_transaction_start, METH_VARARGS,
	  "transaction_start(nonblock=False)." },
	{ "transaction_commit", (PyCFunction)file_transaction_commit, METH_NOARGS, NULL },
	{ "transaction_cancel", (PyCFunction)file_transaction_cancel, METH_NOARGS, NULL },
	{ "wipe", (PyCFunction)file_wipe, METH_NOARGS, "tdb_wipe_all." },
	{ "check", (PyCFunction)file_check, METH_NOARGS,
	  "tdb_check; nothing to check for TDB_INTERNAL." },
	{ "identity", (PyCFunction)file_identity, METH_NOARGS,
	  "(st_dev, st_ino) of the open file, None for TDB_INTERNAL." },
	{ NULL, NULL, 0, NULL },
};

static PyGetSetDef file_getset[] = {
	{ "flags", (getter)file_get_flags, NULL, "tdb_get_flags", NULL },
	{ "writable", (getter)file_get_writable, NULL, "opened for writing", NULL },
	{ "closed", (getter)file_get_closed, NULL, "closed, or lost in a failed reopen", NULL },
	{ "name", (getter)file_get_name, NULL, "the name it was opened with", NULL },
	{ NULL, NULL, NULL, NULL, NULL },
};

PyTypeObject TdbFileType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "dbwrap_py.adapters.tdb._tdb.TdbFile",
	.tp_basicsize = sizeof(TdbFile),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "TdbFile(name, hash_size, tdb_flags, open_flags, mode, errors, fallback):\n"
		  "one open tdb. A failed open raises OSError with tdb_open's errno;\n"
		  "other failures raise errors[tdb error code], or fallback\n"
		  "(errors[-1] once closed).",
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)file_init,
	.tp_dealloc = (destructor)file_dealloc,
	.tp_methods = file_methods,
	.tp_getset = file_getset,
};
