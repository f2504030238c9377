/*
 * The proxy protocol's C side: the constants of python/dbwrap_py/proxy/wire.py
 * (which describes the format) and a reader and writer of message bodies.
 * tests/python/test_proxy_wire.py checks that the two agree.
 *
 * A writer grows a talloc buffer with a 4-byte length in front; a reader
 * walks a received body and fails, never reads past it, when a field runs
 * short.
 */

#ifndef DBWRAP_PY_PROXY_WIRE_H
#define DBWRAP_PY_PROXY_WIRE_H

#include "samba_abi.h"

#define PROXY_MAGIC 0x50574244u /* "DBWP" as a little-endian u32 */
#define PROXY_VERSION 3
#define PROXY_MIN_VERSION 1
#define PROXY_FAST_PATH_VERSION 2 /* the first with NODE_CACHE, MOVE_IN, HAND_OVER */
#define PROXY_WRITE_THROUGH_VERSION 3 /* the first with WRITE_THROUGH */
/*
 * The largest message body, either way: requests this process builds, and
 * replies it takes. A daemon's HELLO may advertise less, never more: a
 * reply's length is allocated before its body arrives, so a daemon that
 * could raise this (up to 4 GiB in a u32) could make each smbd process
 * allocate that much on its say-so. 64 MiB is far above any record smbd
 * stores (share modes, leases and byte-range locks are kilobytes) and a
 * bounded cost per process. proxy_conn.c refuses a HELLO over it;
 * python/dbwrap_py/proxy/wire.py's MAX_MESSAGE is the same number.
 */
#define PROXY_MAX_MESSAGE (64u * 1024 * 1024)
#define PROXY_REQUEST_HEADER 8 /* u8 op, u8 0, u16 0, u32 db */
#define PROXY_WAIT_FOREVER 0xFFFFFFFFu /* LOCK's wait_ms: unbounded (never sent here) */

enum proxy_op {
	PROXY_HELLO = 1,
	PROXY_OPEN = 2,
	PROXY_CLOSE = 3,
	PROXY_FETCH = 4,
	PROXY_LOCK = 5,
	PROXY_UNLOCK = 6,
	PROXY_STORE = 7,
	PROXY_DELETE = 8,
	PROXY_EXISTS = 9,
	PROXY_SEQNUM = 10,
	PROXY_TRAVERSE_START = 11,
	PROXY_TRAVERSE_NEXT = 12,
	PROXY_TRAVERSE_END = 13,
	PROXY_TRANSACTION = 14,
	PROXY_WIPE = 15,
	PROXY_CHECK = 16,
	PROXY_DB_ID = 17,
	PROXY_NODE_CACHE = 18,
	PROXY_MOVE_IN = 19,
	PROXY_HAND_OVER = 20,
	PROXY_WRITE_THROUGH = 21,
};

enum proxy_txn {
	PROXY_TXN_START = 0,
	PROXY_TXN_START_NONBLOCK = 1,
	PROXY_TXN_COMMIT = 2,
	PROXY_TXN_CANCEL = 3,
};

const char *proxy_op_name(enum proxy_op op);
/* The first protocol version that has op (wire.py's OP_VERSION). */
uint16_t proxy_op_version(enum proxy_op op);

/* A message being built: 4-byte length, then the body. */
struct proxy_writer {
	uint8_t *buf; /* talloc */
	size_t len;
	bool failed;  /* out of memory, or past PROXY_MAX_MESSAGE */
};

/* A request's header; the writer's buffer is a talloc child of mem_ctx. */
void proxy_writer_request(struct proxy_writer *w, TALLOC_CTX *mem_ctx,
			  enum proxy_op op, uint32_t db);
void proxy_put_u8(struct proxy_writer *w, uint8_t v);
void proxy_put_u16(struct proxy_writer *w, uint16_t v);
void proxy_put_u32(struct proxy_writer *w, uint32_t v);
void proxy_put_u64(struct proxy_writer *w, uint64_t v);
void proxy_put_bytes(struct proxy_writer *w, TDB_DATA v);
/* Buffers joined into one bytes field, without joining them first. */
void proxy_put_bytesv(struct proxy_writer *w, const TDB_DATA *v, int num);
void proxy_put_str(struct proxy_writer *w, const char *s);
/* Sets the length in front; false if the writer failed. */
bool proxy_writer_finish(struct proxy_writer *w);

/* A received body. */
struct proxy_reader {
	const uint8_t *at;
	size_t left;
	bool failed;
};

void proxy_reader_init(struct proxy_reader *r, const uint8_t *body, size_t len);
uint8_t proxy_get_u8(struct proxy_reader *r);
uint16_t proxy_get_u16(struct proxy_reader *r);
uint32_t proxy_get_u32(struct proxy_reader *r);
uint64_t proxy_get_u64(struct proxy_reader *r);
/* Points into the body: valid while the body is. */
TDB_DATA proxy_get_bytes(struct proxy_reader *r);
/* An optional value: *present false for absent. */
TDB_DATA proxy_get_opt(struct proxy_reader *r, bool *present);
/* true when every field was there and nothing is left over. */
bool proxy_reader_done(const struct proxy_reader *r);

#endif /* DBWRAP_PY_PROXY_WIRE_H */
