/*
 * TdbRecords: the C base class of the tdb adapter, with the record
 * operations as its methods (get, put, lock, unlock, try_lock, lock_get,
 * put_unlock, exists, remove).
 *
 * They are methods of the class, not objects installed on each adapter,
 * so the adapter class one reads is the one that runs; and the bridge, which
 * binds an adapter's record methods once (dbwrap_py._records), calls libtdb
 * with no Python frame in between: an SMB2 open and close make about twenty
 * such calls.
 *
 * Record locks are tdb chainlocks, which exclude other processes, nest
 * within this one and vanish with their holder. A lock is first tried
 * without blocking and with the GIL held; only if another process holds it
 * is the GIL released for the wait.
 */

#include "_tdb.h"

/* Raise "closed": the file's own error if it has one, else the last one's. */
static PyObject *records_closed(TdbRecords *self, const char *what)
{
	if (self->file != NULL) {
		return tdb_raise(&self->file->map, NULL, what);
	}
	if (self->closed_class == NULL) {
		PyErr_Format(PyExc_RuntimeError, "%s: the adapter has no tdb file", what);
		return NULL;
	}
	PyErr_Format(self->closed_class, "%s: the database is closed", what);
	return NULL;
}

/* The open context and the key, or NULL with an exception set. */
static struct tdb_context *records_key(TdbRecords *self, PyObject *arg,
				       TDB_DATA *key, const char *what)
{
	struct tdb_context *tdb = tdb_records_tdb(self);

	if (tdb == NULL) {
		records_closed(self, what);
		return NULL;
	}
	if (!PyBytes_Check(arg)) {
		PyErr_Format(PyExc_TypeError, "%s: the key must be bytes, not %s",
			     what, Py_TYPE(arg)->tp_name);
		return NULL;
	}
	*key = (TDB_DATA) { (uint8_t *)PyBytes_AS_STRING(arg),
			    (size_t)PyBytes_GET_SIZE(arg) };
	return tdb;
}

static PyObject *records_raise(TdbRecords *self, struct tdb_context *tdb,
			       const char *what)
{
	return tdb_raise(&self->file->map, tdb, what);
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

/* tdb_parse_record's parser: the value as bytes, copied once from tdb. */
static int value_as_bytes(TDB_DATA key, TDB_DATA data, void *private_data)
{
	PyObject **value = private_data;

	*value = PyBytes_FromStringAndSize((const char *)data.dptr,
					   (Py_ssize_t)data.dsize);
	return 0;
}

/* The value as bytes, or None for a missing key. */
static PyObject *fetch(TdbRecords *self, struct tdb_context *tdb, TDB_DATA key)
{
	PyObject *value = NULL;

	if (tdb_parse_record(tdb, key, value_as_bytes, &value) == 0) {
		return value; /* NULL with MemoryError set if the copy failed */
	}
	if (tdb_error(tdb) == TDB_ERR_NOEXIST) {
		Py_RETURN_NONE;
	}
	return records_raise(self, tdb, "tdb_parse_record");
}

static PyObject *records_get(TdbRecords *self, PyObject *arg)
{
	TDB_DATA key;
	struct tdb_context *tdb = records_key(self, arg, &key, "tdb_parse_record");

	return (tdb != NULL) ? fetch(self, tdb, key) : NULL;
}

static PyObject *records_lock(TdbRecords *self, PyObject *arg)
{
	TDB_DATA key;
	struct tdb_context *tdb = records_key(self, arg, &key, "tdb_chainlock");

	if (tdb == NULL) {
		return NULL;
	}
	if (chainlock(tdb, key) != 0) {
		return records_raise(self, tdb, "tdb_chainlock");
	}
	Py_RETURN_NONE;
}

/* Lock the key's chain if nobody holds it: True, else False at once. */
static PyObject *records_try_lock(TdbRecords *self, PyObject *arg)
{
	TDB_DATA key;
	struct tdb_context *tdb = records_key(self, arg, &key,
					      "tdb_chainlock_nonblock");

	if (tdb == NULL) {
		return NULL;
	}
	if (tdb_chainlock_nonblock(tdb, key) == 0) {
		Py_RETURN_TRUE;
	}
	if (tdb_error(tdb) == TDB_ERR_LOCK) {
		Py_RETURN_FALSE;
	}
	return records_raise(self, tdb, "tdb_chainlock_nonblock");
}

static PyObject *records_unlock(TdbRecords *self, PyObject *arg)
{
	TDB_DATA key;
	struct tdb_context *tdb = records_key(self, arg, &key, "tdb_chainunlock");

	if (tdb == NULL) {
		return NULL;
	}
	if (tdb_chainunlock(tdb, key) != 0) {
		return records_raise(self, tdb, "tdb_chainunlock");
	}
	Py_RETURN_NONE;
}

/* Lock, then read; the lock is not kept when the read fails. */
static PyObject *records_lock_get(TdbRecords *self, PyObject *arg)
{
	TDB_DATA key;
	struct tdb_context *tdb = records_key(self, arg, &key, "tdb_chainlock");
	PyObject *value;

	if (tdb == NULL) {
		return NULL;
	}
	if (chainlock(tdb, key) != 0) {
		return records_raise(self, tdb, "tdb_chainlock");
	}
	value = fetch(self, tdb, key);
	if (value == NULL) {
		tdb_chainunlock(tdb, key);
	}
	return value;
}

/* (key, value) of a put, and the open context; NULL with an exception set. */
static struct tdb_context *records_key_value(TdbRecords *self,
					     PyObject *const *args,
					     Py_ssize_t nargs, TDB_DATA *key,
					     TDB_DATA *value)
{
	struct tdb_context *tdb;

	if (nargs != 2) {
		PyErr_SetString(PyExc_TypeError, "expected (key: bytes, value: bytes)");
		return NULL;
	}
	tdb = records_key(self, args[0], key, "tdb_store");
	if (tdb == NULL) {
		return NULL;
	}
	if (!PyBytes_Check(args[1])) {
		PyErr_Format(PyExc_TypeError, "tdb_store: the value must be bytes, not %s",
			     Py_TYPE(args[1])->tp_name);
		return NULL;
	}
	*value = (TDB_DATA) { (uint8_t *)PyBytes_AS_STRING(args[1]),
			      (size_t)PyBytes_GET_SIZE(args[1]) };
	return tdb;
}

static PyObject *records_put(TdbRecords *self, PyObject *const *args,
			     Py_ssize_t nargs)
{
	TDB_DATA key, value;
	struct tdb_context *tdb = records_key_value(self, args, nargs, &key, &value);

	if (tdb == NULL) {
		return NULL;
	}
	if (tdb_store(tdb, key, value, TDB_REPLACE) != 0) {
		return records_raise(self, tdb, "tdb_store");
	}
	Py_RETURN_NONE;
}

/* Store, then unlock; the lock is released even when the store fails. */
static PyObject *records_put_unlock(TdbRecords *self, PyObject *const *args,
				    Py_ssize_t nargs)
{
	TDB_DATA key, value;
	struct tdb_context *tdb = records_key_value(self, args, nargs, &key, &value);
	PyObject *result = Py_None;

	if (tdb == NULL) {
		return NULL;
	}
	if (tdb_store(tdb, key, value, TDB_REPLACE) != 0) {
		result = records_raise(self, tdb, "tdb_store");
	}
	if (tdb_chainunlock(tdb, key) != 0 && result != NULL) {
		result = records_raise(self, tdb, "tdb_chainunlock");
	}
	Py_XINCREF(result);
	return result;
}

static PyObject *records_exists(TdbRecords *self, PyObject *arg)
{
	TDB_DATA key;
	struct tdb_context *tdb = records_key(self, arg, &key, "tdb_exists");

	if (tdb == NULL) {
		return NULL;
	}
	return PyBool_FromLong(tdb_exists(tdb, key) == 1);
}

/* Delete a locked record: whether it existed. */
static PyObject *records_remove(TdbRecords *self, PyObject *arg)
{
	TDB_DATA key;
	struct tdb_context *tdb = records_key(self, arg, &key, "tdb_delete");

	if (tdb == NULL) {
		return NULL;
	}
	if (tdb_delete(tdb, key) == 0) {
		Py_RETURN_TRUE;
	}
	if (tdb_error(tdb) == TDB_ERR_NOEXIST) {
		Py_RETURN_FALSE;
	}
	return records_raise(self, tdb, "tdb_delete");
}

/* -- the file they work on --------------------------------------------------- */

static PyObject *records_get_file(TdbRecords *self, void *closure)
{
	PyObject *file = (self->file != NULL) ? (PyObject *)self->file : Py_None;

	Py_INCREF(file);
	return file;
}

/* Stop using the file: its context is no longer ours to follow. */
static void records_clear_file(TdbRecords *self)
{
	TdbFile *file = self->file;

	if (file != NULL) {
		tdb_file_detach(file, self);
		self->file = NULL;
		Py_DECREF(file);
	}
}

/*
 * tdb_file = a TdbFile, or None once the adapter is closed: from then on
 * every call raises (and every native call returns) the last file's
 * "closed" error, while other opens of that file go on using it.
 */
static int records_set_file(TdbRecords *self, PyObject *value, void *closure)
{
	TdbFile *file;
	PyObject *closed;

	if (value == NULL || value == Py_None) {
		records_clear_file(self);
		return 0;
	}
	if (!PyObject_TypeCheck(value, &TdbFileType)) {
		PyErr_Format(PyExc_TypeError, "tdb_file must be a TdbFile or None, not %s",
			     Py_TYPE(value)->tp_name);
		return -1;
	}
	file = (TdbFile *)value;
	closed = tdb_error_map_class(&file->map, TDB_ERROR_CLOSED);
	if (closed == NULL) {
		return -1;
	}
	Py_INCREF(closed);
	Py_XSETREF(self->closed_class, closed);
	self->closed_status = file->map.closed_status;
	records_clear_file(self);
	Py_INCREF(value);
	self->file = file;
	tdb_file_attach(file, self);
	return 0;
}

static int records_traverse(TdbRecords *self, visitproc visit, void *arg)
{
	Py_VISIT(self->file);
	Py_VISIT(self->closed_class);
	return 0;
}

static int records_clear(TdbRecords *self)
{
	records_clear_file(self);
	Py_CLEAR(self->closed_class);
	return 0;
}

static void records_dealloc(TdbRecords *self)
{
	PyObject_GC_UnTrack(self);
	records_clear(self);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef records_methods[] = {
	{ "get", (PyCFunction)records_get, METH_O, "The value, or None." },
	{ "put", (PyCFunction)(void (*)(void))records_put, METH_FASTCALL,
	  "Store (TDB_REPLACE); the caller holds the record lock." },
	{ "lock", (PyCFunction)records_lock, METH_O, "Lock the key's chain." },
	{ "unlock", (PyCFunction)records_unlock, METH_O, "Unlock the key's chain." },
	{ "try_lock", (PyCFunction)records_try_lock, METH_O,
	  "Lock the key's chain if free: True, else False without waiting." },
	{ "lock_get", (PyCFunction)records_lock_get, METH_O,
	  "Lock, then read; not locked if the read fails." },
	{ "put_unlock", (PyCFunction)(void (*)(void))records_put_unlock,
	  METH_FASTCALL, "Store, then unlock, even if the store fails." },
	{ "exists", (PyCFunction)records_exists, METH_O, "Whether the key has a record." },
	{ "remove", (PyCFunction)records_remove, METH_O,
	  "Delete a locked record; whether it existed." },
	{ "native_capsule", (PyCFunction)tdb_records_native_capsule, METH_NOARGS,
	  "These operations for the bridge, as a capsule (native_records.h)." },
	{ NULL, NULL, 0, NULL },
};

static PyGetSetDef records_getset[] = {
	{ "tdb_file", (getter)records_get_file, (setter)records_set_file,
	  "the TdbFile the record operations use; None once closed", NULL },
	{ NULL, NULL, NULL, NULL, NULL },
};

PyTypeObject TdbRecordsType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "dbwrap_py.adapters.tdb._tdb.TdbRecords",
	.tp_basicsize = sizeof(TdbRecords),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
	.tp_doc = "The tdb adapter's record operations, on the TdbFile in tdb_file.",
	.tp_new = PyType_GenericNew,
	.tp_traverse = (traverseproc)records_traverse,
	.tp_clear = (inquiry)records_clear,
	.tp_dealloc = (destructor)records_dealloc,
	.tp_methods = records_methods,
	.tp_getset = records_getset,
};
