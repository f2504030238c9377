/*
 * Message bodies of the proxy protocol (proxy_wire.h): little-endian
 * integers and length-prefixed byte strings.
 */

#include <string.h>

#include "proxy_wire.h"

const char *proxy_op_name(enum proxy_op op)
{
	static const char *const names[] = {
		[PROXY_HELLO] = "hello", [PROXY_OPEN] = "open",
		[PROXY_CLOSE] = "close", [PROXY_FETCH] = "fetch",
		[PROXY_LOCK] = "lock", [PROXY_UNLOCK] = "unlock",
		[PROXY_STORE] = "store", [PROXY_DELETE] = "delete",
		[PROXY_EXISTS] = "exists", [PROXY_SEQNUM] = "seqnum",
		[PROXY_TRAVERSE_START] = "traverse",
		[PROXY_TRAVERSE_NEXT] = "traverse",
		[PROXY_TRAVERSE_END] = "traverse",
		[PROXY_TRANSACTION] = "transaction", [PROXY_WIPE] = "wipe",
		[PROXY_CHECK] = "check", [PROXY_DB_ID] = "db_id",
		[PROXY_NODE_CACHE] = "node_cache",
		[PROXY_MOVE_IN] = "move_in", [PROXY_HAND_OVER] = "hand_over",
		[PROXY_WRITE_THROUGH] = "write_through",
	};

	if ((size_t)op < sizeof(names) / sizeof(names[0]) && names[op] != NULL) {
		return names[op];
	}
	return "?";
}

uint16_t proxy_op_version(enum proxy_op op)
{
	switch (op) {
	case PROXY_NODE_CACHE:
	case PROXY_MOVE_IN:
	case PROXY_HAND_OVER:
		return PROXY_FAST_PATH_VERSION;
	case PROXY_WRITE_THROUGH:
		return PROXY_WRITE_THROUGH_VERSION;
	default:
		return PROXY_MIN_VERSION;
	}
}

/* -- writer ----------------------------------------------------------------- */

static uint8_t *proxy_reserve(struct proxy_writer *w, size_t n)
{
	size_t want = w->len + n, have;
	uint8_t *grown;

	if (w->failed || want - 4 > PROXY_MAX_MESSAGE || want < w->len) {
		w->failed = true;
		return NULL;
	}
	have = talloc_get_size(w->buf);
	if (want > have) {
		have = (want > 2 * have) ? want : 2 * have;
		grown = talloc_realloc(NULL, w->buf, uint8_t, have);
		if (grown == NULL) {
			w->failed = true;
			return NULL;
		}
		w->buf = grown;
	}
	w->len = want;
	return w->buf + want - n;
}

static void proxy_put_le(struct proxy_writer *w, uint64_t v, size_t n)
{
	uint8_t *p = proxy_reserve(w, n);
	size_t i;

	for (i = 0; p != NULL && i < n; i++) {
		p[i] = (uint8_t)(v >> (8 * i));
	}
}

void proxy_writer_request(struct proxy_writer *w, TALLOC_CTX *mem_ctx,
			  enum proxy_op op, uint32_t db)
{
	*w = (struct proxy_writer) {
		.buf = talloc_array(mem_ctx, uint8_t, 256),
		.len = 0,
	};
	w->failed = (w->buf == NULL);
	proxy_put_u32(w, 0); /* the length, set by proxy_writer_finish */
	proxy_put_u8(w, (uint8_t)op);
	proxy_put_u8(w, 0);
	proxy_put_u16(w, 0);
	proxy_put_u32(w, db);
}

void proxy_put_u8(struct proxy_writer *w, uint8_t v) { proxy_put_le(w, v, 1); }
void proxy_put_u16(struct proxy_writer *w, uint16_t v) { proxy_put_le(w, v, 2); }
void proxy_put_u32(struct proxy_writer *w, uint32_t v) { proxy_put_le(w, v, 4); }
void proxy_put_u64(struct proxy_writer *w, uint64_t v) { proxy_put_le(w, v, 8); }

void proxy_put_bytesv(struct proxy_writer *w, const TDB_DATA *v, int num)
{
	size_t total = 0;
	uint8_t *p;
	int i;

	for (i = 0; i < num; i++) {
		total += v[i].dsize;
		if (total > PROXY_MAX_MESSAGE) {
			w->failed = true;
			return;
		}
	}
	proxy_put_u32(w, (uint32_t)total);
	p = proxy_reserve(w, total);
	for (i = 0; p != NULL && i < num; i++) {
		if (v[i].dsize > 0) {
			memcpy(p, v[i].dptr, v[i].dsize);
			p += v[i].dsize;
		}
	}
}

void proxy_put_bytes(struct proxy_writer *w, TDB_DATA v)
{
	proxy_put_bytesv(w, &v, 1);
}

void proxy_put_str(struct proxy_writer *w, const char *s)
{
	TDB_DATA v = { (uint8_t *)s, strlen(s) };

	proxy_put_bytes(w, v);
}

bool proxy_writer_finish(struct proxy_writer *w)
{
	uint32_t body = (uint32_t)(w->len - 4);
	size_t i;

	if (w->failed) {
		return false;
	}
	for (i = 0; i < 4; i++) {
		w->buf[i] = (uint8_t)(body >> (8 * i));
	}
	return true;
}

/* -- reader ----------------------------------------------------------------- */

void proxy_reader_init(struct proxy_reader *r, const uint8_t *body, size_t len)
{
	*r = (struct proxy_reader) { .at = body, .left = len };
}

static const uint8_t *proxy_take(struct proxy_reader *r, size_t n)
{
	const uint8_t *p = r->at;

	if (r->failed || n > r->left) {
		r->failed = true;
		return NULL;
	}
	r->at += n;
	r->left -= n;
	return p;
}

static uint64_t proxy_get_le(struct proxy_reader *r, size_t n)
{
	const uint8_t *p = proxy_take(r, n);
	uint64_t v = 0;
	size_t i;

	for (i = 0; p != NULL && i < n; i++) {
		v |= (uint64_t)p[i] << (8 * i);
	}
	return v;
}

uint8_t proxy_get_u8(struct proxy_reader *r) { return (uint8_t)proxy_get_le(r, 1); }
uint16_t proxy_get_u16(struct proxy_reader *r) { return (uint16_t)proxy_get_le(r, 2); }
uint32_t proxy_get_u32(struct proxy_reader *r) { return (uint32_t)proxy_get_le(r, 4); }
uint64_t proxy_get_u64(struct proxy_reader *r) { return proxy_get_le(r, 8); }

TDB_DATA proxy_get_bytes(struct proxy_reader *r)
{
	uint32_t len = proxy_get_u32(r);
	const uint8_t *p = proxy_take(r, len);

	/* a zero-length value still gets a non-NULL pointer: callers tell */
	return (p != NULL) ? (TDB_DATA) { (uint8_t *)p, len } : (TDB_DATA) { 0 };
}

TDB_DATA proxy_get_opt(struct proxy_reader *r, bool *present)
{
	uint8_t flag = proxy_get_u8(r);

	if (flag > 1) {
		r->failed = true;
	}
	*present = (flag == 1) && !r->failed;
	return *present ? proxy_get_bytes(r) : (TDB_DATA) { 0 };
}

bool proxy_reader_done(const struct proxy_reader *r)
{
	return !r->failed && r->left == 0;
}
