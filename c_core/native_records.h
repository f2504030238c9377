/*
 * Record operations an adapter may offer in C, so that the bridge runs the
 * hot path (fetch, lock, unlock, store, delete, exists, seqnum) without the
 * GIL or a Python call.
 *
 * Version 2: the store takes the storev's buffers, which tdb_storev writes
 * without joining them first.
 *
 * An adapter offers them by having an attribute `native_records`: a
 * PyCapsule named DBWRAP_PY_NATIVE_RECORDS whose pointer is the adapter's
 * own handle and whose context is a `const struct dbwrap_py_native_records *`.
 * The capsule keeps the handle alive. The bridge then calls these instead
 * of the adapter's Python methods, with no GIL held; everything else still
 * goes through Python.
 *
 * The operations must be safe without the GIL and must follow the adapter's
 * Python contract exactly: locks exclude other processes, nest within this
 * process (a second lock of a held key succeeds, as tdb's chainlocks do),
 * and die with the process. Each returns 0 or an NTSTATUS code, with a
 * message for the log line in `why`.
 *
 * This header is shared by c_bridge/ and adapters' C extensions; it needs
 * only tdb.h's TDB_DATA.
 */

#ifndef DBWRAP_PY_NATIVE_RECORDS_H
#define DBWRAP_PY_NATIVE_RECORDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <tdb.h>

#define DBWRAP_PY_NATIVE_RECORDS "dbwrap_py.native_records.v2"

/* Gets the value, valid only during the call; found=false for a missing key. */
typedef void (*dbwrap_py_native_value_fn)(TDB_DATA value, bool found,
					  void *private_data);

struct dbwrap_py_native_why {
	char text[160];
};

struct dbwrap_py_native_records {
	/* Read without locking. */
	uint32_t (*fetch)(void *handle, TDB_DATA key, dbwrap_py_native_value_fn fn,
			  void *private_data, struct dbwrap_py_native_why *why);
	/* Lock the record, then read it; not locked on failure. */
	uint32_t (*lock_fetch)(void *handle, TDB_DATA key,
			       dbwrap_py_native_value_fn fn, void *private_data,
			       struct dbwrap_py_native_why *why);
	uint32_t (*unlock)(void *handle, TDB_DATA key,
			   struct dbwrap_py_native_why *why);
	/* Store a locked record (replace); the buffers form one value. */
	uint32_t (*storev)(void *handle, TDB_DATA key, const TDB_DATA *dbufs,
			   int num_dbufs, struct dbwrap_py_native_why *why);
	/* Delete a locked record; NT_STATUS_NOT_FOUND for a missing key. */
	uint32_t (*delete_rec)(void *handle, TDB_DATA key,
			       struct dbwrap_py_native_why *why);
	uint32_t (*exists)(void *handle, TDB_DATA key, bool *exists,
			   struct dbwrap_py_native_why *why);
	/* A number in 0..2^31-1 that changes on every committed write. */
	uint32_t (*seqnum)(void *handle, int *seqnum,
			   struct dbwrap_py_native_why *why);
};

#endif /* DBWRAP_PY_NATIVE_RECORDS_H */
