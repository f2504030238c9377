/*
 * The node cache's on-disk formats, as the C fast path reads them. The
 * Python side packs the same bytes (state.py: the agent's state file;
 * layout.py: local records and buckets); tests/python/test_node_cache_fastpath.py
 * checks that what one writes the other reads.
 */

#ifndef DBWRAP_PY_NODECACHE_LAYOUT_H
#define DBWRAP_PY_NODECACHE_LAYOUT_H

#include <stdint.h>
#include <string.h>
#include <zlib.h>

/* node.state: "<4sIIxxxxqdI4x64s", then the wanted table */
#define STATE_FILE "node.state"
#define STATE_MAGIC "DBWN"
#define STATE_SEQ 4
#define STATE_PID 8
#define STATE_LEASE 16
#define STATE_VALID_UNTIL 24 /* a double: CLOCK_MONOTONIC seconds */
#define STATE_STATUS 32      /* RUNNING, DRAINING, STOPPED */
#define STATE_NAME 40
#define STATE_NAME_SIZE 64
#define STATE_WANTED 128
#define STATE_WANTED_SLOTS 1024
#define STATE_WANTED_PROBES 16
#define STATE_SIZE (STATE_WANTED + 8 * STATE_WANTED_SLOTS)
#define STATE_RUNNING 0
#define STATE_STOPPED 2
#define WANTED_FREE 0
#define WANTED_BIT (UINT64_C(1) << 63)

/* a local record: "<qqB" (lease, token, flags), then the value */
#define LOCAL_HEADER 17
#define LOCAL_DELETED 1
#define LOCAL_VIA_BUCKET 2
#define LOCAL_IN_STORE 4
#define LOCAL_DETACHED 8

/* a bucket: "<qqI" (lease, token, key count), then each key as "<I" length + bytes */
#define BUCKET_HEADER 20
#define BUCKETS 256

struct local_header {
	int64_t lease;
	int64_t token;
	uint8_t flags;
};

static inline void local_header_unpack(const uint8_t *p, struct local_header *h)
{
	memcpy(&h->lease, p, 8);
	memcpy(&h->token, p + 8, 8);
	h->flags = p[16];
}

static inline void local_header_pack(const struct local_header *h, uint8_t *p)
{
	memcpy(p, &h->lease, 8);
	memcpy(p + 8, &h->token, 8);
	p[16] = h->flags;
}

/* zlib's CRC-32, as Python's zlib.crc32 */
static inline uint32_t layout_crc(const uint8_t *data, size_t len)
{
	return (uint32_t)crc32(0L, data, (uInt)len);
}

static inline unsigned bucket_of(const uint8_t *key, size_t len)
{
	return layout_crc(key, len) % BUCKETS;
}

static inline uint64_t record_hash(uint32_t db_crc, const uint8_t *key, size_t len)
{
	return ((uint64_t)db_crc << 32 | layout_crc(key, len)) | WANTED_BIT;
}

#endif /* DBWRAP_PY_NODECACHE_LAYOUT_H */
