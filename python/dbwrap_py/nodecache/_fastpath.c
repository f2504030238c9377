/*
 * dbwrap_py.nodecache._fastpath: the node cache's records for Python and
 * the in-process bridge.
 *
 * The rules are the core's (c_core/nodecache_core.c, no Python): this
 * module converts arguments, calls the core, and makes the Python calls the
 * core leaves to its caller.
 *
 * State(cache_dir) reads the node agent's state file
 * (c_core/nodecache_layout.h): the live node lease, and the wanted table.
 *
 * LocalRecords(records, buckets, state, db_id, op_timeout) is one
 * database's local tdb files (two tdb adapters) with the rules. Python
 * (cache.py) calls its methods; the bridge calls the same functions as
 * native records (c_core/native_records.h), without the GIL. Only a
 * record the node must move in, or hand over, goes to Python: the `miss`
 * and `handover` callbacks, called with the GIL taken.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "nodecache_core.h"
#include "tdb_api.h"

static const struct dbwrap_py_tdb_api *tdb_api;
static PyObject *fenced_out;   /* dbwrap_py.errors.FencedOut */
static PyObject *not_found;    /* dbwrap_py.errors.NotFound */

/* -- State: the agent's state file -------------------------------------------- */

typedef struct {
	PyObject_HEAD
	struct nc_state core;
} State;

static int state_init(State *self, PyObject *args, PyObject *kwargs)
{
	PyObject *encoded; /* the directory, str or path-like, as the file system's bytes */
	int ret;

	if (!PyArg_ParseTuple(args, "O&", PyUnicode_FSConverter, &encoded)) {
		return -1;
	}
	ret = nc_state_open(&self->core, PyBytes_AS_STRING(encoded));
	Py_DECREF(encoded);
	if (ret != 0) {
		PyErr_NoMemory();
		return -1;
	}
	return 0;
}

static void state_dealloc(State *self)
{
	nc_state_close(&self->core);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *state_py_current(State *self, PyObject *unused)
{
	char name[STATE_NAME_SIZE + 1];
	int64_t lease = nc_state_current(&self->core, name);

	return Py_BuildValue("(Ly)", (long long)lease, name);
}

static PyObject *state_py_lease(State *self, PyObject *unused)
{
	uint32_t status;

	return PyLong_FromLongLong(nc_state_live(&self->core, &status));
}

static PyObject *state_py_configured(State *self, PyObject *unused)
{
	return PyBool_FromLong(nc_state_configured(&self->core));
}

static PyObject *state_py_node_name(State *self, PyObject *unused)
{
	char name[STATE_NAME_SIZE + 1];

	nc_state_node_name(&self->core, name);
	return PyBytes_FromString(name);
}

static PyObject *state_py_agent_pid(State *self, PyObject *unused)
{
	return PyLong_FromUnsignedLong(nc_state_agent_pid(&self->core));
}

static PyObject *state_py_wanted(State *self, PyObject *args)
{
	const char *db, *key;
	Py_ssize_t db_len, key_len;

	if (!PyArg_ParseTuple(args, "y#y#", &db, &db_len, &key, &key_len)) {
		return NULL;
	}
	return PyBool_FromLong(nc_state_wanted(&self->core,
					       (TDB_DATA) { (uint8_t *)db, (size_t)db_len },
					       (TDB_DATA) { (uint8_t *)key, (size_t)key_len }));
}

static PyObject *state_py_close(State *self, PyObject *unused)
{
	nc_state_unmap(&self->core);
	Py_RETURN_NONE;
}
static PyMethodDef state_methods[] = {
	{ "current", (PyCFunction)state_py_current, METH_NOARGS,
	  "(lease, node name) to take new records under, else (0, b'')." },
	{ "lease", (PyCFunction)state_py_lease, METH_NOARGS,
	  "The node lease while it is surely alive (draining or not), else 0." },
	{ "configured", (PyCFunction)state_py_configured, METH_NOARGS,
	  "Whether an agent serves the directory (not before the first, nor after one stopped)." },
	{ "node_name", (PyCFunction)state_py_node_name, METH_NOARGS, "The node's name." },
	{ "agent_pid", (PyCFunction)state_py_agent_pid, METH_NOARGS, "The agent's pid, 0 if none." },
	{ "wanted", (PyCFunction)state_py_wanted, METH_VARARGS,
	  "wanted(db_id, key): does another node wait for this record?" },
	{ "close", (PyCFunction)state_py_close, METH_NOARGS, "Unmap the state file." },
	{ NULL, NULL, 0, NULL },
};

static PyTypeObject StateType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "dbwrap_py.nodecache._fastpath.State",
	.tp_basicsize = sizeof(State),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "State(cache_dir): the node agent's state, as the node's processes read it.",
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)state_init,
	.tp_dealloc = (destructor)state_dealloc,
	.tp_methods = state_methods,
};

/* -- LocalRecords: one database's records on the node --------------------------- */

typedef struct {
	PyObject_HEAD
	PyObject *records;  /* the tdb adapter of <db_id>.tdb */
	PyObject *buckets;  /* the tdb adapter of <db_id>.buckets.tdb */
	State *state;
	struct nc_records core; /* core.state: &state->core */
	PyObject *miss;     /* miss(key, locked) -> value: move a record in (Python) */
	PyObject *handover; /* handover(key): give a wanted record back (Python, lock held) */
} LocalRecords;

/* The pending Python exception as an NTSTATUS and a reason (GIL held). */
static uint32_t status_from_exception(struct dbwrap_py_native_why *why)
{
	PyObject *type, *value, *traceback, *code, *text;
	uint32_t status = NC_NT_INTERNAL_DB_ERROR;

	PyErr_Fetch(&type, &value, &traceback);
	PyErr_NormalizeException(&type, &value, &traceback);
	code = value != NULL ? PyObject_GetAttrString(value, "ntstatus") : NULL;
	if (code != NULL && PyLong_Check(code)) {
		status = (uint32_t)PyLong_AsUnsignedLongMask(code);
	} else if (type != NULL && PyErr_GivenExceptionMatches(type, PyExc_MemoryError)) {
		status = NC_NT_NO_MEMORY;
	}
	PyErr_Clear();
	text = value != NULL ? PyObject_Str(value) : NULL;
	snprintf(why->text, sizeof(why->text), "%s: %s",
		 type != NULL ? ((PyTypeObject *)type)->tp_name : "error",
		 text != NULL ? PyUnicode_AsUTF8(text) : "?");
	PyErr_Clear();
	Py_XDECREF(text);
	Py_XDECREF(code);
	Py_XDECREF(type);
	Py_XDECREF(value);
	Py_XDECREF(traceback);
	return status;
}

/*
 * A record the node must move in: Python's miss(key, locked). Locked: it
 * writes the local record under our chainlock, which is then read again
 * (nc_lock_moved_in). Not locked: its value is handed to fn, copied out of
 * Python first.
 */
static uint32_t python_miss(LocalRecords *self, TDB_DATA key, bool locked,
			    dbwrap_py_native_value_fn fn, void *private_data,
			    struct dbwrap_py_native_why *why)
{
	PyGILState_STATE gil;
	PyObject *result;
	uint8_t *copy = NULL;
	Py_ssize_t len = 0;
	bool found = false;
	uint32_t status = 0;

	if (self->miss == NULL) {
		return nc_why(why, NC_NT_INTERNAL_DB_ERROR, "the node cache has no miss handler");
	}
	gil = PyGILState_Ensure();
	result = PyObject_CallFunction(self->miss, "y#O", (const char *)key.dptr,
				       (Py_ssize_t)key.dsize, locked ? Py_True : Py_False);
	if (result == NULL) {
		status = status_from_exception(why);
	} else if (!locked && PyBytes_Check(result)) {
		len = PyBytes_GET_SIZE(result);
		copy = malloc(len > 0 ? (size_t)len : 1);
		if (copy == NULL) {
			status = nc_why(why, NC_NT_NO_MEMORY, "no memory for a %zd-byte value", len);
		} else {
			memcpy(copy, PyBytes_AS_STRING(result), len);
			found = true;
		}
	}
	Py_XDECREF(result);
	PyGILState_Release(gil);
	if (status == 0 && !locked) {
		fn((TDB_DATA) { copy, (size_t)len }, found, private_data);
	}
	free(copy);
	return status;
}

static void python_handover(LocalRecords *self, TDB_DATA key)
{
	PyGILState_STATE gil;
	PyObject *result;

	if (self->handover == NULL) {
		return;
	}
	gil = PyGILState_Ensure();
	result = PyObject_CallFunction(self->handover, "y#", (const char *)key.dptr,
				       (Py_ssize_t)key.dsize);
	if (result == NULL) {
		PyErr_Clear(); /* the agent hands it over instead, a little later */
	}
	Py_XDECREF(result);
	PyGILState_Release(gil);
}

/* -- native records: the bridge's hot path, no GIL -------------------------------- */

static uint32_t fp_fetch(void *handle, TDB_DATA key, dbwrap_py_native_value_fn fn,
			 void *private_data, struct dbwrap_py_native_why *why)
{
	LocalRecords *self = handle;
	bool ask_owner;
	uint32_t status = nc_fetch(&self->core, key, fn, private_data, &ask_owner);

	if (status != 0 || !ask_owner) {
		return status;
	}
	return python_miss(self, key, false, fn, private_data, why);
}

/*
 * A record moved in may be void by the time the lock looks at it: the node
 * agent renewed late and the node's lease is a new one, or another node's
 * first open wiped the database meanwhile. The lock then moves it in
 * again, a few times (each within op_timeout), rather than failing the
 * caller's open or lock (seen: smbd on three nodes starting together, its
 * locking.tdb's migration marker lock failed and smbd exited).
 */
#define LOCK_MOVE_IN_TRIES 3

static uint32_t fp_lock_fetch(void *handle, TDB_DATA key, dbwrap_py_native_value_fn fn,
			      void *private_data, struct dbwrap_py_native_why *why)
{
	LocalRecords *self = handle;
	bool ask_owner, changed_hands = true;
	uint32_t status = 0;
	int tries;

	for (tries = 0; changed_hands && tries < LOCK_MOVE_IN_TRIES; tries++) {
		status = nc_lock_fetch(&self->core, key, fn, private_data, &ask_owner, why);
		if (status != 0 || !ask_owner) {
			return status;
		}
		status = python_miss(self, key, true, NULL, NULL, why);
		status = nc_lock_moved_in(&self->core, key, status, fn, private_data, &changed_hands, why);
	}
	return status;
}

static uint32_t fp_unlock(void *handle, TDB_DATA key, struct dbwrap_py_native_why *why)
{
	LocalRecords *self = handle;
	bool hand_over;
	uint32_t status = nc_unlock_check(&self->core, key, &hand_over, why);

	if (status != 0) {
		return status;
	}
	if (hand_over) {
		python_handover(self, key);
	}
	return nc_unlock(&self->core, key, why);
}

static uint32_t fp_storev(void *handle, TDB_DATA key, const TDB_DATA *dbufs, int num_dbufs,
			  struct dbwrap_py_native_why *why)
{
	return nc_storev(&((LocalRecords *)handle)->core, key, dbufs, num_dbufs, why);
}

static uint32_t fp_delete(void *handle, TDB_DATA key, struct dbwrap_py_native_why *why)
{
	return nc_delete(&((LocalRecords *)handle)->core, key, why);
}

static void exists_fn(TDB_DATA value, bool found, void *private_data)
{
	*(bool *)private_data = found;
}

static uint32_t fp_exists(void *handle, TDB_DATA key, bool *exists,
			  struct dbwrap_py_native_why *why)
{
	*exists = false;
	return fp_fetch(handle, key, exists_fn, exists, why);
}

static uint32_t fp_seqnum(void *handle, int *seqnum, struct dbwrap_py_native_why *why)
{
	return nc_seqnum(&((LocalRecords *)handle)->core, seqnum, why);
}

static const struct dbwrap_py_native_records native_ops = {
	.fetch = fp_fetch,
	.lock_fetch = fp_lock_fetch,
	.unlock = fp_unlock,
	.storev = fp_storev,
	.delete_rec = fp_delete,
	.exists = fp_exists,
	.seqnum = fp_seqnum,
};

/* -- the Python methods: the same rules for cache.py and the agent ---------------- */

static bool key_arg(PyObject *arg, TDB_DATA *key)
{
	char *buf;
	Py_ssize_t len;

	if (PyBytes_AsStringAndSize(arg, &buf, &len) != 0) {
		return false;
	}
	*key = (TDB_DATA) { (uint8_t *)buf, (size_t)len };
	return true;
}

struct value_copy {
	PyObject *value; /* bytes, or NULL for a missing or deleted record */
};

static void copy_value_fn(TDB_DATA value, bool found, void *private_data)
{
	struct value_copy *c = private_data;

	c->value = found ? PyBytes_FromStringAndSize((const char *)value.dptr, value.dsize) : NULL;
}

static PyObject *owned_tuple(const struct local_header *h, PyObject *value)
{
	return Py_BuildValue("(LLiO)", (long long)h->lease, (long long)h->token, (int)h->flags,
			     value != NULL ? value : Py_None);
}

/* owned(key, lease): (lease, token, flags, value) as the node owns it, or None */
static PyObject *lr_owned(LocalRecords *self, PyObject *args)
{
	PyObject *keyobj, *result;
	long long lease;
	TDB_DATA key;
	struct local_header h;
	struct value_copy c = { NULL };

	if (!PyArg_ParseTuple(args, "OL", &keyobj, &lease) || !key_arg(keyobj, &key)) {
		return NULL;
	}
	if (nc_classify(&self->core, key, lease, copy_value_fn, &c, &h) == NC_OWNED_NONE) {
		Py_RETURN_NONE;
	}
	result = owned_tuple(&h, c.value);
	Py_XDECREF(c.value);
	return result;
}

/* stand(key, lease): under the lock, what it stands on (placeholder for a new key), or None */
static PyObject *lr_stand(LocalRecords *self, PyObject *args)
{
	PyObject *keyobj, *result;
	long long lease;
	TDB_DATA key;
	struct local_header h;
	struct value_copy c = { NULL };
	int kind;

	if (!PyArg_ParseTuple(args, "OL", &keyobj, &lease) || !key_arg(keyobj, &key)) {
		return NULL;
	}
	kind = nc_stand(&self->core, key, lease, copy_value_fn, &c, &h);
	if (kind < 0) {
		Py_XDECREF(c.value);
		return PyErr_Format(PyExc_OSError, "tdb_store of a placeholder failed");
	}
	if (kind == NC_OWNED_NONE) {
		Py_RETURN_NONE;
	}
	result = owned_tuple(&h, c.value);
	Py_XDECREF(c.value);
	return result;
}

/* (key, lease, token, flags, value or None) of a local record */
static PyObject *scanned_record(const struct nc_scanned *item)
{
	struct local_header h;
	TDB_DATA data;
	PyObject *value;

	nc_scanned_record(item, &h, &data);
	value = data.dptr == NULL
		? Py_NewRef(Py_None)
		: PyBytes_FromStringAndSize((const char *)data.dptr, (Py_ssize_t)data.dsize);
	if (value == NULL) {
		return NULL;
	}
	return Py_BuildValue("(y#LLiN)", (const char *)item->key, (Py_ssize_t)item->key_size,
			     (long long)h.lease, (long long)h.token, (int)h.flags, value);
}

/* (number, token) of a bucket */
static PyObject *scanned_bucket(const struct nc_scanned *item)
{
	int64_t token;
	int number = nc_scanned_bucket(item, &token);

	if (number < 0) {
		return PyErr_Format(PyExc_ValueError, "a bucket key of %zu bytes", item->key_size);
	}
	return Py_BuildValue("(iL)", number, (long long)token);
}

/*
 * The scans (the agent's vacuum and drain) run with the GIL released: a
 * traverse that waits (the drain) waits on any chain a process holds
 * locked, and the agent's other threads (its lease's keepalive above all)
 * must run meanwhile. Python objects are made afterwards, from the core's
 * copies. *held: the chains a scan that does not wait passed.
 */
static PyObject *scan(LocalRecords *self, PyObject *arg, bool local_records, bool wait,
		      size_t *held)
{
	long long lease = PyLong_AsLongLong(arg);
	struct dbwrap_py_native_why why;
	struct nc_scan s = { NULL, 0, 0 };
	PyObject *list = NULL, *item;
	uint32_t status;
	size_t i;

	if (PyErr_Occurred()) {
		return NULL;
	}
	Py_BEGIN_ALLOW_THREADS
	status = nc_scan(&self->core, lease, local_records, wait, &s, &why);
	Py_END_ALLOW_THREADS
	*held = s.held;
	if (status == NC_NT_NO_MEMORY) {
		PyErr_NoMemory();
		goto done;
	}
	if (status != 0) {
		PyErr_SetString(PyExc_OSError, why.text);
		goto done;
	}
	list = PyList_New((Py_ssize_t)s.count);
	for (i = 0; list != NULL && i < s.count; i++) {
		item = local_records ? scanned_record(&s.found[i]) : scanned_bucket(&s.found[i]);
		if (item == NULL) {
			Py_CLEAR(list);
			break;
		}
		PyList_SET_ITEM(list, (Py_ssize_t)i, item);
	}
done:
	nc_scan_free(&s);
	return list;
}

/* scan_owned(lease): [(key, lease, token, flags, value)] of the local records the node owns */
static PyObject *lr_scan_owned(LocalRecords *self, PyObject *arg)
{
	size_t held;

	return scan(self, arg, true, true, &held);
}

/* scan_owned_free(lease): (scan_owned's list for the chains no process holds, chains passed) */
static PyObject *lr_scan_owned_free(LocalRecords *self, PyObject *arg)
{
	size_t held = 0;
	PyObject *list = scan(self, arg, true, false, &held);

	return list == NULL ? NULL : Py_BuildValue("(Nn)", list, (Py_ssize_t)held);
}

/* scan_buckets(lease): [(number, token)] of the buckets the node holds */
static PyObject *lr_scan_buckets(LocalRecords *self, PyObject *arg)
{
	size_t held;

	return scan(self, arg, false, true, &held);
}

/* scan_buckets_free(lease): scan_buckets's list for the chains no process holds */
static PyObject *lr_scan_buckets_free(LocalRecords *self, PyObject *arg)
{
	size_t held = 0;

	return scan(self, arg, false, false, &held);
}

/* keep(key, lease, token, flags, value): a record moved in, as the local copy */
static PyObject *lr_keep(LocalRecords *self, PyObject *args)
{
	PyObject *keyobj, *value;
	long long lease, token;
	int flags;
	TDB_DATA key, data = tdb_null;

	if (!PyArg_ParseTuple(args, "OLLiO", &keyobj, &lease, &token, &flags, &value) ||
	    !key_arg(keyobj, &key)) {
		return NULL;
	}
	if (value != Py_None && !key_arg(value, &data)) {
		return NULL;
	}
	if (nc_keep(&self->core, key, lease, token, (uint8_t)flags,
		    value == Py_None ? NULL : &data) != 0) {
		return PyErr_Format(PyExc_OSError, "tdb_store of a local record failed");
	}
	Py_RETURN_NONE;
}

/* write(key, value, in_store=None): a fenced write under the lock; True if it existed */
static PyObject *lr_write(LocalRecords *self, PyObject *args)
{
	PyObject *keyobj, *value, *in_store = Py_None;
	TDB_DATA key, data = tdb_null;
	struct local_header h;
	enum nc_fence fenced;
	bool existed;
	int store = -1;

	if (!PyArg_ParseTuple(args, "OO|O", &keyobj, &value, &in_store) || !key_arg(keyobj, &key) ||
	    (value != Py_None && !key_arg(value, &data))) {
		return NULL;
	}
	Py_BEGIN_ALLOW_THREADS
	fenced = nc_fence(&self->core, key, &h);
	Py_END_ALLOW_THREADS
	if (fenced == NC_FENCE_NOT_LOCKED) {
		return PyErr_Format(PyExc_RuntimeError, "write to %R without its record lock", keyobj);
	}
	if (fenced == NC_FENCE_GONE) {
		return PyErr_Format(fenced_out, "the node lease %R was taken under is gone", keyobj);
	}
	if (in_store != Py_None) {
		store = PyObject_IsTrue(in_store) ? 1 : 0;
	}
	if (nc_write_fenced(&self->core, key, &h, value == Py_None ? NULL : &data, store,
			    &existed) != 0) {
		return PyErr_Format(PyExc_OSError, "tdb_store of a local record failed");
	}
	return PyBool_FromLong(existed);
}

/* standing(key): the local record as kept, valid or not, or None */
static PyObject *lr_standing(LocalRecords *self, PyObject *arg)
{
	struct local_header h;
	struct value_copy c = { NULL };
	TDB_DATA key;
	PyObject *result;

	if (!key_arg(arg, &key)) {
		return NULL;
	}
	if (!nc_standing(&self->core, key, &h, copy_value_fn, &c)) {
		Py_XDECREF(c.value);
		Py_RETURN_NONE;
	}
	result = owned_tuple(&h, c.value);
	Py_XDECREF(c.value);
	return result;
}

/* forget(key, lease): the node no longer owns key; a key of its bucket stays marked */
static PyObject *lr_forget(LocalRecords *self, PyObject *args)
{
	struct dbwrap_py_native_why why;
	PyObject *keyobj;
	long long lease;
	TDB_DATA key;

	if (!PyArg_ParseTuple(args, "OL", &keyobj, &lease) || !key_arg(keyobj, &key)) {
		return NULL;
	}
	if (nc_forget(&self->core, key, lease, &why) != 0) {
		PyErr_SetString(PyExc_OSError, why.text);
		return NULL;
	}
	Py_RETURN_NONE;
}

/* holds_bucket(key, lease): (token, stored) of the node's bucket holding key, or None */
static PyObject *lr_holds_bucket(LocalRecords *self, PyObject *args)
{
	PyObject *keyobj;
	long long lease;
	TDB_DATA key;
	int64_t token;
	bool stored;

	if (!PyArg_ParseTuple(args, "OL", &keyobj, &lease) || !key_arg(keyobj, &key)) {
		return NULL;
	}
	if (!nc_bucket_holds(&self->core, key, lease, &token, &stored)) {
		Py_RETURN_NONE;
	}
	return Py_BuildValue("(LO)", (long long)token, stored ? Py_True : Py_False);
}

static PyObject *lr_set_callbacks(LocalRecords *self, PyObject *args)
{
	PyObject *miss, *handover;

	if (!PyArg_ParseTuple(args, "OO", &miss, &handover)) {
		return NULL;
	}
	Py_INCREF(miss);
	Py_XSETREF(self->miss, miss);
	Py_INCREF(handover);
	Py_XSETREF(self->handover, handover);
	Py_RETURN_NONE;
}

static PyObject *lr_native_records(LocalRecords *self, void *closure);

static PyMethodDef lr_methods[] = {
	{ "owned", (PyCFunction)lr_owned, METH_VARARGS,
	  "owned(key, lease): (lease, token, flags, value) of what the node owns, or None." },
	{ "stand", (PyCFunction)lr_stand, METH_VARARGS,
	  "stand(key, lease): under the lock, what it stands on (a placeholder for a new key), or None." },
	{ "scan_owned", (PyCFunction)lr_scan_owned, METH_O,
	  "scan_owned(lease): [(key, lease, token, flags, value)] of the records the node owns." },
	{ "scan_owned_free", (PyCFunction)lr_scan_owned_free, METH_O,
	  "scan_owned_free(lease): (scan_owned's records in the chains no process holds now,"
	  " the number of chains passed); never waits." },
	{ "scan_buckets", (PyCFunction)lr_scan_buckets, METH_O,
	  "scan_buckets(lease): [(number, token)] of the buckets the node holds." },
	{ "scan_buckets_free", (PyCFunction)lr_scan_buckets_free, METH_O,
	  "scan_buckets_free(lease): scan_buckets's buckets in the chains no process holds now;"
	  " never waits." },
	{ "keep", (PyCFunction)lr_keep, METH_VARARGS,
	  "keep(key, lease, token, flags, value): a record moved in, kept locally." },
	{ "write", (PyCFunction)lr_write, METH_VARARGS,
	  "write(key, value, in_store=None): a fenced write under the record lock; True if it existed." },
	{ "standing", (PyCFunction)lr_standing, METH_O,
	  "standing(key): the local record as kept, valid or not, or None." },
	{ "forget", (PyCFunction)lr_forget, METH_VARARGS,
	  "forget(key, lease): drop the local copy; a key of the node's bucket stays marked detached." },
	{ "holds_bucket", (PyCFunction)lr_holds_bucket, METH_VARARGS,
	  "holds_bucket(key, lease): (token, stored) of the node's bucket of key, or None." },
	{ "set_callbacks", (PyCFunction)lr_set_callbacks, METH_VARARGS,
	  "set_callbacks(miss, handover): Python for records to move in or hand over." },
	{ NULL, NULL, 0, NULL },
};

static PyObject *lr_get_wipe(LocalRecords *self, void *closure)
{
	return PyLong_FromLongLong(self->core.wipe_revision);
}

static int lr_set_wipe(LocalRecords *self, PyObject *value, void *closure)
{
	long long revision = value != NULL ? PyLong_AsLongLong(value) : -1;

	if (revision == -1 && PyErr_Occurred()) {
		return -1;
	}
	self->core.wipe_revision = revision;
	return 0;
}

static PyGetSetDef lr_getset[] = {
	{ "wipe_revision", (getter)lr_get_wipe, (setter)lr_set_wipe,
	  "tokens up to the database's last CLEAR_IF_FIRST wipe are void", NULL },
	{ "native_records", (getter)lr_native_records, NULL,
	  "the records for the bridge, as a capsule (native_records.h)", NULL },
	{ NULL, NULL, NULL, NULL, NULL },
};

static int lr_init(LocalRecords *self, PyObject *args, PyObject *kwargs)
{
	PyObject *records, *buckets, *state;
	const char *db;
	Py_ssize_t db_len;
	double op_timeout;
	struct tdb_context *const *records_tdb, *const *buckets_tdb;

	if (!PyArg_ParseTuple(args, "OOO!y#d", &records, &buckets, &StateType, &state,
			      &db, &db_len, &op_timeout)) {
		return -1;
	}
	records_tdb = tdb_api->context_slot(records);
	buckets_tdb = tdb_api->context_slot(buckets);
	if (records_tdb == NULL || buckets_tdb == NULL) {
		return -1;
	}
	Py_INCREF(records);
	Py_XSETREF(self->records, records);
	Py_INCREF(buckets);
	Py_XSETREF(self->buckets, buckets);
	Py_INCREF(state);
	Py_XSETREF(self->state, (State *)state);
	nc_records_init(&self->core, records_tdb, buckets_tdb, &self->state->core,
			(TDB_DATA) { (uint8_t *)db, (size_t)db_len }, op_timeout);
	return 0;
}

static int lr_traverse(LocalRecords *self, visitproc visit, void *arg)
{
	Py_VISIT(self->records);
	Py_VISIT(self->buckets);
	Py_VISIT(self->state);
	Py_VISIT(self->miss);
	Py_VISIT(self->handover);
	return 0;
}

static int lr_clear(LocalRecords *self)
{
	Py_CLEAR(self->miss);
	Py_CLEAR(self->handover);
	Py_CLEAR(self->state);
	Py_CLEAR(self->records);
	Py_CLEAR(self->buckets);
	return 0;
}

static void lr_dealloc(LocalRecords *self)
{
	PyObject_GC_UnTrack(self);
	lr_clear(self);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject LocalRecordsType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "dbwrap_py.nodecache._fastpath.LocalRecords",
	.tp_basicsize = sizeof(LocalRecords),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
	.tp_doc = "LocalRecords(records, buckets, state, db_id, op_timeout): one database's\n"
		  "records on the node, and the rules of what the node owns.",
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)lr_init,
	.tp_traverse = (traverseproc)lr_traverse,
	.tp_clear = (inquiry)lr_clear,
	.tp_dealloc = (destructor)lr_dealloc,
	.tp_methods = lr_methods,
	.tp_getset = lr_getset,
};

static void capsule_free(PyObject *capsule)
{
	Py_XDECREF((PyObject *)PyCapsule_GetPointer(capsule, DBWRAP_PY_NATIVE_RECORDS));
}

static PyObject *lr_native_records(LocalRecords *self, void *closure)
{
	PyObject *capsule = PyCapsule_New(self, DBWRAP_PY_NATIVE_RECORDS, capsule_free);

	if (capsule == NULL) {
		return NULL;
	}
	if (PyCapsule_SetContext(capsule, (void *)&native_ops) != 0) {
		Py_DECREF(capsule);
		return NULL;
	}
	Py_INCREF(self); /* the capsule keeps the records alive */
	return capsule;
}

/* -- the module ----------------------------------------------------------------- */

static struct PyModuleDef module = {
	PyModuleDef_HEAD_INIT, "_fastpath",
	"The node cache's records in C: the node agent's state, and one database's local records.",
	-1, NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastpath(void)
{
	PyObject *m, *errors;

	if (PyType_Ready(&StateType) < 0 || PyType_Ready(&LocalRecordsType) < 0) {
		return NULL;
	}
	/* PyCapsule_Import walks attributes: the module must be imported first */
	errors = PyImport_ImportModule("dbwrap_py.adapters.tdb._tdb");
	if (errors == NULL) {
		return NULL;
	}
	Py_DECREF(errors);
	tdb_api = PyCapsule_Import(DBWRAP_PY_TDB_API, 0);
	if (tdb_api == NULL) {
		return NULL;
	}
	if (tdb_api->version != DBWRAP_PY_TDB_API_VERSION) {
		return PyErr_Format(PyExc_ImportError, "%s is version %u, this needs %u",
				    DBWRAP_PY_TDB_API, tdb_api->version, DBWRAP_PY_TDB_API_VERSION);
	}
	errors = PyImport_ImportModule("dbwrap_py.errors");
	if (errors == NULL) {
		return NULL;
	}
	Py_XSETREF(fenced_out, PyObject_GetAttrString(errors, "FencedOut"));
	Py_XSETREF(not_found, PyObject_GetAttrString(errors, "NotFound"));
	Py_DECREF(errors);
	if (fenced_out == NULL || not_found == NULL) {
		return NULL;
	}
	m = PyModule_Create(&module);
	if (m != NULL && (PyModule_AddType(m, &StateType) != 0 ||
			  PyModule_AddType(m, &LocalRecordsType) != 0)) {
		Py_CLEAR(m);
	}
	return m;
}
