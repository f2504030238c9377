/* A plain store made inside do_locked, kept until the unlock (deferred_store.h). */

#include <string.h>

#include "buffers.h"
#include "deferred_store.h"

static uint8_t *deferred_alloc(void *alloc_ctx, size_t len)
{
	struct dbwrap_py_deferred *d = alloc_ctx;

	if (len <= sizeof(d->inline_buf)) {
		return d->inline_buf;
	}
	return talloc_size(d->mem_ctx, len);
}

void dbwrap_py_deferred_init(struct dbwrap_py_deferred *d, TDB_DATA key,
			     struct dbwrap_py_deferred *outer, TALLOC_CTX *mem_ctx)
{
	d->key = key;
	d->value = tdb_null;
	d->pending = false;
	d->outer = outer;
	d->mem_ctx = mem_ctx;
}

void dbwrap_py_deferred_clear(struct dbwrap_py_deferred *d)
{
	if (d->value.dptr != d->inline_buf) {
		TALLOC_FREE(d->value.dptr);
	}
	d->value = tdb_null;
	d->pending = false;
}

NTSTATUS dbwrap_py_deferred_set(struct dbwrap_py_deferred *d,
				const TDB_DATA *dbufs, int num_dbufs)
{
	size_t len;
	uint8_t *joined;

	dbwrap_py_deferred_clear(d);
	joined = dbwrap_py_join(dbufs, num_dbufs, deferred_alloc, d, &len);
	if (joined == NULL) {
		return NT_STATUS_NO_MEMORY;
	}
	d->value = (TDB_DATA) { joined, len };
	d->pending = true;
	return NT_STATUS_OK;
}

bool dbwrap_py_deferred_is_for(const struct dbwrap_py_deferred *d, TDB_DATA key)
{
	return d != NULL && d->key.dsize == key.dsize &&
	       (d->key.dptr == key.dptr || memcmp(d->key.dptr, key.dptr, key.dsize) == 0);
}
