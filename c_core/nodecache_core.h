/*
 * The node cache's local rules, without Python: the node agent's state file
 * (nodecache_layout.h), and what the node owns of one database's local tdb
 * files. The extension (python/dbwrap_py/nodecache/_fastpath.c) wraps them
 * for cache.py and the in-process bridge; libdbwrap_py.so (c_bridge/) links
 * them too, for a proxy-mode smbd, which loads no libpython.
 *
 * The tdb files are the caller's: the core reads them through slots the
 * caller keeps (NULL once it closed them). A failure is an NTSTATUS with a
 * message in `why`. A record the node does not own is no failure: the op
 * returns 0 with *ask_owner set, and the caller takes the owner path (the
 * extension calls Python) before it carries on.
 */

#ifndef DBWRAP_PY_NODECACHE_CORE_H
#define DBWRAP_PY_NODECACHE_CORE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <tdb.h>

#include "nodecache_layout.h"
#include "native_records.h"

/* not exported from libdbwrap_py.so: the core is no ABI */
#define NC_CORE __attribute__((visibility("hidden")))

#define NC_NT_NO_MEMORY 0xC0000017u
#define NC_NT_LOCK_CONFLICT 0xC0000054u
#define NC_NT_DEVICE_NOT_READY 0xC00000A3u
#define NC_NT_INTERNAL_DB_ERROR 0xC0000158u
#define NC_NT_NOT_FOUND 0xC0000225u

/* The agent's state file, mapped read-only; zeroed before nc_state_open. */
struct nc_state {
	char *path;
	const uint8_t *map; /* STATE_SIZE bytes; NULL before an agent ran */
	ino_t inode;
	double next_check;
};

/* One database's local records (<db_id>.tdb) and buckets (<db_id>.buckets.tdb). */
struct nc_records {
	struct tdb_context *const *records_tdb;
	struct tdb_context *const *buckets_tdb;
	struct nc_state *state;
	uint32_t db_crc;
	int64_t wipe_revision; /* tokens up to it are void; the caller sets it */
	double op_timeout;
};

enum nc_owned { NC_OWNED_NONE, NC_OWNED_RECORD, NC_OWNED_FRESH };
enum nc_fence { NC_FENCE_OK, NC_FENCE_NOT_LOCKED, NC_FENCE_GONE };

/* A record or bucket a scan copied out (talloc'ed, under nc_scan.found). */
struct nc_scanned {
	uint8_t *key, *data;
	size_t key_size, data_size;
};

struct nc_scan {
	struct nc_scanned *found;
	size_t count;
	size_t held; /* chains passed by a scan that does not wait: a process held them */
};

NC_CORE uint32_t nc_why(struct dbwrap_py_native_why *why, uint32_t status, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* the state file */
NC_CORE int nc_state_open(struct nc_state *st, const char *dir);
NC_CORE void nc_state_close(struct nc_state *st);
NC_CORE void nc_state_unmap(struct nc_state *st);
NC_CORE int64_t nc_state_live(struct nc_state *st, uint32_t *status);
NC_CORE int64_t nc_state_current(struct nc_state *st, char name[STATE_NAME_SIZE + 1]);
NC_CORE bool nc_state_configured(struct nc_state *st);
NC_CORE void nc_state_node_name(struct nc_state *st, char name[STATE_NAME_SIZE + 1]);
NC_CORE uint32_t nc_state_agent_pid(struct nc_state *st);
NC_CORE bool nc_state_wanted(const struct nc_state *st, TDB_DATA db, TDB_DATA key);

/* the rules */
NC_CORE void nc_records_init(struct nc_records *rec, struct tdb_context *const *records_tdb,
			     struct tdb_context *const *buckets_tdb, struct nc_state *state,
			     TDB_DATA db, double op_timeout);
NC_CORE bool nc_bucket_holds(const struct nc_records *rec, TDB_DATA key, int64_t lease,
			     int64_t *token, bool *stored);
NC_CORE enum nc_owned nc_classify(const struct nc_records *rec, TDB_DATA key, int64_t lease,
				  dbwrap_py_native_value_fn fn, void *private_data,
				  struct local_header *header);
NC_CORE int nc_stand(const struct nc_records *rec, TDB_DATA key, int64_t lease,
		     dbwrap_py_native_value_fn fn, void *private_data, struct local_header *h);
NC_CORE enum nc_fence nc_fence(const struct nc_records *rec, TDB_DATA key, struct local_header *h);
NC_CORE int nc_keep(const struct nc_records *rec, TDB_DATA key, int64_t lease, int64_t token,
		    uint8_t flags, const TDB_DATA *value);
NC_CORE int nc_write_fenced(const struct nc_records *rec, TDB_DATA key, struct local_header *h,
			    const TDB_DATA *value, int in_store, bool *existed);
NC_CORE bool nc_standing(const struct nc_records *rec, TDB_DATA key, struct local_header *h,
			 dbwrap_py_native_value_fn fn, void *private_data);
NC_CORE uint32_t nc_forget(const struct nc_records *rec, TDB_DATA key, int64_t lease,
			   struct dbwrap_py_native_why *why);

/* the scans: copies, so that no caller's lock is held during the traverse;
 * one that does not wait passes the chains a process holds (scan->held) */
NC_CORE uint32_t nc_scan(const struct nc_records *rec, int64_t lease, bool local_records,
			 bool wait, struct nc_scan *scan, struct dbwrap_py_native_why *why);
NC_CORE void nc_scan_free(struct nc_scan *scan);
NC_CORE void nc_scanned_record(const struct nc_scanned *item, struct local_header *h,
			       TDB_DATA *value);
NC_CORE int nc_scanned_bucket(const struct nc_scanned *item, int64_t *token);

/* the owned-record parts of the native records (native_records.h) */
NC_CORE uint32_t nc_fetch(const struct nc_records *rec, TDB_DATA key, dbwrap_py_native_value_fn fn,
			  void *private_data, bool *ask_owner);
NC_CORE uint32_t nc_lock_fetch(const struct nc_records *rec, TDB_DATA key,
			       dbwrap_py_native_value_fn fn, void *private_data, bool *ask_owner,
			       struct dbwrap_py_native_why *why);
NC_CORE uint32_t nc_lock_moved_in(const struct nc_records *rec, TDB_DATA key, uint32_t status,
				  dbwrap_py_native_value_fn fn, void *private_data, bool *changed_hands,
				  struct dbwrap_py_native_why *why);
NC_CORE uint32_t nc_unlock_check(const struct nc_records *rec, TDB_DATA key, bool *hand_over,
				 struct dbwrap_py_native_why *why);
NC_CORE uint32_t nc_unlock(const struct nc_records *rec, TDB_DATA key,
			   struct dbwrap_py_native_why *why);
NC_CORE uint32_t nc_storev(const struct nc_records *rec, TDB_DATA key, const TDB_DATA *dbufs,
			   int num_dbufs, struct dbwrap_py_native_why *why);
NC_CORE uint32_t nc_delete(const struct nc_records *rec, TDB_DATA key,
			   struct dbwrap_py_native_why *why);
NC_CORE uint32_t nc_seqnum(const struct nc_records *rec, int *seqnum,
			   struct dbwrap_py_native_why *why);

#endif /* DBWRAP_PY_NODECACHE_CORE_H */
