/*
 * do_locked on a copy of the value (locked_copy.h).
 */

#include <string.h>

#include "locked_copy.h"
#include "log.h"

/* share-mode and g_lock records fit; larger values are copied to the heap */
#define LOCKED_COPY_INLINE 512

struct locked_copy {
	TDB_DATA value;
	bool found;
	bool copied;
	uint8_t inline_buf[LOCKED_COPY_INLINE];
};

static void locked_copy_value(TDB_DATA value, bool found, void *private_data)
{
	struct locked_copy *copy = private_data;

	copy->found = found;
	copy->value = (TDB_DATA) { copy->inline_buf, value.dsize };
	if (value.dsize > sizeof(copy->inline_buf)) {
		copy->value.dptr = talloc_memdup(NULL, value.dptr, value.dsize);
		copy->copied = (copy->value.dptr != NULL);
		return;
	}
	if (value.dsize > 0) {
		memcpy(copy->inline_buf, value.dptr, value.dsize);
	}
	copy->copied = true;
}

NTSTATUS dbwrap_py_locked_copying(const struct dbwrap_py_record_ops *ops,
				  struct dbwrap_py_db *db, const char *dbname,
				  TDB_DATA key, dbwrap_py_locked_fn fn,
				  void *private_data)
{
	struct locked_copy copy; /* not zeroed: the inline buffer need not be */
	const TDB_DATA *write;
	NTSTATUS status, unlocked;

	copy.value = tdb_null;
	copy.copied = false;
	status = ops->lock(db, key, locked_copy_value, &copy);
	if (!NT_STATUS_IS_OK(status)) {
		return status;
	}
	if (!copy.copied) {
		dbwrap_py_log(dbname, "lock", "out of memory for a %zu-byte value",
			      copy.value.dsize);
		status = NT_STATUS_NO_MEMORY;
	} else {
		write = fn(copy.value, copy.found, private_data);
		if (write != NULL) {
			status = ops->storev(db, key, write, 1, 0);
		}
	}
	if (copy.value.dptr != copy.inline_buf) {
		TALLOC_FREE(copy.value.dptr);
	}
	unlocked = ops->unlock(db, key);
	return NT_STATUS_IS_OK(status) ? unlocked : status;
}
