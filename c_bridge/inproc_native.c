/*
 * Record operations on an adapter's native records (native_records.h):
 * the adapter does them in C, so they run with no GIL and no Python call.
 *
 * Usability needs no check here: a closed or broken adapter answers with
 * its own status (the tdb adapter's handle is cleared on close). Hold counts
 * are not kept: native locks nest within a process by contract.
 *
 * do_locked hands its callback a copy of the value, as Samba's
 * db_tdb_do_locked does: the adapter's own memory (tdb's mmap) may move
 * when the callback writes. Its stores then go straight to the adapter,
 * since deferring them would save no crossing.
 */

#include "inproc.h"

#include "locked_copy.h"
#include "log.h"

#define TDB_REPLACE_FLAG 1 /* tdb.h's TDB_REPLACE; 0 means the same */

bool inproc_native_bind(struct dbwrap_py_db *db, PyObject *adapter, bool *found)
{
	PyObject *capsule = PyObject_GetAttrString(adapter, "native_records");

	*found = false;
	if (capsule == NULL) {
		if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
			return false;
		}
		PyErr_Clear(); /* no native records: the Python methods it is */
		return true;
	}
	if (capsule == Py_None) { /* switched off (native_records=no) */
		Py_DECREF(capsule);
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
	*found = true;
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

static NTSTATUS native_fetch(struct dbwrap_py_db *db, TDB_DATA key,
			     dbwrap_py_value_fn fn, void *private_data)
{
	struct dbwrap_py_native_why why;
	uint32_t code = db->native->fetch(db->native_handle, key, fn,
					  private_data, &why);

	return code == 0 ? NT_STATUS_OK : native_failed(db, "fetch", code, &why);
}

static NTSTATUS native_lock(struct dbwrap_py_db *db, TDB_DATA key,
			    dbwrap_py_value_fn fn, void *private_data)
{
	struct dbwrap_py_native_why why;
	uint32_t code = db->native->lock_fetch(db->native_handle, key, fn,
					       private_data, &why);

	return code == 0 ? NT_STATUS_OK : native_failed(db, "lock", code, &why);
}

static NTSTATUS native_unlock(struct dbwrap_py_db *db, TDB_DATA key)
{
	struct dbwrap_py_native_why why;
	uint32_t code = db->native->unlock(db->native_handle, key, &why);

	return code == 0 ? NT_STATUS_OK : native_failed(db, "unlock", code, &why);
}

static NTSTATUS native_storev(struct dbwrap_py_db *db, TDB_DATA key,
			      const TDB_DATA *dbufs, int num_dbufs, int flag)
{
	struct dbwrap_py_native_why why;
	uint32_t code;

	if (flag != 0 && flag != TDB_REPLACE_FLAG) {
		return inproc_store_flagged(db, key, dbufs, num_dbufs, flag);
	}
	code = db->native->storev(db->native_handle, key, dbufs, num_dbufs, &why);
	return code == 0 ? NT_STATUS_OK : native_failed(db, "store", code, &why);
}

/* do_locked: lock and copy the value, fn, its store if any, unlock. */
static NTSTATUS native_locked(struct dbwrap_py_db *db, TDB_DATA key,
			      dbwrap_py_locked_fn fn, void *private_data)
{
	return dbwrap_py_locked_copying(&inproc_native_records, db, db->name, key,
					fn, private_data);
}

static NTSTATUS native_delete(struct dbwrap_py_db *db, TDB_DATA key)
{
	struct dbwrap_py_native_why why;
	uint32_t code = db->native->delete_rec(db->native_handle, key, &why);

	return code == 0 ? NT_STATUS_OK : native_failed(db, "delete", code, &why);
}

static NTSTATUS native_exists(struct dbwrap_py_db *db, TDB_DATA key, bool *exists)
{
	struct dbwrap_py_native_why why;
	uint32_t code = db->native->exists(db->native_handle, key, exists, &why);

	return code == 0 ? NT_STATUS_OK : native_failed(db, "exists", code, &why);
}

static NTSTATUS native_seqnum(struct dbwrap_py_db *db, int *seqnum)
{
	struct dbwrap_py_native_why why;
	uint32_t code = db->native->seqnum(db->native_handle, seqnum, &why);

	return code == 0 ? NT_STATUS_OK : native_failed(db, "seqnum", code, &why);
}

const struct dbwrap_py_record_ops inproc_native_records = {
	.name = "native",
	.defer_locked_stores = false,
	.fetch = native_fetch,
	.lock = native_lock,
	.unlock = native_unlock,
	.locked = native_locked,
	.storev = native_storev,
	.delete_rec = native_delete,
	.write_through = inproc_write_through,
	.exists = native_exists,
	.seqnum = native_seqnum,
};
