/* Joining a storev's buffers into one value (buffers.h). */

#include <string.h>

#include "buffers.h"

uint8_t *dbwrap_py_join(const TDB_DATA *dbufs, int num_dbufs,
			dbwrap_py_alloc_fn alloc, void *alloc_ctx, size_t *len)
{
	size_t total = 0, off = 0;
	uint8_t *dst;
	int i;

	for (i = 0; i < num_dbufs; i++) {
		if (total + dbufs[i].dsize < total) {
			return NULL;
		}
		total += dbufs[i].dsize;
	}
	dst = alloc(alloc_ctx, total);
	if (dst == NULL) {
		return NULL;
	}
	for (i = 0; i < num_dbufs; i++) {
		if (dbufs[i].dsize != 0) {
			memcpy(dst + off, dbufs[i].dptr, dbufs[i].dsize);
			off += dbufs[i].dsize;
		}
	}
	*len = total;
	return dst;
}
