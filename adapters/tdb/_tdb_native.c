/*
 * The record operations for the bridge (c_core/native_records.h), which
 * calls them without the GIL and without a Python call. The capsule's
 * handle is the adapter itself, so an adapter that is closed answers with
 * its "closed" status while other opens of the same file go on.
 *
 * Failures come back as the NTSTATUS of the exception class the Python
 * methods would raise (the adapter's error map), so both paths answer alike.
 */

#include "_tdb.h"

#include <stdio.h>

#include "native_records.h"

/*
 * The context is read from self (tdb_records_tdb) where it is used rather
 * than kept in a local: fewer registers to save on the hot path.
 */

static uint32_t native_error(TdbRecords *self, const char *what,
			     struct dbwrap_py_native_why *why)
{
	struct tdb_context *tdb = tdb_records_tdb(self);
	int err;

	if (tdb == NULL) {
		snprintf(why->text, sizeof(why->text),
			 "%s: the database is closed", what);
		return self->closed_status;
	}
	err = (int)tdb_error(tdb);
	snprintf(why->text, sizeof(why->text), "%s: %s (tdb error %d)", what,
		 tdb_errorstr(tdb), err);
	return tdb_error_status(&self->file->map, err);
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
static inline uint32_t native_parse(TdbRecords *self, TDB_DATA key,
				    dbwrap_py_native_value_fn fn,
				    void *private_data,
				    struct dbwrap_py_native_why *why)
{
	struct native_parse p = { fn, private_data };

	if (tdb_parse_record(tdb_records_tdb(self), key, native_parser, &p) == 0) {
		return 0;
	}
	if (tdb_error(tdb_records_tdb(self)) == TDB_ERR_NOEXIST) {
		fn(tdb_null, false, private_data);
		return 0;
	}
	return native_error(self, "tdb_parse_record", why);
}

static uint32_t native_fetch(void *handle, TDB_DATA key,
			     dbwrap_py_native_value_fn fn, void *private_data,
			     struct dbwrap_py_native_why *why)
{
	TdbRecords *self = handle;

	if (tdb_records_tdb(self) == NULL) {
		return native_error(self, "tdb_parse_record", why);
	}
	return native_parse(self, key, fn, private_data, why);
}

static uint32_t native_lock_fetch(void *handle, TDB_DATA key,
				  dbwrap_py_native_value_fn fn,
				  void *private_data,
				  struct dbwrap_py_native_why *why)
{
	TdbRecords *self = handle;
	uint32_t status;

	if (tdb_records_tdb(self) == NULL ||
	    tdb_chainlock(tdb_records_tdb(self), key) != 0) {
		return native_error(self, "tdb_chainlock", why);
	}
	status = native_parse(self, key, fn, private_data, why);
	if (status != 0) {
		tdb_chainunlock(tdb_records_tdb(self), key);
	}
	return status;
}

static uint32_t native_unlock(void *handle, TDB_DATA key,
			      struct dbwrap_py_native_why *why)
{
	TdbRecords *self = handle;

	if (tdb_records_tdb(self) == NULL) {
		return native_error(self, "tdb_chainunlock", why);
	}
	if (tdb_chainunlock(tdb_records_tdb(self), key) == 0) {
		return 0;
	}
	/*
	 * A record locked before fork() and freed in the child: the child
	 * never held the lock (the Python path skips it by its hold count).
	 */
	if (tdb_error(tdb_records_tdb(self)) == TDB_ERR_LOCK) {
		return 0;
	}
	return native_error(self, "tdb_chainunlock", why);
}

static uint32_t native_storev(void *handle, TDB_DATA key, const TDB_DATA *dbufs,
			      int num_dbufs, struct dbwrap_py_native_why *why)
{
	TdbRecords *self = handle;

	if (tdb_records_tdb(self) == NULL ||
	    tdb_storev(tdb_records_tdb(self), key, dbufs, num_dbufs,
		       TDB_REPLACE) != 0) {
		return native_error(self, "tdb_storev", why);
	}
	return 0;
}

static uint32_t native_delete(void *handle, TDB_DATA key,
			      struct dbwrap_py_native_why *why)
{
	TdbRecords *self = handle;

	if (tdb_records_tdb(self) == NULL ||
	    tdb_delete(tdb_records_tdb(self), key) != 0) {
		return native_error(self, "tdb_delete", why);
	}
	return 0;
}

static uint32_t native_exists(void *handle, TDB_DATA key, bool *exists,
			      struct dbwrap_py_native_why *why)
{
	TdbRecords *self = handle;

	if (tdb_records_tdb(self) == NULL) {
		return native_error(self, "tdb_exists", why);
	}
	*exists = tdb_exists(tdb_records_tdb(self), key) == 1;
	return 0;
}

static uint32_t native_seqnum(void *handle, int *seqnum,
			      struct dbwrap_py_native_why *why)
{
	TdbRecords *self = handle;

	if (tdb_records_tdb(self) == NULL) {
		return native_error(self, "tdb_get_seqnum", why);
	}
	*seqnum = tdb_get_seqnum(tdb_records_tdb(self)) & 0x7FFFFFFF;
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

/* A capsule whose handle is self; it keeps self alive. */
PyObject *tdb_records_native_capsule(TdbRecords *self, PyObject *unused)
{
	PyObject *capsule = PyCapsule_New(self, DBWRAP_PY_NATIVE_RECORDS,
					  native_capsule_free);

	if (capsule == NULL) {
		return NULL;
	}
	Py_INCREF(self); /* before anything can free the capsule */
	if (PyCapsule_SetContext(capsule, (void *)&native_ops) != 0) {
		Py_DECREF(capsule);
		return NULL;
	}
	return capsule;
}
