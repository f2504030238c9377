/*
 * The hot record operations on an adapter's native records
 * (native_records.h): the same contract as inproc_records.c, but with no
 * GIL and no Python call, because the adapter does them in C.
 *
 * Usability needs no check here: a closed or broken adapter answers with
 * its own status (the tdb adapter's handle is cleared on close). Hold counts
 * are not kept: native locks nest within a process by contract.
 */

#include "inproc.h"

#include "log.h"

bool inproc_native_bind(struct dbwrap_py_db *db, PyObject *adapter)
{
	PyObject *capsule = PyObject_GetAttrString(adapter, "native_records");

	if (capsule == NULL) {
		if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
			return false;
		}
		PyErr_Clear(); /* no native records: the Python methods it is */
		return true;
	}
	if (!PyCapsule_IsValid(capsule, DBWRAP_PY_NATIVE_RECORDS)) {
		PyErr_Format(PyExc_TypeError, "adapter.native_records is not a %s capsule",
			     DBWRAP_PY_NATIVE_RECORDS);
		Py_DECREF(capsule);
		return false;
	}
	db->native_handle = PyCapsule_GetPointer(capsule, DBWRAP_PY_NATIVE_RECORDS);
	db->native = PyCapsule_GetContext(capsule);
	if (db->native_handle == NULL || db->native == NULL) {
		PyErr_SetString(PyExc_TypeError, "adapter.native_records is empty");
		Py_DECREF(capsule);
		db->native = NULL;
		return false;
	}
	db->native_capsule = capsule;
	return true;
}

/* One log line naming the database, the operation and the adapter's cause. */
static NTSTATUS native_failed(struct dbwrap_py_db *db, const char *op,
			      uint32_t code, const struct dbwrap_py_native_why *why)
{
	NTSTATUS status = NT_STATUS(code);
	int level = NT_STATUS_EQUAL(status, NT_STATUS_NOT_FOUND)
		? DBWRAP_PY_LOG_ROUTINE : DBWRAP_PY_LOG_ERROR;

	dbwrap_py_log_level(level, db->name, op, "%s (NTSTATUS 0x%08x)", why->text,
			    (unsigned)code);
	return status;
}

NTSTATUS inproc_native_fetch(struct dbwrap_py_db *db, TDB_DATA key,
			     dbwrap_py_value_fn fn, void *private_data)
{
	struct dbwrap_py_native_why why;
	uint32_t code = db->native->fetch(db->native_handle, key, fn,
					  private_data, &why);

	return code == 0 ? NT_STATUS_OK : native_failed(db, "fetch", code, &why);
}

NTSTATUS inproc_native_lock(struct dbwrap_py_db *db, TDB_DATA key,
			    dbwrap_py_value_fn fn, void *private_data)
{
	struct dbwrap_py_native_why why;
	uint32_t code = db->native->lock_fetch(db->native_handle, key, fn,
					       private_data, &why);

	return code == 0 ? NT_STATUS_OK : native_failed(db, "lock", code, &why);
}

NTSTATUS inproc_native_unlock(struct dbwrap_py_db *db, TDB_DATA key)
{
	struct dbwrap_py_native_why why;
	uint32_t code = db->native->unlock(db->native_handle, key, &why);

	return code == 0 ? NT_STATUS_OK : native_failed(db, "unlock", code, &why);
}

struct native_locked_state {
	dbwrap_py_locked_fn fn;
	void *private_data;
	const TDB_DATA *write;
};

static void native_locked_value(TDB_DATA value, bool found, void *private_data)
{
	struct native_locked_state *state = private_data;

	state->write = state->fn(value, found, state->private_data);
}

/* do_locked: fn runs on the value in place, its store goes before the unlock. */
NTSTATUS inproc_native_locked(struct dbwrap_py_db *db, TDB_DATA key,
			      dbwrap_py_locked_fn fn, void *private_data)
{
	struct native_locked_state state = { fn, private_data, NULL };
	struct dbwrap_py_native_why why;
	NTSTATUS status = NT_STATUS_OK, unlocked;
	uint32_t code;

	code = db->native->lock_fetch(db->native_handle, key, native_locked_value,
				      &state, &why);
	if (code != 0) {
		return native_failed(db, "lock", code, &why);
	}
	if (state.write != NULL) {
		code = db->native->store(db->native_handle, key, *state.write, &why);
		if (code != 0) {
			status = native_failed(db, "store+unlock", code, &why);
		}
	}
	/* the lock is released even when the store failed */
	unlocked = inproc_native_unlock(db, key);
	return NT_STATUS_IS_OK(status) ? unlocked : status;
}

/* A plain store on a locked record; several buffers are joined first. */
NTSTATUS inproc_native_store(struct dbwrap_py_db *db, TDB_DATA key,
			     const TDB_DATA *dbufs, int num_dbufs)
{
	struct dbwrap_py_native_why why;
	TDB_DATA value = (num_dbufs == 1) ? dbufs[0] : tdb_null;
	uint8_t *joined = NULL;
	size_t len = 0, off = 0;
	uint32_t code;
	int i;

	if (num_dbufs != 1) {
		for (i = 0; i < num_dbufs; i++) {
			len += dbufs[i].dsize;
		}
		joined = talloc_size(NULL, len > 0 ? len : 1);
		if (joined == NULL) {
			return NT_STATUS_NO_MEMORY;
		}
		for (i = 0; i < num_dbufs; i++) {
			if (dbufs[i].dsize > 0) {
				memcpy(joined + off, dbufs[i].dptr, dbufs[i].dsize);
				off += dbufs[i].dsize;
			}
		}
		value = (TDB_DATA) { joined, len };
	}
	code = db->native->store(db->native_handle, key, value, &why);
	TALLOC_FREE(joined);
	return code == 0 ? NT_STATUS_OK : native_failed(db, "store", code, &why);
}

NTSTATUS inproc_native_delete(struct dbwrap_py_db *db, TDB_DATA key)
{
	struct dbwrap_py_native_why why;
	uint32_t code = db->native->delete_rec(db->native_handle, key, &why);

	return code == 0 ? NT_STATUS_OK : native_failed(db, "delete", code, &why);
}

NTSTATUS inproc_native_exists(struct dbwrap_py_db *db, TDB_DATA key,
			      bool *exists)
{
	struct dbwrap_py_native_why why;
	uint32_t code = db->native->exists(db->native_handle, key, exists, &why);

	return code == 0 ? NT_STATUS_OK : native_failed(db, "exists", code, &why);
}

NTSTATUS inproc_native_seqnum(struct dbwrap_py_db *db, int *seqnum)
{
	struct dbwrap_py_native_why why;
	uint32_t code = db->native->seqnum(db->native_handle, seqnum, &why);

	return code == 0 ? NT_STATUS_OK : native_failed(db, "seqnum", code, &why);
}
