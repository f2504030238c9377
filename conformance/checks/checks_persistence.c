/*
 * Per-record persistence (Samba 4.25, DBWRAP_FLAG_PER_REC_PERSISTENT):
 * what persistent handles need of locking, brlock and smbXsrv_open_global.
 * A volatile database's record stored with DBWRAP_STORE_PERSISTENT is
 * durable when the store returns, and comes back after the database is
 * cleared (an smbd restart); a plain store or a delete drops the durable
 * copy; wipe keeps the copies unless DBWRAP_DROP_PERSISTENT. The rules are
 * Samba's (lib/dbwrap/dbwrap_tdb.c, LOCAL-DBWRAP-PER-REC-PERSISTENCY in
 * source3/torture); the bridge keeps them for every adapter in
 * c_bridge/per_rec_persistent.c. Before 4.25 every check skips.
 */

#include <errno.h>
#include <unistd.h>

#include "check.h"

#if DBWRAP_PY_SAMBA_4_25_LAYOUT

#define DB_FILE "per_rec.tdb"

static const struct dbwrap_wipe_flags wipe_volatile = { .wipe_default = true };

static struct db_context *open_per_rec(TALLOC_CTX *mem_ctx, const struct target *t,
				       const char *dir)
{
	char *path = talloc_asprintf(mem_ctx, "%s/%s", dir, DB_FILE);
	struct db_context *db;

	if (t->adapter == NULL) {
		db = db_open_tdb(mem_ctx, path, 0, VOLATILE_FLAGS, O_RDWR | O_CREAT,
				 0600, DBWRAP_LOCK_ORDER_1,
				 DBWRAP_FLAG_PER_REC_PERSISTENT);
	} else {
		db = db_open_py(mem_ctx, path, 0, VOLATILE_FLAGS, O_RDWR | O_CREAT,
				0600, DBWRAP_LOCK_ORDER_1,
				DBWRAP_FLAG_PER_REC_PERSISTENT, t->adapter, t->options);
	}
	if (db == NULL) {
		snprintf(check_note, sizeof(check_note), "open of %s with "
			 "DBWRAP_FLAG_PER_REC_PERSISTENT failed: %s", DB_FILE,
			 strerror(errno));
	}
	return db;
}

static bool store_as(struct db_context *db, const char *key, const char *value,
		     bool persistent)
{
	struct db_record *rec = dbwrap_fetch_locked(db, db, str_data(key));
	bool ok = rec != NULL &&
		  NT_STATUS_IS_OK(dbwrap_record_store(
			  rec, str_data(value),
			  persistent ? DBWRAP_STORE_PERSISTENT : 0));

	TALLOC_FREE(rec);
	return ok;
}

/* Does key hold `want` ("" for no record), flagged persistent or not? */
static bool holds(struct db_context *db, const char *key, const char *want,
		  bool persistent)
{
	struct db_record *rec = dbwrap_fetch_locked(db, db, str_data(key));
	TDB_DATA v;
	bool same;

	if (rec == NULL) {
		return false;
	}
	v = dbwrap_record_get_value(rec);
	same = v.dsize == strlen(want) && memcmp(v.dptr, want, v.dsize) == 0 &&
	       dbwrap_record_get_flags(rec).persistent == persistent;
	TALLOC_FREE(rec);
	return same;
}

/* What smbd's restart does to the database: cleared, then opened again;
 * NULL with the note written. */
static struct db_context *restart(TALLOC_CTX *mem_ctx, const struct target *t,
				  const char *dir, struct db_context **db)
{
	if (dbwrap_wipe(*db, wipe_volatile) != 0) {
		snprintf(check_note, sizeof(check_note), "wipe failed");
		TALLOC_FREE(*db);
		return NULL;
	}
	TALLOC_FREE(*db);
	*db = open_per_rec(mem_ctx, t, dir);
	return *db;
}

static int count_fn(struct db_record *rec, void *private_data)
{
	(*(int *)private_data)++;
	return 0;
}

/* The records traverse_read (or with `copies`, the copies' traverse) visits. */
static int visited(struct db_context *db, bool copies)
{
	int seen = 0, count = -1;
	NTSTATUS status = copies
		? dbwrap_traverse_per_rec_persistent_read(db, count_fn, &seen, &count)
		: dbwrap_traverse_read(db, count_fn, &seen, &count);

	return NT_STATUS_IS_OK(status) && seen == count ? count : -1;
}

#define SKIP_UNLESS_CLOSE_KEEPS(t) do {					\
	if (!(t)->multi_process) {					\
		SKIP_BECAUSE("single-process adapter: nothing outlives its close, "\
			     "so no copy can");				\
	}								\
} while (0)

static enum result check_restart(const struct target *t, const char *dir)
{
	TALLOC_CTX *mem;
	struct db_context *db;

	SKIP_UNLESS_CLOSE_KEEPS(t);
	mem = talloc_new(NULL);
	db = open_per_rec(mem, t, dir);
	CHECK_OPENED(db);
	CHECK(store_as(db, "p", "kept", true), "the persistent store failed");
	CHECK(store_as(db, "v", "gone", false), "the plain store failed");
	CHECK(holds(db, "p", "kept", true) && holds(db, "v", "gone", false),
	      "before the restart: a value or its persistent flag is wrong");
	CHECK_OPENED(restart(mem, t, dir, &db));
	CHECK(holds(db, "p", "kept", true), "the persistent record did not come back, "
	      "or not flagged persistent");
	CHECK(holds(db, "v", "", false), "the plain record outlived the restart");
	CHECK(visited(db, false) == 1, "traverse_read visits %d records, not 1 "
	      "(the migration marker is hidden)", visited(db, false));
	talloc_free(mem);
	return PASS;
}

static enum result check_plain_store(const struct target *t, const char *dir)
{
	TALLOC_CTX *mem;
	struct db_context *db;

	SKIP_UNLESS_CLOSE_KEEPS(t);
	mem = talloc_new(NULL);
	db = open_per_rec(mem, t, dir);
	CHECK_OPENED(db);
	CHECK(store_as(db, "k", "1", true) && store_as(db, "k", "2", false),
	      "the stores failed");
	CHECK(holds(db, "k", "2", false), "a plain store left the record flagged persistent");
	CHECK(store_as(db, "d", "x", true) &&
	      NT_STATUS_IS_OK(dbwrap_delete(db, str_data("d"))), "store then delete failed");
	CHECK(store_as(db, "j", "a", false) && store_as(db, "j", "b", true),
	      "the plain then persistent stores failed");
	CHECK(visited(db, true) == 1, "%d copies, not 1 (j's)", visited(db, true));
	CHECK_OPENED(restart(mem, t, dir, &db));
	CHECK(holds(db, "k", "", false), "k's copy outlived its plain store");
	CHECK(holds(db, "d", "", false), "d's copy outlived its delete");
	CHECK(holds(db, "j", "b", true), "j, stored persistent last, did not come back");
	talloc_free(mem);
	return PASS;
}

static enum result check_wipe_flags(const struct target *t, const char *dir)
{
	TALLOC_CTX *mem;
	struct db_context *db;
	const struct dbwrap_wipe_flags drop = { .wipe_persistent_backup_db = true };

	SKIP_UNLESS_CLOSE_KEEPS(t);
	mem = talloc_new(NULL);
	db = open_per_rec(mem, t, dir);
	CHECK_OPENED(db);
	CHECK(store_as(db, "a", "1", true) && store_as(db, "b", "2", true) &&
	      store_as(db, "c", "3", false), "the stores failed");
	CHECK(visited(db, true) == 2, "the copies' traverse visits %d, not 2", visited(db, true));
	CHECK(dbwrap_wipe(db, wipe_volatile) == 0, "wipe failed");
	CHECK(visited(db, false) == 0, "%d records after the wipe", visited(db, false));
	CHECK(visited(db, true) == 2, "the wipe took copies: %d left of 2", visited(db, true));
	CHECK(store_as(db, "c", "3", false), "store after the wipe failed");
	CHECK(dbwrap_wipe(db, drop) == 0, "wipe with DBWRAP_DROP_PERSISTENT failed");
	CHECK(visited(db, true) == 0, "%d copies after DBWRAP_DROP_PERSISTENT", visited(db, true));
	CHECK(holds(db, "c", "3", false), "DBWRAP_DROP_PERSISTENT alone took a volatile record");
	talloc_free(mem);
	return PASS;
}

struct crash_arg {
	const struct target *t;
	const char *dir;
};

/* Another smbd: stores, then dies without closing anything. */
static int store_and_die(void *arg, int index)
{
	struct crash_arg *a = arg;
	struct db_context *db = open_per_rec(NULL, a->t, a->dir);

	if (db == NULL || !store_as(db, "handle", "open", true) ||
	    !store_as(db, "scratch", "x", false)) {
		return 1;
	}
	_exit(0);
}

static enum result check_other_process(const struct target *t, const char *dir)
{
	struct crash_arg arg = { t, dir };
	TALLOC_CTX *mem;
	struct db_context *db;

	SKIP_UNLESS_CLOSE_KEEPS(t);
	CHECK(run_children(store_and_die, &arg, 1, 60) == 0,
	      "the storing process failed; %s", children_cause);
	mem = talloc_new(NULL);
	db = open_per_rec(mem, t, dir);
	CHECK_OPENED(db);
	CHECK_OPENED(restart(mem, t, dir, &db));
	CHECK(holds(db, "handle", "open", true), "the record a dead process stored "
	      "persistent did not come back");
	CHECK(holds(db, "scratch", "", false), "its plain record outlived the restart");
	talloc_free(mem);
	return PASS;
}

#define NEEDS_4_25(fn) fn

#else

#define NEEDS_4_25(fn) check_needs_4_25

static enum result check_needs_4_25(const struct target *t, const char *dir)
{
	SKIP_BECAUSE("Samba %s has no per-record persistence (from 4.25)",
		     DBWRAP_PY_SAMBA_VERSION);
}

#endif

const struct check persistence_checks[] = {
	{ "persistent.restart", "4.25: a record stored with DBWRAP_STORE_PERSISTENT "
	  "comes back, flagged, after its volatile database is cleared; a plain one does not",
	  NEEDS_4_25(check_restart) },
	{ "persistent.plain-store", "4.25: a plain store or a delete of a persistent record "
	  "drops its copy; a persistent store after a plain one makes one",
	  NEEDS_4_25(check_plain_store) },
	{ "persistent.wipe", "4.25: wipe keeps the copies unless DBWRAP_DROP_PERSISTENT; "
	  "traverse_per_rec_persistent_read visits exactly them",
	  NEEDS_4_25(check_wipe_flags) },
	{ "persistent.other-process", "4.25: a persistent store is durable when it returns: "
	  "another process that dies after it leaves the record to be restored",
	  NEEDS_4_25(check_other_process) },
	{ NULL },
};
