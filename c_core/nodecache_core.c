/*
 * The node cache's local rules in C without Python (nodecache_core.h): one
 * owner for the extension and the bridge alike.
 *
 * The rules, for one database's local tdb files:
 *   - a local record is the node's while its lease is the live one, its
 *     token is newer than the database's last wipe, and it is not detached;
 *   - a key of a bucket the node holds that is neither in the local records
 *     nor among the keys the store had at the claim does not exist;
 *   - a record lock stands on the local record's header: a lock on a
 *     record the node has no copy of writes one (a placeholder, deleted),
 *     and every write under the lock is fenced on that header's lease.
 */

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <talloc.h>
#include <time.h>
#include <unistd.h>

#include "nodecache_core.h"

#define RECHECK_SECONDS 0.5

struct state_header {
	int64_t lease;
	double valid_until;
	uint32_t status;
	uint32_t pid;
	char name[STATE_NAME_SIZE + 1];
};

static double monotonic_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

uint32_t nc_why(struct dbwrap_py_native_why *why, uint32_t status, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why->text, sizeof(why->text), fmt, ap);
	va_end(ap);
	return status;
}

static uint32_t closed_why(struct dbwrap_py_native_why *why)
{
	return nc_why(why, NC_NT_DEVICE_NOT_READY, "the node cache is closed");
}

/* -- the agent's state file -------------------------------------------------------- */

void nc_state_unmap(struct nc_state *st)
{
	if (st->map != NULL) {
		munmap((void *)st->map, STATE_SIZE);
		st->map = NULL;
		st->inode = 0;
	}
}

/* Map the file again if the agent replaced it (a restart); true if it did. */
static bool state_remap(struct nc_state *st)
{
	struct stat s;
	void *map;
	int fd = open(st->path, O_RDONLY | O_CLOEXEC);

	if (fd < 0) {
		return false;
	}
	if (fstat(fd, &s) != 0 || s.st_ino == st->inode || s.st_size < STATE_SIZE) {
		close(fd);
		return false;
	}
	map = mmap(NULL, STATE_SIZE, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (map == MAP_FAILED) {
		return false;
	}
	nc_state_unmap(st);
	st->map = map;
	st->inode = s.st_ino;
	return true;
}

/* <dir>/node.state; 0, or ENOMEM. Mapped now, while smbd is still root. */
int nc_state_open(struct nc_state *st, const char *dir)
{
	char *path = malloc(strlen(dir) + sizeof("/" STATE_FILE));

	if (path == NULL) {
		return ENOMEM;
	}
	strcpy(path, dir);
	strcat(path, "/" STATE_FILE);
	free(st->path);
	st->path = path;
	nc_state_unmap(st);
	state_remap(st);
	return 0;
}

void nc_state_close(struct nc_state *st)
{
	nc_state_unmap(st);
	free(st->path);
	st->path = NULL;
}

/* A consistent copy: retried while the agent writes (an odd counter). */
static bool state_header(const uint8_t *map, struct state_header *h)
{
	int attempt;

	for (attempt = 0; attempt < 100000; attempt++) {
		uint32_t seq = __atomic_load_n((const uint32_t *)(map + STATE_SEQ), __ATOMIC_ACQUIRE);

		if ((seq & 1) == 0 && memcmp(map, STATE_MAGIC, 4) == 0) {
			memcpy(&h->lease, map + STATE_LEASE, 8);
			memcpy(&h->valid_until, map + STATE_VALID_UNTIL, 8);
			memcpy(&h->status, map + STATE_STATUS, 4);
			memcpy(&h->pid, map + STATE_PID, 4);
			memcpy(h->name, map + STATE_NAME, STATE_NAME_SIZE);
			h->name[STATE_NAME_SIZE] = '\0';
			__atomic_thread_fence(__ATOMIC_ACQUIRE);
			if (__atomic_load_n((const uint32_t *)(map + STATE_SEQ), __ATOMIC_RELAXED) == seq) {
				return true;
			}
		}
		if (attempt > 8) {
			sched_yield(); /* the agent was descheduled mid-write: let it finish */
		}
	}
	return false;
}

/* The node lease while it is surely alive (0 if not), and the agent's status. */
int64_t nc_state_live(struct nc_state *st, uint32_t *status)
{
	struct state_header h = { .lease = 0, .status = STATE_STOPPED };
	double now = monotonic_now();

	if (st->map == NULL || !state_header(st->map, &h) || now >= h.valid_until) {
		if (now >= st->next_check) {
			st->next_check = now + RECHECK_SECONDS;
			if (state_remap(st) && state_header(st->map, &h) && now < h.valid_until) {
				*status = h.status;
				return h.lease;
			}
		}
		*status = (st->map != NULL && state_header(st->map, &h)) ? h.status : STATE_STOPPED;
		return 0;
	}
	*status = h.status;
	return h.lease;
}

/* The lease (and node name) to take new records under: a running agent's, else 0 and "". */
int64_t nc_state_current(struct nc_state *st, char name[STATE_NAME_SIZE + 1])
{
	struct state_header h;
	uint32_t status;
	int64_t lease = nc_state_live(st, &status);

	if (lease == 0 || status != STATE_RUNNING || !state_header(st->map, &h)) {
		name[0] = '\0';
		return 0;
	}
	memcpy(name, h.name, sizeof(h.name));
	return lease;
}

/* Whether an agent serves the directory (not before the first, nor after one stopped). */
bool nc_state_configured(struct nc_state *st)
{
	struct state_header h;

	if (st->map == NULL && !state_remap(st)) {
		return false;
	}
	if (state_header(st->map, &h) && h.status == STATE_STOPPED) {
		state_remap(st); /* a new agent may have replaced the file */
	}
	return state_header(st->map, &h) && h.status != STATE_STOPPED;
}

void nc_state_node_name(struct nc_state *st, char name[STATE_NAME_SIZE + 1])
{
	struct state_header h;

	if ((st->map == NULL && !state_remap(st)) || !state_header(st->map, &h)) {
		name[0] = '\0';
		return;
	}
	memcpy(name, h.name, sizeof(h.name));
}

uint32_t nc_state_agent_pid(struct nc_state *st)
{
	struct state_header h;

	state_remap(st);
	if (st->map == NULL || !state_header(st->map, &h)) {
		return 0;
	}
	return h.pid;
}

static bool state_wanted(const struct nc_state *st, uint64_t hash)
{
	unsigned start = (unsigned)(hash % STATE_WANTED_SLOTS), i;

	if (st->map == NULL) {
		return false;
	}
	for (i = 0; i < STATE_WANTED_PROBES; i++) {
		const uint64_t *slot = (const uint64_t *)(st->map + STATE_WANTED) +
				       (start + i) % STATE_WANTED_SLOTS;
		uint64_t value = __atomic_load_n(slot, __ATOMIC_RELAXED);

		if (value == hash) {
			return true;
		}
		if (value == WANTED_FREE) {
			return false;
		}
	}
	return false;
}

/* Does another node wait for db's key? */
bool nc_state_wanted(const struct nc_state *st, TDB_DATA db, TDB_DATA key)
{
	return state_wanted(st, record_hash(layout_crc(db.dptr, db.dsize), key.dptr, key.dsize));
}

/* -- the rules ---------------------------------------------------------------------- */

void nc_records_init(struct nc_records *rec, struct tdb_context *const *records_tdb,
		     struct tdb_context *const *buckets_tdb, struct nc_state *state,
		     TDB_DATA db, double op_timeout)
{
	rec->records_tdb = records_tdb;
	rec->buckets_tdb = buckets_tdb;
	rec->state = state;
	rec->db_crc = layout_crc(db.dptr, db.dsize);
	rec->op_timeout = op_timeout;
}

struct classify_state {
	const struct nc_records *rec;
	int64_t lease;
	dbwrap_py_native_value_fn fn; /* called with a valid record's value, or NULL */
	void *private_data;
	bool valid;
	struct local_header header;
};

/* The local record, if the node owns it now (the first rule). */
static int classify_parser(TDB_DATA key, TDB_DATA data, void *private_data)
{
	struct classify_state *c = private_data;
	struct local_header h;

	if (data.dsize < LOCAL_HEADER) {
		return 0; /* not ours: written by nobody we know */
	}
	local_header_unpack(data.dptr, &h);
	c->header = h;
	c->valid = h.lease == c->lease && h.token > c->rec->wipe_revision &&
		   !(h.flags & LOCAL_DETACHED);
	if (c->valid && c->fn != NULL) {
		TDB_DATA value = { data.dptr + LOCAL_HEADER, data.dsize - LOCAL_HEADER };

		c->fn(value, !(h.flags & LOCAL_DELETED), c->private_data);
	}
	return 0;
}

struct bucket_state {
	int64_t lease, wipe_revision;
	TDB_DATA key;
	bool ours;      /* a bucket the node holds under the lease */
	bool stored;    /* the key was in the store at the claim */
	int64_t token;
};

static int bucket_parser(TDB_DATA bkey, TDB_DATA data, void *private_data)
{
	struct bucket_state *b = private_data;
	int64_t lease, token;
	uint32_t count, i, len;
	size_t off = BUCKET_HEADER;

	if (data.dsize < BUCKET_HEADER) {
		return 0;
	}
	memcpy(&lease, data.dptr, 8);
	memcpy(&token, data.dptr + 8, 8);
	memcpy(&count, data.dptr + 16, 4);
	b->ours = lease == b->lease && token > b->wipe_revision;
	b->token = token;
	for (i = 0; b->ours && i < count && off + 4 <= data.dsize; i++) {
		memcpy(&len, data.dptr + off, 4);
		off += 4;
		if (off + len > data.dsize) {
			break;
		}
		if (len == b->key.dsize && memcmp(data.dptr + off, b->key.dptr, len) == 0) {
			b->stored = true;
			break;
		}
		off += len;
	}
	return 0;
}

static TDB_DATA bucket_key(unsigned number, char *buf, size_t size)
{
	int len = snprintf(buf, size, "%u", number);

	return (TDB_DATA) { (uint8_t *)buf, (size_t)len };
}

/* The node's bucket holding key, if any: its token, and whether the key was in the store. */
bool nc_bucket_holds(const struct nc_records *rec, TDB_DATA key, int64_t lease,
		     int64_t *token, bool *stored)
{
	struct tdb_context *tdb = *rec->buckets_tdb;
	struct bucket_state b = { .lease = lease, .wipe_revision = rec->wipe_revision, .key = key };
	char buf[16];

	if (tdb == NULL) {
		return false;
	}
	(void)tdb_parse_record(tdb, bucket_key(bucket_of(key.dptr, key.dsize), buf, sizeof(buf)),
			       bucket_parser, &b);
	*token = b.token;
	*stored = b.stored;
	return b.ours;
}

/*
 * What the node owns of key under lease: its record (fn gets the value), a
 * new key of its bucket (header: the bucket's token), or nothing.
 */
enum nc_owned nc_classify(const struct nc_records *rec, TDB_DATA key, int64_t lease,
			  dbwrap_py_native_value_fn fn, void *private_data,
			  struct local_header *header)
{
	struct tdb_context *tdb = *rec->records_tdb;
	struct classify_state c = { .rec = rec, .lease = lease, .fn = fn,
				    .private_data = private_data };
	int64_t token;
	bool stored, found;

	if (tdb == NULL) {
		return NC_OWNED_NONE;
	}
	found = tdb_parse_record(tdb, key, classify_parser, &c) == 0;
	if (c.valid) {
		*header = c.header;
		return NC_OWNED_RECORD;
	}
	if (found && c.header.lease == lease && (c.header.flags & LOCAL_DETACHED)) {
		return NC_OWNED_NONE; /* out of the node's bucket for good */
	}
	if (!nc_bucket_holds(rec, key, lease, &token, &stored) || stored) {
		return NC_OWNED_NONE;
	}
	*header = (struct local_header) { lease, token, LOCAL_VIA_BUCKET | LOCAL_DELETED };
	return NC_OWNED_FRESH;
}

/* Store header + value (the buffers) as key's local record. */
static int keep_local(const struct nc_records *rec, TDB_DATA key, const struct local_header *h,
		  const TDB_DATA *dbufs, int num_dbufs)
{
	struct tdb_context *tdb = *rec->records_tdb;
	uint8_t packed[LOCAL_HEADER];
	TDB_DATA stack[8], *bufs = stack;
	int i, ret;

	if (tdb == NULL) {
		errno = EBADF;
		return -1;
	}
	if (num_dbufs + 1 > (int)(sizeof(stack) / sizeof(stack[0]))) {
		bufs = malloc(sizeof(TDB_DATA) * (num_dbufs + 1));
		if (bufs == NULL) {
			return -1;
		}
	}
	local_header_pack(h, packed);
	bufs[0] = (TDB_DATA) { packed, LOCAL_HEADER };
	for (i = 0; i < num_dbufs; i++) {
		bufs[i + 1] = dbufs[i];
	}
	ret = tdb_storev(tdb, key, bufs, num_dbufs + 1, TDB_REPLACE);
	if (bufs != stack) {
		free(bufs);
	}
	return ret;
}

/*
 * What a lock on key stands on, under lease (chainlock held): the record the
 * node owns, or for a new key of its bucket the placeholder written now.
 * NC_OWNED_NONE: the record must be moved in. -1: the store failed.
 */
int nc_stand(const struct nc_records *rec, TDB_DATA key, int64_t lease,
	     dbwrap_py_native_value_fn fn, void *private_data, struct local_header *h)
{
	enum nc_owned kind = nc_classify(rec, key, lease, fn, private_data, h);

	if (kind == NC_OWNED_FRESH) {
		if (keep_local(rec, key, h, NULL, 0) != 0) {
			return -1;
		}
		if (fn != NULL) {
			fn(tdb_null, false, private_data);
		}
	}
	return kind;
}

/* The header a lock stands on (read under the lock). */
static int header_parser(TDB_DATA key, TDB_DATA data, void *private_data)
{
	struct local_header *h = private_data;

	if (data.dsize >= LOCAL_HEADER) {
		local_header_unpack(data.dptr, h);
	}
	return 0;
}

/*
 * The third rule: a write under a lock stands on the local header, written
 * when the lock was taken; its lease must be proved live. A late keepalive
 * only delays the write; an ended lease fences it.
 */
enum nc_fence nc_fence(const struct nc_records *rec, TDB_DATA key, struct local_header *h)
{
	struct tdb_context *tdb = *rec->records_tdb;
	double deadline = monotonic_now() + rec->op_timeout;
	struct timespec pause = { 0, 5 * 1000 * 1000 };
	uint32_t status;

	h->lease = 0;
	if (tdb == NULL || tdb_parse_record(tdb, key, header_parser, h) != 0 || h->lease == 0) {
		return NC_FENCE_NOT_LOCKED;
	}
	for (;;) {
		int64_t lease = nc_state_live(rec->state, &status);

		if (lease == h->lease) {
			return NC_FENCE_OK;
		}
		if (lease != 0 || monotonic_now() >= deadline) {
			return NC_FENCE_GONE;
		}
		nanosleep(&pause, NULL);
	}
}

/* A record moved in, as the local copy; no value: deleted, unless detached. */
int nc_keep(const struct nc_records *rec, TDB_DATA key, int64_t lease, int64_t token,
	    uint8_t flags, const TDB_DATA *value)
{
	struct local_header h = { lease, token, flags };

	if (value == NULL && !(flags & LOCAL_DETACHED)) {
		h.flags |= LOCAL_DELETED;
	}
	return keep_local(rec, key, &h, value, value != NULL ? 1 : 0);
}

/*
 * A write (no value: a delete) on the header nc_fence passed; in_store: 0
 * or 1 sets LOCAL_IN_STORE, -1 leaves it. *existed: the record was there.
 */
int nc_write_fenced(const struct nc_records *rec, TDB_DATA key, struct local_header *h,
		    const TDB_DATA *value, int in_store, bool *existed)
{
	*existed = !(h->flags & LOCAL_DELETED);
	h->flags = value == NULL ? (h->flags | LOCAL_DELETED) : (h->flags & ~LOCAL_DELETED);
	if (in_store >= 0) {
		h->flags = in_store ? (h->flags | LOCAL_IN_STORE) : (h->flags & ~LOCAL_IN_STORE);
	}
	return keep_local(rec, key, h, value, value != NULL ? 1 : 0);
}

struct standing_state {
	struct local_header *h;
	dbwrap_py_native_value_fn fn;
	void *private_data;
	bool found;
};

static int standing_parser(TDB_DATA key, TDB_DATA data, void *private_data)
{
	struct standing_state *s = private_data;

	if (data.dsize < LOCAL_HEADER) {
		return 0;
	}
	local_header_unpack(data.dptr, s->h);
	s->found = true;
	if (!(s->h->flags & (LOCAL_DELETED | LOCAL_DETACHED))) {
		TDB_DATA value = { data.dptr + LOCAL_HEADER, data.dsize - LOCAL_HEADER };

		s->fn(value, true, s->private_data);
	}
	return 0;
}

/* The local record as kept, valid or not: false if none; fn gets a live value. */
bool nc_standing(const struct nc_records *rec, TDB_DATA key, struct local_header *h,
		 dbwrap_py_native_value_fn fn, void *private_data)
{
	struct tdb_context *tdb = *rec->records_tdb;
	struct standing_state s = { .h = h, .fn = fn, .private_data = private_data };

	return tdb != NULL && tdb_parse_record(tdb, key, standing_parser, &s) == 0 && s.found;
}

/* The node no longer owns key; a key of its bucket stays marked (detached). */
uint32_t nc_forget(const struct nc_records *rec, TDB_DATA key, int64_t lease,
		   struct dbwrap_py_native_why *why)
{
	struct tdb_context *tdb = *rec->records_tdb;
	int64_t token;
	bool stored;

	if (tdb == NULL) {
		return closed_why(why);
	}
	if (nc_bucket_holds(rec, key, lease, &token, &stored)) {
		struct local_header h = { lease, token, LOCAL_DETACHED };

		if (keep_local(rec, key, &h, NULL, 0) != 0) {
			return nc_why(why, NC_NT_INTERNAL_DB_ERROR, "tdb_store of a detached mark failed");
		}
	} else if (tdb_delete(tdb, key) != 0 && tdb_error(tdb) != TDB_ERR_NOEXIST) {
		return nc_why(why, NC_NT_INTERNAL_DB_ERROR, "tdb_delete: %s", tdb_errorstr(tdb));
	}
	return 0;
}

/* -- the scans (the agent's vacuum and drain) ---------------------------------------- */

struct scan_state {
	int64_t lease, wipe_revision;
	size_t header_size;  /* LOCAL_HEADER or BUCKET_HEADER */
	bool local_records;  /* else buckets */
	struct nc_scan *scan;
	size_t allocated;
	bool out_of_memory;
};

/* Whether a record or bucket is the node's under s->lease. */
static bool scan_matches(const struct scan_state *s, TDB_DATA data)
{
	struct local_header h;

	if (data.dsize < s->header_size) {
		return false;
	}
	local_header_unpack(data.dptr, &h); /* a bucket starts with its lease and token too */
	if (h.lease != s->lease || h.token <= s->wipe_revision) {
		return false;
	}
	return !s->local_records || !(h.flags & LOCAL_DETACHED);
}

static int scan_copy_fn(struct tdb_context *tdb, TDB_DATA key, TDB_DATA data, void *private_data)
{
	struct scan_state *s = private_data;
	struct nc_scan *scan = s->scan;
	struct nc_scanned *item;

	if (!scan_matches(s, data)) {
		return 0;
	}
	if (scan->count == s->allocated) {
		size_t allocated = s->allocated ? 2 * s->allocated : 64;
		struct nc_scanned *found = talloc_realloc(NULL, scan->found, struct nc_scanned,
							  allocated);

		if (found == NULL) {
			s->out_of_memory = true;
			return -1;
		}
		scan->found = found;
		s->allocated = allocated;
	}
	item = &scan->found[scan->count];
	item->key = talloc_memdup(scan->found, key.dptr, key.dsize ? key.dsize : 1);
	item->data = talloc_memdup(scan->found, data.dptr, data.dsize);
	if (item->key == NULL || item->data == NULL) {
		s->out_of_memory = true;
		return -1;
	}
	item->key_size = key.dsize;
	item->data_size = data.dsize;
	scan->count++;
	return 0;
}

/*
 * A key in each hash chain: keys[c] hashes to chain c. The local files use
 * tdb's jenkins hash (TDB_INCOMPATIBLE_HASH; tdb refuses to open a file made
 * with another), so the keys are found by hashing small numbers. About
 * chains * ln(chains) hashes: a millisecond for HASH_SIZE.
 */
static uint32_t *chain_keys(TALLOC_CTX *mem_ctx, unsigned chains)
{
	uint32_t *keys = talloc_array(mem_ctx, uint32_t, chains);
	unsigned missing = chains, c;
	uint32_t n;

	if (keys == NULL) {
		return NULL;
	}
	for (c = 0; c < chains; c++) {
		keys[c] = UINT32_MAX;
	}
	for (n = 0; missing > 0 && n < UINT32_MAX; n++) {
		TDB_DATA key = { (uint8_t *)&n, sizeof(n) };

		c = tdb_jenkins_hash(&key) % chains;
		if (keys[c] == UINT32_MAX) {
			keys[c] = n;
			missing--;
		}
	}
	return keys;
}

/*
 * The traverse of a scan that must not wait (the agent's vacuum, its
 * write-through for a traverse): chain by chain, each one only if its lock
 * is free now. A chain a process holds is passed and counted; tdb's own
 * traverse would wait on it, and the agent with it, while smbd holds a
 * record for as long as it likes.
 */
static int scan_free_chains(struct tdb_context *tdb, struct scan_state *s)
{
	unsigned chains = (unsigned)tdb_hash_size(tdb), c;
	uint32_t *keys = chain_keys(NULL, chains);
	int ret = 0;

	if (keys == NULL) {
		s->out_of_memory = true;
		return -1;
	}
	for (c = 0; c < chains && ret >= 0 && !s->out_of_memory; c++) {
		TDB_DATA key = { (uint8_t *)&keys[c], sizeof(keys[c]) };

		if (tdb_chainlock_nonblock(tdb, key) != 0) {
			s->scan->held++;
			continue;
		}
		ret = tdb_traverse_chain(tdb, c, scan_copy_fn, s); /* nests in the lock held */
		tdb_chainunlock(tdb, key);
	}
	talloc_free(keys);
	return ret;
}

/* Copy out the node's records (or buckets); the caller frees scan with nc_scan_free. */
uint32_t nc_scan(const struct nc_records *rec, int64_t lease, bool local_records,
		 bool wait, struct nc_scan *scan, struct dbwrap_py_native_why *why)
{
	struct tdb_context *tdb = local_records ? *rec->records_tdb : *rec->buckets_tdb;
	struct scan_state s = {
		.lease = lease,
		.wipe_revision = rec->wipe_revision,
		.header_size = local_records ? LOCAL_HEADER : BUCKET_HEADER,
		.local_records = local_records,
		.scan = scan,
	};
	int ret;

	*scan = (struct nc_scan) { NULL, 0, 0 };
	if (tdb == NULL) {
		return closed_why(why);
	}
	if (!wait && !(tdb_get_flags(tdb) & TDB_INCOMPATIBLE_HASH)) {
		return nc_why(why, NC_NT_INTERNAL_DB_ERROR, "a scan that does not wait needs"
			      " the jenkins hash (TDB_INCOMPATIBLE_HASH)");
	}
	ret = wait ? tdb_traverse_read(tdb, scan_copy_fn, &s) : scan_free_chains(tdb, &s);
	if (s.out_of_memory) {
		return nc_why(why, NC_NT_NO_MEMORY, "no memory for a scan");
	}
	if (ret < 0) {
		return nc_why(why, NC_NT_INTERNAL_DB_ERROR, "tdb_traverse_read failed: %s",
			      tdb_errorstr(tdb));
	}
	return 0;
}

void nc_scan_free(struct nc_scan *scan)
{
	TALLOC_FREE(scan->found);
	scan->count = 0;
}

/* A scanned local record's header, and its value (dptr NULL: deleted). */
void nc_scanned_record(const struct nc_scanned *item, struct local_header *h, TDB_DATA *value)
{
	local_header_unpack(item->data, h);
	*value = (h->flags & LOCAL_DELETED)
		? tdb_null
		: (TDB_DATA) { item->data + LOCAL_HEADER, item->data_size - LOCAL_HEADER };
}

/* A scanned bucket's number (its key, in decimal) and token; -1 for a key too long. */
int nc_scanned_bucket(const struct nc_scanned *item, int64_t *token)
{
	char number[16];

	if (item->key_size >= sizeof(number)) {
		return -1;
	}
	memcpy(number, item->key, item->key_size);
	number[item->key_size] = '\0';
	memcpy(token, item->data + 8, 8);
	return atoi(number);
}

/* -- native records: the owned records, no Python ------------------------------------- */

uint32_t nc_fetch(const struct nc_records *rec, TDB_DATA key, dbwrap_py_native_value_fn fn,
		  void *private_data, bool *ask_owner)
{
	struct local_header h;
	uint32_t status;
	int64_t lease = nc_state_live(rec->state, &status);

	*ask_owner = false;
	if (lease != 0 && status != STATE_STOPPED) {
		switch (nc_classify(rec, key, lease, fn, private_data, &h)) {
		case NC_OWNED_RECORD:
			return 0;
		case NC_OWNED_FRESH:
			fn(tdb_null, false, private_data);
			return 0;
		case NC_OWNED_NONE:
			break;
		}
	}
	*ask_owner = true;
	return 0;
}

/*
 * Lock key and read what the lock stands on. *ask_owner: the node does not
 * own it; key stays locked, and the caller moves it in (it writes the local
 * record under this chainlock), then calls nc_lock_moved_in.
 */
uint32_t nc_lock_fetch(const struct nc_records *rec, TDB_DATA key,
		       dbwrap_py_native_value_fn fn, void *private_data, bool *ask_owner,
		       struct dbwrap_py_native_why *why)
{
	struct tdb_context *tdb = *rec->records_tdb;
	struct local_header h;
	uint32_t status, code;
	int64_t lease;
	int kind;

	*ask_owner = false;
	if (tdb == NULL) {
		return closed_why(why);
	}
	if (tdb_chainlock(tdb, key) != 0) {
		return nc_why(why, NC_NT_LOCK_CONFLICT, "tdb_chainlock: %s", tdb_errorstr(tdb));
	}
	lease = nc_state_live(rec->state, &status);
	kind = (lease != 0 && status == STATE_RUNNING)
		? nc_stand(rec, key, lease, fn, private_data, &h) : (int)NC_OWNED_NONE;
	if (kind == NC_OWNED_RECORD || kind == NC_OWNED_FRESH) {
		return 0;
	}
	if (kind < 0) {
		code = nc_why(why, NC_NT_INTERNAL_DB_ERROR, "tdb_store: %s", tdb_errorstr(tdb));
		tdb_chainunlock(tdb, key);
		return code;
	}
	*ask_owner = true;
	return 0;
}

/* After the owner path (its result in status): read the record moved in, or unlock. */
uint32_t nc_lock_moved_in(const struct nc_records *rec, TDB_DATA key, uint32_t status,
			  dbwrap_py_native_value_fn fn, void *private_data, bool *changed_hands,
			  struct dbwrap_py_native_why *why)
{
	struct tdb_context *tdb = *rec->records_tdb;
	struct local_header h;
	uint32_t agent;
	int64_t lease;

	*changed_hands = false;
	if (status == 0) {
		lease = nc_state_live(rec->state, &agent);
		if (nc_classify(rec, key, lease, fn, private_data, &h) == NC_OWNED_NONE) {
			*changed_hands = true;
			status = nc_why(why, NC_NT_LOCK_CONFLICT,
					"the record changed hands while it moved in");
		}
	}
	if (status != 0 && tdb != NULL) {
		tdb_chainunlock(tdb, key);
	}
	return status;
}

/* Before an unlock: *hand_over if another node waits for key (the caller hands it over). */
uint32_t nc_unlock_check(const struct nc_records *rec, TDB_DATA key, bool *hand_over,
			 struct dbwrap_py_native_why *why)
{
	uint32_t status;

	*hand_over = false;
	if (*rec->records_tdb == NULL) {
		return closed_why(why);
	}
	*hand_over = nc_state_live(rec->state, &status) != 0 &&
		     state_wanted(rec->state, record_hash(rec->db_crc, key.dptr, key.dsize));
	return 0;
}

uint32_t nc_unlock(const struct nc_records *rec, TDB_DATA key, struct dbwrap_py_native_why *why)
{
	struct tdb_context *tdb = *rec->records_tdb;

	if (tdb == NULL) {
		return closed_why(why);
	}
	/* a record locked before fork and freed in the child: never held here */
	if (tdb_chainunlock(tdb, key) != 0 && tdb_error(tdb) != TDB_ERR_LOCK) {
		return nc_why(why, NC_NT_INTERNAL_DB_ERROR, "tdb_chainunlock: %s", tdb_errorstr(tdb));
	}
	return 0;
}

static uint32_t fence_why(enum nc_fence result, struct dbwrap_py_native_why *why)
{
	if (result == NC_FENCE_NOT_LOCKED) {
		return nc_why(why, NC_NT_LOCK_CONFLICT, "a write without its record lock");
	}
	return nc_why(why, NC_NT_LOCK_CONFLICT,
		      "FencedOut: the node lease the record was taken under is gone");
}

uint32_t nc_storev(const struct nc_records *rec, TDB_DATA key, const TDB_DATA *dbufs,
		   int num_dbufs, struct dbwrap_py_native_why *why)
{
	struct local_header h;
	enum nc_fence fenced = nc_fence(rec, key, &h);

	if (fenced != NC_FENCE_OK) {
		return fence_why(fenced, why);
	}
	h.flags &= ~LOCAL_DELETED;
	if (keep_local(rec, key, &h, dbufs, num_dbufs) != 0) {
		return nc_why(why, NC_NT_INTERNAL_DB_ERROR, "tdb_storev of the local record failed");
	}
	return 0;
}

uint32_t nc_delete(const struct nc_records *rec, TDB_DATA key, struct dbwrap_py_native_why *why)
{
	struct local_header h;
	enum nc_fence fenced = nc_fence(rec, key, &h);

	if (fenced != NC_FENCE_OK) {
		return fence_why(fenced, why);
	}
	if (h.flags & LOCAL_DELETED) {
		return nc_why(why, NC_NT_NOT_FOUND, "delete of a missing key");
	}
	h.flags |= LOCAL_DELETED; /* a tombstone: the vacuum tells the store, or drops it */
	if (keep_local(rec, key, &h, NULL, 0) != 0) {
		return nc_why(why, NC_NT_INTERNAL_DB_ERROR, "tdb_store of the tombstone failed");
	}
	return 0;
}

uint32_t nc_seqnum(const struct nc_records *rec, int *seqnum, struct dbwrap_py_native_why *why)
{
	struct tdb_context *tdb = *rec->records_tdb;

	if (tdb == NULL) {
		return closed_why(why);
	}
	*seqnum = tdb_get_seqnum(tdb) & 0x7FFFFFFF;
	return 0;
}
