/*
 * Database-wide checks: seqnum seen from another process, wipe, check, id,
 * and a database opened before fork() used on both sides.
 */

#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

/* libtdb: what Samba's reinit_after_fork() calls for native tdb */
int tdb_reopen_all(int parent_longlived);

struct writer_arg {
	const struct target *t;
	const char *dir;
	int step;
};

/* One committed change per process: store, replace, delete, ... */
static int seqnum_writer(void *arg, int index)
{
	struct writer_arg *w = arg;
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = check_open(mem, w->t, w->dir, "seqnum.tdb",
					   VOLATILE_FLAGS);
	char value[16];

	if (db == NULL) {
		return 1;
	}
	snprintf(value, sizeof(value), "v%d", w->step);
	if (w->step % 3 == 2) {
		return NT_STATUS_IS_OK(dbwrap_delete(db, str_data("k"))) ? 0 : 1;
	}
	return NT_STATUS_IS_OK(dbwrap_store(db, str_data("k"), str_data(value), 0)) ? 0 : 1;
}

static enum result check_seqnum(const struct target *t, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = check_open(mem, t, dir, "seqnum.tdb", VOLATILE_FLAGS);
	struct writer_arg w = { t, dir, 0 };
	int before, after, unchanged = 0;

	CHECK_OPENED(db);
	for (w.step = 0; w.step < 6; w.step++) {
		before = dbwrap_get_seqnum(db);
		if (t->multi_process) {
			CHECK(run_children(seqnum_writer, &w, 1, 30) == 0,
			      "the writing process failed at step %d; %s", w.step,
			      children_cause);
		} else {
			CHECK(w.step % 3 == 2
			      ? NT_STATUS_IS_OK(dbwrap_delete(db, str_data("k")))
			      : NT_STATUS_IS_OK(dbwrap_store(db, str_data("k"), str_data("v"), 0)),
			      "write at step %d failed", w.step);
		}
		after = dbwrap_get_seqnum(db);
		unchanged += after == before;
	}
	CHECK(unchanged == 0, "the seqnum stayed the same across %d of 6 committed writes%s",
	      unchanged, t->multi_process ? " made by another process" : "");
	MEASURED("6 writes%s, each changed the seqnum",
		 t->multi_process ? " by other processes" : "");
	talloc_free(mem);
	return PASS;
}

static enum result check_wipe(const struct target *t, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = check_open(mem, t, dir, "wipe.tdb", VOLATILE_FLAGS);
	char key[16];
	int i, count = -1;

	CHECK_OPENED(db);
	for (i = 0; i < 20; i++) {
		snprintf(key, sizeof(key), "k%d", i);
		CHECK_STATUS(dbwrap_store(db, str_data(key), str_data("v"), 0), NT_STATUS_OK,
			     "store");
	}
	CHECK(dbwrap_py_wipe(db) == 0, "wipe failed");
	CHECK_STATUS(dbwrap_traverse_read(db, NULL, NULL, &count), NT_STATUS_OK,
		     "traverse_read after wipe");
	CHECK(count == 0, "%d records left after wipe", count);
	CHECK_STATUS(dbwrap_store(db, str_data("after"), str_data("v"), 0), NT_STATUS_OK,
		     "store after wipe");
	talloc_free(mem);
	return PASS;
}

static enum result check_check(const struct target *t, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = check_open(mem, t, dir, "check.tdb", VOLATILE_FLAGS);

	CHECK_OPENED(db);
	CHECK_STATUS(dbwrap_store(db, str_data("k"), str_data("v"), 0), NT_STATUS_OK, "store");
	CHECK(dbwrap_check(db) == 0, "check of a healthy database failed");
	talloc_free(mem);
	return PASS;
}

struct id { uint8_t bytes[256]; size_t len; };

static bool read_id(struct db_context *db, struct id *id)
{
	id->len = dbwrap_db_id(db, id->bytes, sizeof(id->bytes));
	return id->len > 0 && id->len <= sizeof(id->bytes);
}

static bool same_id(const struct id *a, const struct id *b)
{
	return a->len == b->len && memcmp(a->bytes, b->bytes, a->len) == 0;
}

struct id_arg {
	const struct target *t;
	const char *dir;
	struct id want;
};

static int child_same_id(void *arg, int index)
{
	struct id_arg *a = arg;
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = check_open(mem, a->t, a->dir, "id1.tdb", VOLATILE_FLAGS);
	struct id got;

	return db != NULL && read_id(db, &got) && same_id(&got, &a->want) ? 0 : 1;
}

static enum result check_id(const struct target *t, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db1 = check_open(mem, t, dir, "id1.tdb", VOLATILE_FLAGS);
	struct db_context *db2 = check_open(mem, t, dir, "id2.tdb", VOLATILE_FLAGS);
	struct id_arg a = { .t = t, .dir = dir };
	struct id again, other;

	CHECK_OPENED(db1);
	CHECK_OPENED(db2);
	CHECK(read_id(db1, &a.want), "id is empty or over %zu bytes", sizeof(a.want.bytes));
	CHECK(read_id(db1, &again) && same_id(&again, &a.want), "id changed between calls");
	CHECK(read_id(db2, &other) && !same_id(&other, &a.want),
	      "two different databases have the same id");
	if (t->multi_process) {
		CHECK(run_children(child_same_id, &a, 1, 30) == 0,
		      "another process opening the same database got another id "
		      "(the watch layer keys on it), or failed; %s", children_cause);
	}
	MEASURED("%zu-byte id", a.want.len);
	talloc_free(mem);
	return PASS;
}

/* fork: both sides use a database the parent opened before fork(). */
static enum result check_fork(const struct target *t, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = check_open(mem, t, dir, "fork.tdb", VOLATILE_FLAGS);
	int wstatus = -1;
	pid_t pid;

	CHECK_OPENED(db);
	CHECK_STATUS(dbwrap_store(db, str_data("before"), str_data("parent"), 0),
		     NT_STATUS_OK, "store before fork");
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		alarm(30);
		if (t->adapter == NULL && tdb_reopen_all(0) != 0) {
			_exit(3);
		}
		_exit(fetch_u32(db, "counter") != UINT32_MAX &&
		      dbwrap_exists(db, str_data("before")) &&
		      increment_do_locked(db, "counter") &&
		      increment_fetch_locked(db, "counter") ? 0 : 1);
	}
	CHECK(pid > 0, "fork failed");
	CHECK(increment_do_locked(db, "counter"), "the parent's do_locked failed");
	waitpid(pid, &wstatus, 0);
	CHECK(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0,
	      "the child could not use the database (status 0x%x)", wstatus);
	CHECK(increment_fetch_locked(db, "counter"),
	      "the parent's fetch_locked after the child failed");
	if (t->multi_process) {
		uint32_t n = fetch_u32(db, "counter");

		CHECK(n == 4, "counter is %u after 2 increments on each side, expected 4", n);
	}
	talloc_free(mem);
	return PASS;
}

const struct check database_checks[] = {
	{ "db.seqnum", "§1.9: the seqnum changes on every committed write, seen from another process",
	  check_seqnum },
	{ "db.wipe", "§1.9: wipe removes every record", check_wipe },
	{ "db.check", "§1.9: check of a healthy database returns 0", check_check },
	{ "db.id", "§1.9/§1.11: id is stable, differs between databases, agrees across processes",
	  check_id },
	{ "db.fork", "§6.5: a database opened before fork() works in the parent and the child",
	  check_fork },
	{ NULL },
};
