/*
 * dbwrap_py.nodecache._fastpath: the node's records in C, and the rules
 * that say which of them the node owns.
 *
 * State(cache_dir) reads the node agent's state file (_layout.h): the live
 * node lease, and the wanted table.
 *
 * LocalRecords(records, buckets, state, db_id, op_timeout) is one
 * database's local tdb files (two tdb adapters) with the rules, in one
 * place for both paths:
 *   - a local record is the node's while its lease is the live one, its
 *     token is newer than the database's last wipe, and it is not detached;
 *   - a key of a bucket the node holds that is neither in the local records
 *     nor among the keys the store had at the claim does not exist;
 *   - a record lock stands on the local record's header: a lock on a
 *     record the node has no copy of writes one (a placeholder, deleted),
 *     and every write under the lock is fenced on that header's lease.
 * Python (cache.py) calls its methods; the bridge calls the same functions
 * as native records (c_bridge/native_records.h), without the GIL. Only a
 * record the node must move in, or hand over, goes to Python: the `miss`
 * and `handover` callbacks, called with the GIL taken.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <talloc.h>
#include <tdb.h>
#include <time.h>
#include <unistd.h>

#include "_layout.h"
#include "_tdb_api.h"
#include "native_records.h"

#define RECHECK_SECONDS 0.5
#define NT_NOT_FOUND 0xC0000225u
#define NT_INTERNAL_DB_ERROR 0xC0000158u
#define NT_NO_MEMORY 0xC0000017u
#define NT_LOCK_CONFLICT 0xC0000054u

static const struct dbwrap_py_tdb_api *tdb_api;
static PyObject *fenced_out;   /* dbwrap_py.errors.FencedOut */
static PyObject *not_found;    /* dbwrap_py.errors.NotFound */

static double monotonic_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* -- State: the agent's state file -------------------------------------------- */

typedef struct {
	PyObject_HEAD
	char *path;
	const uint8_t *map; /* STATE_SIZE bytes, read-only; NULL before an agent ran */
	ino_t inode;
	double next_check;
} State;

static void state_unmap(State *self)
{
	if (self->map != NULL) {
		munmap((void *)self->map, STATE_SIZE);
		self->map = NULL;
		self->inode = 0;
	}
}

/* Map the file again if the agent replaced it (a restart); true if it did. */
static bool state_remap(State *self)
{
	struct stat st;
	void *map;
	int fd = open(self->path, O_RDONLY | O_CLOEXEC);

	if (fd < 0) {
		return false;
	}
	if (fstat(fd, &st) != 0 || st.st_ino == self->inode || st.st_size < STATE_SIZE) {
		close(fd);
		return false;
	}
	map = mmap(NULL, STATE_SIZE, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (map == MAP_FAILED) {
		return false;
	}
	state_unmap(self);
	self->map = map;
	self->inode = st.st_ino;
	return true;
}

struct state_header {
	int64_t lease;
	double valid_until;
	uint32_t status;
	uint32_t pid;
	char name[STATE_NAME_SIZE + 1];
};

/* A consistent copy: retried while the agent writes (an odd counter). */
static bool state_header(const uint8_t *map, struct state_header *h)
{
	int attempt;

	for (attempt = 0; attempt < 100000; attempt++) {
		uint32_t seq = __atomic_load_n((const uint32_t *)(map + STATE_SEQ), __ATOMIC_ACQUIRE);

		if ((seq & 1) == 0 && memcmp(map, STATE_MAGIC, 4) == 0) {
			memcpy(&h->lease, map + STATE_LEASE, 8);
			memcpy(&h->valid_until, map + STATE_VALID_UNTIL, 8);
			memcpy(&h->status, map + STATE_STATUS, 4);
			memcpy(&h->pid, map + STATE_PID, 4);
			memcpy(h->name, map + STATE_NAME, STATE_NAME_SIZE);
			h->name[STATE_NAME_SIZE] = '\0';
			__atomic_thread_fence(__ATOMIC_ACQUIRE);
			if (__atomic_load_n((const uint32_t *)(map + STATE_SEQ), __ATOMIC_RELAXED) == seq) {
				return true;
			}
		}
		if (attempt > 8) {
			sched_yield(); /* the agent was descheduled mid-write: let it finish */
		}
	}
	return false;
}

/* The node lease while it is surely alive (0 if not), and the agent's status. */
static int64_t state_live(State *self, uint32_t *status)
{
	struct state_header h = { .lease = 0, .status = STATE_STOPPED };
	double now = monotonic_now();

	if (self->map == NULL || !state_header(self->map, &h) || now >= h.valid_until) {
		if (now >= self->next_check) {
			self->next_check = now + RECHECK_SECONDS;
			if (state_remap(self) && state_header(self->map, &h) && now < h.valid_until) {
				*status = h.status;
				return h.lease;
			}
		}
		*status = (self->map != NULL && state_header(self->map, &h)) ? h.status : STATE_STOPPED;
		return 0;
	}
	*status = h.status;
	return h.lease;
}

static bool state_wanted(const State *self, uint64_t hash)
{
	unsigned start = (unsigned)(hash % STATE_WANTED_SLOTS), i;

	if (self->map == NULL) {
		return false;
	}
	for (i = 0; i < STATE_WANTED_PROBES; i++) {
		const uint64_t *slot = (const uint64_t *)(self->map + STATE_WANTED) +
				       (start + i) % STATE_WANTED_SLOTS;
		uint64_t value = __atomic_load_n(slot, __ATOMIC_RELAXED);

		if (value == hash) {
			return true;
		}
		if (value == WANTED_FREE) {
			return false;
		}
	}
	return false;
}

static int state_init(State *self, PyObject *args, PyObject *kwargs)
{
	PyObject *encoded; /* the directory, str or path-like, as the file system's bytes */
	const char *dir;

	if (!PyArg_ParseTuple(args, "O&", PyUnicode_FSConverter, &encoded)) {
		return -1;
	}
	dir = PyBytes_AS_STRING(encoded);
	PyMem_Free(self->path);
	self->path = PyMem_Malloc(strlen(dir) + sizeof("/" STATE_FILE));
	if (self->path == NULL) {
		Py_DECREF(encoded);
		PyErr_NoMemory();
		return -1;
	}
	strcpy(self->path, dir);
	strcat(self->path, "/" STATE_FILE);
	Py_DECREF(encoded);
	state_unmap(self);
	/* now, while smbd is still root: its client processes run as the user */
	state_remap(self);
	return 0;
}

static void state_dealloc(State *self)
{
	state_unmap(self);
	PyMem_Free(self->path);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *state_py_current(State *self, PyObject *unused)
{
	struct state_header h;
	uint32_t status;
	int64_t lease = state_live(self, &status);

	if (lease == 0 || status != STATE_RUNNING || !state_header(self->map, &h)) {
		return Py_BuildValue("(Ly#)", (long long)0, "", (Py_ssize_t)0);
	}
	return Py_BuildValue("(Ly)", (long long)lease, h.name);
}

static PyObject *state_py_lease(State *self, PyObject *unused)
{
	uint32_t status;

	return PyLong_FromLongLong(state_live(self, &status));
}

static PyObject *state_py_configured(State *self, PyObject *unused)
{
	struct state_header h;

	if (self->map == NULL && !state_remap(self)) {
		Py_RETURN_FALSE;
	}
	if (state_header(self->map, &h) && h.status == STATE_STOPPED) {
		state_remap(self); /* a new agent may have replaced the file */
	}
	return PyBool_FromLong(state_header(self->map, &h) && h.status != STATE_STOPPED);
}

static PyObject *state_py_node_name(State *self, PyObject *unused)
{
	struct state_header h;

	if ((self->map == NULL && !state_remap(self)) || !state_header(self->map, &h)) {
		return PyBytes_FromStringAndSize("", 0);
	}
	return PyBytes_FromString(h.name);
}

static PyObject *state_py_agent_pid(State *self, PyObject *unused)
{
	struct state_header h;

	state_remap(self);
	if (self->map == NULL || !state_header(self->map, &h)) {
		return PyLong_FromLong(0);
	}
	return PyLong_FromUnsignedLong(h.pid);
}

static PyObject *state_py_wanted(State *self, PyObject *args)
{
	const char *db, *key;
	Py_ssize_t db_len, key_len;

	if (!PyArg_ParseTuple(args, "y#y#", &db, &db_len, &key, &key_len)) {
		return NULL;
	}
	return PyBool_FromLong(state_wanted(self, record_hash(layout_crc((const uint8_t *)db, db_len),
							     (const uint8_t *)key, key_len)));
}

static PyObject *state_py_close(State *self, PyObject *unused)
{
	state_unmap(self);
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
	struct tdb_context *const *records_tdb;
	struct tdb_context *const *buckets_tdb;
	State *state;
	uint32_t db_crc;
	int64_t wipe_revision; /* tokens up to it are void */
	double op_timeout;
	PyObject *miss;     /* miss(key, locked) -> value: move a record in (Python) */
	PyObject *handover; /* handover(key): give a wanted record back (Python, lock held) */
} LocalRecords;

enum owned_kind { OWNED_NONE, OWNED_RECORD, OWNED_FRESH };

struct classify_state {
	const LocalRecords *self;
	int64_t lease;
	dbwrap_py_native_value_fn fn; /* called with a valid record's value, or NULL */
	void *private_data;
	bool valid;
	struct local_header header;
};

/* The local record, if the node owns it now (the first rule above). */
static int classify_parser(TDB_DATA key, TDB_DATA data, void *private_data)
{
	struct classify_state *c = private_data;
	struct local_header h;

	if (data.dsize < LOCAL_HEADER) {
		return 0; /* not ours: written by nobody we know */
	}
	local_header_unpack(data.dptr, &h);
	c->header = h;
	c->valid = h.lease == c->lease && h.token > c->self->wipe_revision &&
		   !(h.flags & LOCAL_DETACHED);
	if (c->valid && c->fn != NULL) {
		TDB_DATA value = { data.dptr + LOCAL_HEADER, data.dsize - LOCAL_HEADER };

		c->fn(value, !(h.flags & LOCAL_DELETED), c->private_data);
	}
	return 0;
}

struct bucket_state {
	int64_t lease, wipe_revision;
	TDB_DATA key;
	bool ours;      /* a bucket the node holds under the lease */
	bool stored;    /* the key was in the store at the claim */
	int64_t token;
};

static int bucket_parser(TDB_DATA bkey, TDB_DATA data, void *private_data)
{
	struct bucket_state *b = private_data;
	int64_t lease, token;
	uint32_t count, i, len;
	size_t off = BUCKET_HEADER;

	if (data.dsize < BUCKET_HEADER) {
		return 0;
	}
	memcpy(&lease, data.dptr, 8);
	memcpy(&token, data.dptr + 8, 8);
	memcpy(&count, data.dptr + 16, 4);
	b->ours = lease == b->lease && token > b->wipe_revision;
	b->token = token;
	for (i = 0; b->ours && i < count && off + 4 <= data.dsize; i++) {
		memcpy(&len, data.dptr + off, 4);
		off += 4;
		if (off + len > data.dsize) {
			break;
		}
		if (len == b->key.dsize && memcmp(data.dptr + off, b->key.dptr, len) == 0) {
			b->stored = true;
			break;
		}
		off += len;
	}
	return 0;
}

static TDB_DATA bucket_key(unsigned number, char *buf, size_t size)
{
	int len = snprintf(buf, size, "%u", number);

	return (TDB_DATA) { (uint8_t *)buf, (size_t)len };
}

/* The node's bucket holding key, if any: its token, and whether the key was in the store. */
static bool bucket_holds(const LocalRecords *self, TDB_DATA key, int64_t lease,
			 int64_t *token, bool *stored)
{
	struct tdb_context *tdb = *self->buckets_tdb;
	struct bucket_state b = { .lease = lease, .wipe_revision = self->wipe_revision, .key = key };
	char buf[16];

	if (tdb == NULL) {
		return false;
	}
	(void)tdb_parse_record(tdb, bucket_key(bucket_of(key.dptr, key.dsize), buf, sizeof(buf)),
			       bucket_parser, &b);
	*token = b.token;
	*stored = b.stored;
	return b.ours;
}

/*
 * What the node owns of key under lease: its record (fn gets the value), a
 * new key of its bucket (header: the bucket's token), or nothing.
 */
static enum owned_kind classify(const LocalRecords *self, TDB_DATA key, int64_t lease,
				dbwrap_py_native_value_fn fn, void *private_data,
				struct local_header *header)
{
	struct tdb_context *tdb = *self->records_tdb;
	struct classify_state c = { .self = self, .lease = lease, .fn = fn,
				    .private_data = private_data };
	int64_t token;
	bool stored, found;

	if (tdb == NULL) {
		return OWNED_NONE;
	}
	found = tdb_parse_record(tdb, key, classify_parser, &c) == 0;
	if (c.valid) {
		*header = c.header;
		return OWNED_RECORD;
	}
	if (found && c.header.lease == lease && (c.header.flags & LOCAL_DETACHED)) {
		return OWNED_NONE; /* out of the node's bucket for good */
	}
	if (!bucket_holds(self, key, lease, &token, &stored) || stored) {
		return OWNED_NONE;
	}
	*header = (struct local_header) { lease, token, LOCAL_VIA_BUCKET | LOCAL_DELETED };
	return OWNED_FRESH;
}

/* Store header + value (the buffers) as key's local record. */
static int keep_local(const LocalRecords *self, TDB_DATA key, const struct local_header *h,
		      const TDB_DATA *dbufs, int num_dbufs)
{
	struct tdb_context *tdb = *self->records_tdb;
	uint8_t packed[LOCAL_HEADER];
	TDB_DATA stack[8], *bufs = stack;
	int i, ret;

	if (tdb == NULL) {
		errno = EBADF;
		return -1;
	}
	if (num_dbufs + 1 > (int)(sizeof(stack) / sizeof(stack[0]))) {
		bufs = malloc(sizeof(TDB_DATA) * (num_dbufs + 1));
		if (bufs == NULL) {
			return -1;
		}
	}
	local_header_pack(h, packed);
	bufs[0] = (TDB_DATA) { packed, LOCAL_HEADER };
	for (i = 0; i < num_dbufs; i++) {
		bufs[i + 1] = dbufs[i];
	}
	ret = tdb_storev(tdb, key, bufs, num_dbufs + 1, TDB_REPLACE);
	if (bufs != stack) {
		free(bufs);
	}
	return ret;
}

/* The header a lock stands on (read under the lock). */
static int header_parser(TDB_DATA key, TDB_DATA data, void *private_data)
{
	struct local_header *h = private_data;

	if (data.dsize >= LOCAL_HEADER) {
		local_header_unpack(data.dptr, h);
	}
	return 0;
}

enum fence_result { FENCE_OK, FENCE_NOT_LOCKED, FENCE_GONE };

/*
 * The third rule: a write under a lock stands on the local header, written
 * when the lock was taken; its lease must be proved live. A late keepalive
 * only delays the write; an ended lease fences it.
 */
static enum fence_result fence(const LocalRecords *self, TDB_DATA key, struct local_header *h)
{
	struct tdb_context *tdb = *self->records_tdb;
	double deadline = monotonic_now() + self->op_timeout;
	struct timespec pause = { 0, 5 * 1000 * 1000 };
	uint32_t status;

	h->lease = 0;
	if (tdb == NULL || tdb_parse_record(tdb, key, header_parser, h) != 0 || h->lease == 0) {
		return FENCE_NOT_LOCKED;
	}
	for (;;) {
		int64_t lease = state_live(self->state, &status);

		if (lease == h->lease) {
			return FENCE_OK;
		}
		if (lease != 0 || monotonic_now() >= deadline) {
			return FENCE_GONE;
		}
		nanosleep(&pause, NULL);
	}
}

static uint32_t native_why(struct dbwrap_py_native_why *why, uint32_t status, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why->text, sizeof(why->text), fmt, ap);
	va_end(ap);
	return status;
}

/* The pending Python exception as an NTSTATUS and a reason (GIL held). */
static uint32_t status_from_exception(struct dbwrap_py_native_why *why)
{
	PyObject *type, *value, *traceback, *code, *text;
	uint32_t status = NT_INTERNAL_DB_ERROR;

	PyErr_Fetch(&type, &value, &traceback);
	PyErr_NormalizeException(&type, &value, &traceback);
	code = value != NULL ? PyObject_GetAttrString(value, "ntstatus") : NULL;
	if (code != NULL && PyLong_Check(code)) {
		status = (uint32_t)PyLong_AsUnsignedLongMask(code);
	} else if (type != NULL && PyErr_GivenExceptionMatches(type, PyExc_MemoryError)) {
		status = NT_NO_MEMORY;
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
 * here. Not locked: its value is handed to fn, copied out of Python first.
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
		return native_why(why, NT_INTERNAL_DB_ERROR, "the node cache has no miss handler");
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
			status = native_why(why, NT_NO_MEMORY, "no memory for a %zd-byte value", len);
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

/*
 * What a lock on key stands on, under lease (chainlock held): the record the
 * node owns, or for a new key of its bucket the placeholder written now.
 * OWNED_NONE: the record must be moved in. -1 (as a kind): the store failed.
 */
static int stand(const LocalRecords *self, TDB_DATA key, int64_t lease,
		 dbwrap_py_native_value_fn fn, void *private_data, struct local_header *h)
{
	enum owned_kind kind = classify(self, key, lease, fn, private_data, h);

	if (kind == OWNED_FRESH) {
		if (keep_local(self, key, h, NULL, 0) != 0) {
			return -1;
		}
		if (fn != NULL) {
			fn(tdb_null, false, private_data);
		}
	}
	return kind;
}

/* -- native records: the bridge's hot path, no GIL -------------------------------- */

static uint32_t closed_why(struct dbwrap_py_native_why *why)
{
	return native_why(why, 0xC00000A3u /* DEVICE_NOT_READY */, "the node cache is closed");
}

static uint32_t nc_fetch(void *handle, TDB_DATA key, dbwrap_py_native_value_fn fn,
			 void *private_data, struct dbwrap_py_native_why *why)
{
	LocalRecords *self = handle;
	struct local_header h;
	uint32_t status;
	int64_t lease = state_live(self->state, &status);

	if (lease != 0 && status != STATE_STOPPED) {
		switch (classify(self, key, lease, fn, private_data, &h)) {
		case OWNED_RECORD:
			return 0;
		case OWNED_FRESH:
			fn(tdb_null, false, private_data);
			return 0;
		case OWNED_NONE:
			break;
		}
	}
	return python_miss(self, key, false, fn, private_data, why);
}

static uint32_t nc_lock_fetch(void *handle, TDB_DATA key, dbwrap_py_native_value_fn fn,
			      void *private_data, struct dbwrap_py_native_why *why)
{
	LocalRecords *self = handle;
	struct tdb_context *tdb = *self->records_tdb;
	struct local_header h;
	uint32_t status, code;
	int64_t lease;
	int kind;

	if (tdb == NULL) {
		return closed_why(why);
	}
	if (tdb_chainlock(tdb, key) != 0) {
		return native_why(why, NT_LOCK_CONFLICT, "tdb_chainlock: %s", tdb_errorstr(tdb));
	}
	lease = state_live(self->state, &status);
	kind = (lease != 0 && status == STATE_RUNNING)
		? stand(self, key, lease, fn, private_data, &h) : (int)OWNED_NONE;
	if (kind == OWNED_RECORD || kind == OWNED_FRESH) {
		return 0;
	}
	if (kind < 0) {
		code = native_why(why, NT_INTERNAL_DB_ERROR, "tdb_store: %s", tdb_errorstr(tdb));
		tdb_chainunlock(tdb, key);
		return code;
	}
	code = python_miss(self, key, true, NULL, NULL, why);
	if (code == 0) {
		lease = state_live(self->state, &status);
		if (classify(self, key, lease, fn, private_data, &h) == OWNED_NONE) {
			code = native_why(why, NT_LOCK_CONFLICT, "the record changed hands while it moved in");
		}
	}
	if (code != 0) {
		tdb_chainunlock(tdb, key);
	}
	return code;
}

static uint32_t nc_unlock(void *handle, TDB_DATA key, struct dbwrap_py_native_why *why)
{
	LocalRecords *self = handle;
	struct tdb_context *tdb = *self->records_tdb;
	uint32_t status;

	if (tdb == NULL) {
		return closed_why(why);
	}
	if (state_live(self->state, &status) != 0 &&
	    state_wanted(self->state, record_hash(self->db_crc, key.dptr, key.dsize))) {
		python_handover(self, key);
	}
	/* a record locked before fork and freed in the child: never held here */
	if (tdb_chainunlock(tdb, key) != 0 && tdb_error(tdb) != TDB_ERR_LOCK) {
		return native_why(why, NT_INTERNAL_DB_ERROR, "tdb_chainunlock: %s", tdb_errorstr(tdb));
	}
	return 0;
}

static uint32_t fence_why(enum fence_result result, struct dbwrap_py_native_why *why)
{
	if (result == FENCE_NOT_LOCKED) {
		return native_why(why, NT_LOCK_CONFLICT, "a write without its record lock");
	}
	return native_why(why, NT_LOCK_CONFLICT, "FencedOut: the node lease the record was taken under is gone");
}

static uint32_t nc_storev(void *handle, TDB_DATA key, const TDB_DATA *dbufs, int num_dbufs,
			  struct dbwrap_py_native_why *why)
{
	LocalRecords *self = handle;
	struct local_header h;
	enum fence_result fenced = fence(self, key, &h);

	if (fenced != FENCE_OK) {
		return fence_why(fenced, why);
	}
	h.flags &= ~LOCAL_DELETED;
	if (keep_local(self, key, &h, dbufs, num_dbufs) != 0) {
		return native_why(why, NT_INTERNAL_DB_ERROR, "tdb_storev of the local record failed");
	}
	return 0;
}

static uint32_t nc_delete(void *handle, TDB_DATA key, struct dbwrap_py_native_why *why)
{
	LocalRecords *self = handle;
	struct local_header h;
	enum fence_result fenced = fence(self, key, &h);

	if (fenced != FENCE_OK) {
		return fence_why(fenced, why);
	}
	if (h.flags & LOCAL_DELETED) {
		return native_why(why, NT_NOT_FOUND, "delete of a missing key");
	}
	h.flags |= LOCAL_DELETED; /* a tombstone: the vacuum tells the store, or drops it */
	if (keep_local(self, key, &h, NULL, 0) != 0) {
		return native_why(why, NT_INTERNAL_DB_ERROR, "tdb_store of the tombstone failed");
	}
	return 0;
}

static void exists_fn(TDB_DATA value, bool found, void *private_data)
{
	*(bool *)private_data = found;
}

static uint32_t nc_exists(void *handle, TDB_DATA key, bool *exists,
			  struct dbwrap_py_native_why *why)
{
	*exists = false;
	return nc_fetch(handle, key, exists_fn, exists, why);
}

static uint32_t nc_seqnum(void *handle, int *seqnum, struct dbwrap_py_native_why *why)
{
	LocalRecords *self = handle;
	struct tdb_context *tdb = *self->records_tdb;

	if (tdb == NULL) {
		return closed_why(why);
	}
	*seqnum = tdb_get_seqnum(tdb) & 0x7FFFFFFF;
	return 0;
}

static const struct dbwrap_py_native_records native_ops = {
	.fetch = nc_fetch,
	.lock_fetch = nc_lock_fetch,
	.unlock = nc_unlock,
	.storev = nc_storev,
	.delete_rec = nc_delete,
	.exists = nc_exists,
	.seqnum = nc_seqnum,
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
	enum owned_kind kind;

	if (!PyArg_ParseTuple(args, "OL", &keyobj, &lease) || !key_arg(keyobj, &key)) {
		return NULL;
	}
	kind = classify(self, key, lease, copy_value_fn, &c, &h);
	if (kind == OWNED_NONE) {
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
	kind = stand(self, key, lease, copy_value_fn, &c, &h);
	if (kind < 0) {
		Py_XDECREF(c.value);
		return PyErr_Format(PyExc_OSError, "tdb_store of a placeholder failed");
	}
	if (kind == OWNED_NONE) {
		Py_RETURN_NONE;
	}
	result = owned_tuple(&h, c.value);
	Py_XDECREF(c.value);
	return result;
}

/*
 * The scans (the agent's vacuum and drain) traverse a local tdb with the
 * GIL released: the traverse waits on any chain a process holds locked,
 * and the agent's other threads (its lease's keepalive above all) must run
 * meanwhile. The traverse only copies the matching records out; Python
 * objects are made afterwards, with the GIL.
 */
struct scanned {
	uint8_t *key, *data;
	size_t key_size, data_size;
};

struct scan_state {
	int64_t lease, wipe_revision;
	size_t header_size;  /* LOCAL_HEADER or BUCKET_HEADER */
	bool local_records;  /* else buckets */
	struct scanned *found;
	size_t count, allocated;
	bool out_of_memory;
};

/* Whether a record or bucket is the node's under s->lease. */
static bool scan_matches(const struct scan_state *s, TDB_DATA data)
{
	struct local_header h;

	if (data.dsize < s->header_size) {
		return false;
	}
	local_header_unpack(data.dptr, &h); /* a bucket starts with its lease and token too */
	if (h.lease != s->lease || h.token <= s->wipe_revision) {
		return false;
	}
	return !s->local_records || !(h.flags & LOCAL_DETACHED);
}

static int scan_copy_fn(struct tdb_context *tdb, TDB_DATA key, TDB_DATA data, void *private_data)
{
	struct scan_state *s = private_data;
	struct scanned *item;

	if (!scan_matches(s, data)) {
		return 0;
	}
	if (s->count == s->allocated) {
		size_t allocated = s->allocated ? 2 * s->allocated : 64;
		struct scanned *found = talloc_realloc(NULL, s->found, struct scanned, allocated);

		if (found == NULL) {
			s->out_of_memory = true;
			return -1;
		}
		s->found = found;
		s->allocated = allocated;
	}
	item = &s->found[s->count];
	item->key = talloc_memdup(s->found, key.dptr, key.dsize ? key.dsize : 1);
	item->data = talloc_memdup(s->found, data.dptr, data.dsize);
	if (item->key == NULL || item->data == NULL) {
		s->out_of_memory = true;
		return -1;
	}
	item->key_size = key.dsize;
	item->data_size = data.dsize;
	s->count++;
	return 0;
}

/* Copy out the node's records (or buckets) of tdb; 0, or -1 with an exception set. */
static int scan_copy(struct tdb_context *tdb, struct scan_state *s)
{
	int ret;

	if (tdb == NULL) {
		PyErr_SetString(PyExc_OSError, "the node cache is closed");
		return -1;
	}
	Py_BEGIN_ALLOW_THREADS
	ret = tdb_traverse_read(tdb, scan_copy_fn, s);
	Py_END_ALLOW_THREADS
	if (s->out_of_memory) {
		PyErr_NoMemory();
		return -1;
	}
	if (ret < 0) {
		PyErr_Format(PyExc_OSError, "tdb_traverse_read failed: %s", tdb_errorstr(tdb));
		return -1;
	}
	return 0;
}

/* (key, lease, token, flags, value or None) of a local record */
static PyObject *scanned_record(const struct scanned *item)
{
	struct local_header h;
	PyObject *value;

	local_header_unpack(item->data, &h);
	value = (h.flags & LOCAL_DELETED)
		? Py_NewRef(Py_None)
		: PyBytes_FromStringAndSize((const char *)item->data + LOCAL_HEADER,
					    (Py_ssize_t)(item->data_size - LOCAL_HEADER));
	if (value == NULL) {
		return NULL;
	}
	return Py_BuildValue("(y#LLiN)", (const char *)item->key, (Py_ssize_t)item->key_size,
			     (long long)h.lease, (long long)h.token, (int)h.flags, value);
}

/* (number, token) of a bucket: its key is the number in decimal */
static PyObject *scanned_bucket(const struct scanned *item)
{
	char number[16];
	int64_t token;

	if (item->key_size >= sizeof(number)) {
		return PyErr_Format(PyExc_ValueError, "a bucket key of %zu bytes", item->key_size);
	}
	memcpy(number, item->key, item->key_size);
	number[item->key_size] = '\0';
	memcpy(&token, item->data + 8, 8);
	return Py_BuildValue("(iL)", atoi(number), (long long)token);
}

static PyObject *scan(LocalRecords *self, PyObject *arg, bool local_records)
{
	struct scan_state s = {
		.lease = PyLong_AsLongLong(arg),
		.wipe_revision = self->wipe_revision,
		.header_size = local_records ? LOCAL_HEADER : BUCKET_HEADER,
		.local_records = local_records,
	};
	PyObject *list = NULL, *item;
	size_t i;

	if (PyErr_Occurred() ||
	    scan_copy(local_records ? *self->records_tdb : *self->buckets_tdb, &s) != 0) {
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
	TALLOC_FREE(s.found);
	return list;
}

/* scan_owned(lease): [(key, lease, token, flags, value)] of the local records the node owns */
static PyObject *lr_scan_owned(LocalRecords *self, PyObject *arg)
{
	return scan(self, arg, true);
}

/* scan_buckets(lease): [(number, token)] of the buckets the node holds */
static PyObject *lr_scan_buckets(LocalRecords *self, PyObject *arg)
{
	return scan(self, arg, false);
}

/* keep(key, lease, token, flags, value): a record moved in, as the local copy */
static PyObject *lr_keep(LocalRecords *self, PyObject *args)
{
	PyObject *keyobj, *value;
	long long lease, token;
	int flags;
	TDB_DATA key, data = tdb_null;
	struct local_header h;

	if (!PyArg_ParseTuple(args, "OLLiO", &keyobj, &lease, &token, &flags, &value) ||
	    !key_arg(keyobj, &key)) {
		return NULL;
	}
	if (value != Py_None && !key_arg(value, &data)) {
		return NULL;
	}
	h = (struct local_header) { lease, token, (uint8_t)flags };
	if (value == Py_None && !(flags & LOCAL_DETACHED)) {
		h.flags |= LOCAL_DELETED;
	}
	if (keep_local(self, key, &h, value == Py_None ? NULL : &data, value == Py_None ? 0 : 1) != 0) {
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
	enum fence_result fenced;
	bool existed;

	if (!PyArg_ParseTuple(args, "OO|O", &keyobj, &value, &in_store) || !key_arg(keyobj, &key) ||
	    (value != Py_None && !key_arg(value, &data))) {
		return NULL;
	}
	Py_BEGIN_ALLOW_THREADS
	fenced = fence(self, key, &h);
	Py_END_ALLOW_THREADS
	if (fenced == FENCE_NOT_LOCKED) {
		return PyErr_Format(PyExc_RuntimeError, "write to %R without its record lock", keyobj);
	}
	if (fenced == FENCE_GONE) {
		return PyErr_Format(fenced_out, "the node lease %R was taken under is gone", keyobj);
	}
	existed = !(h.flags & LOCAL_DELETED);
	h.flags = value == Py_None ? (h.flags | LOCAL_DELETED) : (h.flags & ~LOCAL_DELETED);
	if (in_store != Py_None) {
		h.flags = PyObject_IsTrue(in_store) ? (h.flags | LOCAL_IN_STORE) : (h.flags & ~LOCAL_IN_STORE);
	}
	if (keep_local(self, key, &h, value == Py_None ? NULL : &data, value == Py_None ? 0 : 1) != 0) {
		return PyErr_Format(PyExc_OSError, "tdb_store of a local record failed");
	}
	return PyBool_FromLong(existed);
}

struct standing_state {
	struct local_header h;
	PyObject *value;
	bool found;
};

static int standing_parser(TDB_DATA key, TDB_DATA data, void *private_data)
{
	struct standing_state *s = private_data;

	if (data.dsize < LOCAL_HEADER) {
		return 0;
	}
	local_header_unpack(data.dptr, &s->h);
	s->found = true;
	if (!(s->h.flags & (LOCAL_DELETED | LOCAL_DETACHED))) {
		s->value = PyBytes_FromStringAndSize((const char *)data.dptr + LOCAL_HEADER,
						     data.dsize - LOCAL_HEADER);
	}
	return 0;
}

/* standing(key): the local record as kept, valid or not, or None */
static PyObject *lr_standing(LocalRecords *self, PyObject *arg)
{
	struct tdb_context *tdb = *self->records_tdb;
	struct standing_state s = { .found = false, .value = NULL };
	TDB_DATA key;
	PyObject *result;

	if (!key_arg(arg, &key)) {
		return NULL;
	}
	if (tdb == NULL || tdb_parse_record(tdb, key, standing_parser, &s) != 0 || !s.found) {
		Py_XDECREF(s.value);
		Py_RETURN_NONE;
	}
	result = owned_tuple(&s.h, s.value);
	Py_XDECREF(s.value);
	return result;
}

/* forget(key, lease): the node no longer owns key; a key of its bucket stays marked */
static PyObject *lr_forget(LocalRecords *self, PyObject *args)
{
	struct tdb_context *tdb = *self->records_tdb;
	PyObject *keyobj;
	long long lease;
	TDB_DATA key;
	int64_t token;
	bool stored;

	if (!PyArg_ParseTuple(args, "OL", &keyobj, &lease) || !key_arg(keyobj, &key)) {
		return NULL;
	}
	if (tdb == NULL) {
		return PyErr_Format(PyExc_OSError, "the node cache is closed");
	}
	if (bucket_holds(self, key, lease, &token, &stored)) {
		struct local_header h = { lease, token, LOCAL_DETACHED };

		if (keep_local(self, key, &h, NULL, 0) != 0) {
			return PyErr_Format(PyExc_OSError, "tdb_store of a detached mark failed");
		}
	} else if (tdb_delete(tdb, key) != 0 && tdb_error(tdb) != TDB_ERR_NOEXIST) {
		return PyErr_Format(PyExc_OSError, "tdb_delete: %s", tdb_errorstr(tdb));
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
	if (!bucket_holds(self, key, lease, &token, &stored)) {
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
	{ "scan_buckets", (PyCFunction)lr_scan_buckets, METH_O,
	  "scan_buckets(lease): [(number, token)] of the buckets the node holds." },
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
	return PyLong_FromLongLong(self->wipe_revision);
}

static int lr_set_wipe(LocalRecords *self, PyObject *value, void *closure)
{
	long long revision = value != NULL ? PyLong_AsLongLong(value) : -1;

	if (revision == -1 && PyErr_Occurred()) {
		return -1;
	}
	self->wipe_revision = revision;
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

	if (!PyArg_ParseTuple(args, "OOO!y#d", &records, &buckets, &StateType, &state,
			      &db, &db_len, &op_timeout)) {
		return -1;
	}
	self->records_tdb = tdb_api->context_slot(records);
	self->buckets_tdb = tdb_api->context_slot(buckets);
	if (self->records_tdb == NULL || self->buckets_tdb == NULL) {
		return -1;
	}
	Py_INCREF(records);
	Py_XSETREF(self->records, records);
	Py_INCREF(buckets);
	Py_XSETREF(self->buckets, buckets);
	Py_INCREF(state);
	Py_XSETREF(self->state, (State *)state);
	self->db_crc = layout_crc((const uint8_t *)db, db_len);
	self->op_timeout = op_timeout;
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
	errors = PyImport_ImportModule("dbwrap_py.adapters._tdb");
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
