/*
 * dbwrap semantics across processes: record locks exclude other processes,
 * die with their holder, and a database opened before fork() works on both
 * sides. These are the properties smbd's forked children rely on.
 */

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

/* libtdb: what Samba's reinit_after_fork() calls for native tdb */
int tdb_reopen_all(int parent_longlived);

struct proc_arg {
	const struct backend *b;
	const char *dir;
	struct db_context *db;  /* opened before fork, where used */
	int fd;                 /* a pipe end, where used */
};

static long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

static uint32_t value_u32(TDB_DATA value)
{
	uint32_t v = 0;

	if (value.dsize == sizeof(v)) {
		memcpy(&v, value.dptr, sizeof(v));
	}
	return v;
}

static uint32_t fetch_u32(struct db_context *db, TALLOC_CTX *mem, const char *key)
{
	TDB_DATA value = tdb_null;

	if (!NT_STATUS_IS_OK(dbwrap_fetch(db, mem, str_data(key), &value))) {
		return UINT32_MAX;
	}
	return value_u32(value);
}

static bool increment_locked(struct db_context *db, TALLOC_CTX *mem, const char *key)
{
	struct db_record *rec = dbwrap_fetch_locked(db, mem, str_data(key));
	uint32_t v;
	bool ok;

	if (rec == NULL) {
		return false;
	}
	v = value_u32(dbwrap_record_get_value(rec)) + 1;
	ok = NT_STATUS_IS_OK(dbwrap_record_store(
		rec, (TDB_DATA) { (uint8_t *)&v, sizeof(v) }, 0));
	TALLOC_FREE(rec);
	return ok;
}

static void increment_fn(struct db_record *rec, TDB_DATA value, void *private_data)
{
	bool *ok = private_data;
	uint32_t v = value_u32(value) + 1;

	*ok = NT_STATUS_IS_OK(dbwrap_record_store(
		rec, (TDB_DATA) { (uint8_t *)&v, sizeof(v) }, 0));
}

static bool increment_do_locked(struct db_context *db, const char *key)
{
	bool ok = false;
	NTSTATUS status = dbwrap_do_locked(db, str_data(key), increment_fn, &ok);

	return NT_STATUS_IS_OK(status) && ok;
}

#define SKIP_SINGLE_PROCESS(b) do {					\
	if (!(b)->multi_process) {					\
		SKIP_BECAUSE("adapter is single-process by design");	\
	}								\
} while (0)

/* -- LOCAL-DBTRANS: a counter under transactions and fetch_locked ------------ */

#define DBTRANS_PROCS 3
#define DBTRANS_ROUNDS 30

static int dbtrans_child(void *p)
{
	struct proc_arg *a = p;
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = open_db(mem, a->b, a->dir, "transtest.tdb",
					PERSISTENT_FLAGS, DBWRAP_LOCK_ORDER_1);
	uint32_t before, after;
	int round, i;

	if (db == NULL) {
		return 10;
	}
	for (round = 0; round < DBTRANS_ROUNDS; round++) {
		if (dbwrap_transaction_start(db) != 0) {
			return 11;
		}
		before = fetch_u32(db, mem, "counter");
		for (i = 0; i < 10; i++) {
			if (!increment_locked(db, mem, "counter")) {
				return 12;
			}
		}
		after = fetch_u32(db, mem, "counter");
		if (after != before + 10) {
			fprintf(stderr, "    DBTRANS: %u != %u + 10\n", after, before);
			return 13;
		}
		if (dbwrap_transaction_commit(db) != 0) {
			return 14;
		}
	}
	talloc_free(mem);
	return 0;
}

static enum result test_dbtrans(const struct backend *b, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct proc_arg arg = { .b = b, .dir = dir };
	struct db_context *db;
	uint32_t zero = 0, total;
	int failed;

	SKIP_SINGLE_PROCESS(b);
	db = open_db(mem, b, dir, "transtest.tdb", PERSISTENT_FLAGS,
		     DBWRAP_LOCK_ORDER_1);
	CHECK(db != NULL, "open failed");
	CHECK_STATUS(dbwrap_trans_store(db, str_data("counter"),
					(TDB_DATA) { (uint8_t *)&zero, 4 }, 0),
		     NT_STATUS_OK);
	failed = run_children(dbtrans_child, &arg, DBTRANS_PROCS, 120);
	CHECK(failed == 0, "%d of %d DBTRANS processes failed", failed, DBTRANS_PROCS);
	total = fetch_u32(db, mem, "counter");
	CHECK(total == DBTRANS_PROCS * DBTRANS_ROUNDS * 10,
	      "counter is %u, expected %d", total, DBTRANS_PROCS * DBTRANS_ROUNDS * 10);
	talloc_free(mem);
	return PASS;
}

/* -- N processes x M increments, fetch_locked and do_locked mixed ------------- */

#define COUNTER_PROCS 4
#define COUNTER_ROUNDS 200

static int counter_child(void *p)
{
	struct proc_arg *a = p;
	TALLOC_CTX *mem = talloc_new(NULL);
	int i;
	bool ok;

	for (i = 0; i < COUNTER_ROUNDS; i++) {
		ok = (i % 2 == 0) ? increment_locked(a->db, mem, "counter")
				  : increment_do_locked(a->db, "counter");
		if (!ok) {
			return 20;
		}
	}
	talloc_free(mem);
	return 0;
}

static enum result test_counter(const struct backend *b, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct proc_arg arg = { .b = b, .dir = dir };
	uint32_t total;
	int failed;

	SKIP_SINGLE_PROCESS(b);
	/* opened before fork, as smbd does; volatile, as locking.tdb */
	arg.db = open_db(mem, b, dir, "counter.tdb", VOLATILE_FLAGS,
			 DBWRAP_LOCK_ORDER_NONE);
	CHECK(arg.db != NULL, "open failed");
	failed = run_children(counter_child, &arg, COUNTER_PROCS, 120);
	CHECK(failed == 0, "%d of %d counter processes failed", failed, COUNTER_PROCS);
	total = fetch_u32(arg.db, mem, "counter");
	CHECK(total == COUNTER_PROCS * COUNTER_ROUNDS,
	      "counter is %u, expected %d: updates were lost", total,
	      COUNTER_PROCS * COUNTER_ROUNDS);
	talloc_free(mem);
	return PASS;
}

/* -- a holder excludes others until it frees the record ---------------------- */

static int holder_child(void *p)
{
	struct proc_arg *a = p;
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_record *rec = dbwrap_fetch_locked(a->db, mem, str_data("excl"));
	char byte = 'L';

	if (rec == NULL || write(a->fd, &byte, 1) != 1) {
		return 30;
	}
	sleep_ms(300);
	if (!NT_STATUS_IS_OK(dbwrap_record_store(rec, str_data("child"), 0))) {
		return 31;
	}
	TALLOC_FREE(rec);
	return 0;
}

static enum result test_exclusion(const struct backend *b, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct proc_arg arg = { .b = b, .dir = dir };
	struct db_record *rec;
	int fds[2];
	pid_t pid;
	char byte;
	long start, waited;
	TDB_DATA value;
	int wstatus;

	SKIP_SINGLE_PROCESS(b);
	arg.db = open_db(mem, b, dir, "excl.tdb", VOLATILE_FLAGS,
			 DBWRAP_LOCK_ORDER_1);
	CHECK(arg.db != NULL && pipe(fds) == 0, "setup failed");
	arg.fd = fds[1];
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		alarm(30);
		_exit(holder_child(&arg));
	}
	CHECK(read(fds[0], &byte, 1) == 1, "the holder never locked");
	start = now_ms();
	alarm(30); /* a lock that is never released fails the run */
	rec = dbwrap_fetch_locked(arg.db, mem, str_data("excl"));
	alarm(0);
	waited = now_ms() - start;
	CHECK(rec != NULL, "fetch_locked failed");
	value = dbwrap_record_get_value(rec);
	CHECK(value.dsize == 5 && memcmp(value.dptr, "child", 5) == 0,
	      "got the lock while another process held it (waited %ld ms)", waited);
	CHECK(waited >= 150, "waited only %ld ms for a 300 ms holder", waited);
	TALLOC_FREE(rec);
	waitpid(pid, &wstatus, 0);
	CHECK(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0, "holder failed");
	close(fds[0]);
	close(fds[1]);
	talloc_free(mem);
	return PASS;
}

/* -- LOCAL-DBWRAP-WATCH3's core: a dead holder releases its lock -------------- */

static int exit_holding_child(void *p)
{
	struct proc_arg *a = p;
	struct db_record *rec = dbwrap_fetch_locked(a->db, NULL, str_data("w3"));

	/* exit without freeing the record */
	return rec != NULL ? 0 : 40;
}

static int killed_holder_child(void *p)
{
	struct proc_arg *a = p;
	struct db_record *rec = dbwrap_fetch_locked(a->db, NULL, str_data("w3k"));
	char byte = 'L';

	if (rec == NULL || write(a->fd, &byte, 1) != 1) {
		return 41;
	}
	pause(); /* until SIGKILL */
	return 0;
}

static enum result test_watch3(const struct backend *b, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct proc_arg arg = { .b = b, .dir = dir };
	int fds[2], wstatus;
	pid_t pid;
	char byte;
	long start;
	NTSTATUS status;

	SKIP_SINGLE_PROCESS(b);
	arg.db = open_db(mem, b, dir, "watch3.tdb", VOLATILE_FLAGS,
			 DBWRAP_LOCK_ORDER_1);
	CHECK(arg.db != NULL && pipe(fds) == 0, "setup failed");

	CHECK(run_children(exit_holding_child, &arg, 1, 30) == 0, "child failed");
	alarm(30);
	status = dbwrap_store(arg.db, str_data("w3"), str_data("parent"), 0);
	alarm(0);
	CHECK_STATUS(status, NT_STATUS_OK);

	arg.fd = fds[1];
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		alarm(30);
		_exit(killed_holder_child(&arg));
	}
	CHECK(read(fds[0], &byte, 1) == 1, "the holder never locked");
	kill(pid, SIGKILL);
	waitpid(pid, &wstatus, 0);
	start = now_ms();
	alarm(30);
	status = dbwrap_store(arg.db, str_data("w3k"), str_data("parent"), 0);
	alarm(0);
	CHECK_STATUS(status, NT_STATUS_OK);
	fprintf(stderr, "    %s: lock of a SIGKILLed holder free after %ld ms\n",
		b->name, now_ms() - start);
	close(fds[0]);
	close(fds[1]);
	talloc_free(mem);
	return PASS;
}

/* -- a database opened before fork works in parent and child ----------------- */

static int forked_user_child(void *p)
{
	struct proc_arg *a = p;
	TDB_DATA value;

	if (a->b->adapter == NULL && tdb_reopen_all(0) != 0) {
		return 50; /* native tdb needs what reinit_after_fork() does */
	}
	if (!NT_STATUS_IS_OK(dbwrap_fetch(a->db, NULL, str_data("from-parent"), &value)) ||
	    value.dsize != 6 || memcmp(value.dptr, "parent", 6) != 0) {
		return 51;
	}
	if (!NT_STATUS_IS_OK(dbwrap_store(a->db, str_data("from-child"),
					  str_data("child"), 0))) {
		return 52;
	}
	return 0;
}

static enum result test_fork(const struct backend *b, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct proc_arg arg = { .b = b, .dir = dir };
	TDB_DATA value;

	SKIP_SINGLE_PROCESS(b);
	arg.db = open_db(mem, b, dir, "fork.tdb", VOLATILE_FLAGS,
			 DBWRAP_LOCK_ORDER_1);
	CHECK(arg.db != NULL, "open failed");
	CHECK_STATUS(dbwrap_store(arg.db, str_data("from-parent"), str_data("parent"), 0),
		     NT_STATUS_OK);
	CHECK(run_children(forked_user_child, &arg, 2, 30) == 0,
	      "a child could not use the database opened before fork");
	CHECK_STATUS(dbwrap_fetch(arg.db, mem, str_data("from-child"), &value),
		     NT_STATUS_OK);
	CHECK(value.dsize == 5 && memcmp(value.dptr, "child", 5) == 0,
	      "the parent does not see the child's write");
	CHECK(increment_do_locked(arg.db, "after-fork"), "parent unusable after fork");
	talloc_free(mem);
	return PASS;
}

/* -- seqnum changes are seen by other processes ------------------------------- */

static int seqnum_writer_child(void *p)
{
	struct proc_arg *a = p;

	return NT_STATUS_IS_OK(dbwrap_store(a->db, str_data("s"), str_data("x"), 0))
		? 0 : 60;
}

static enum result test_seqnum_shared(const struct backend *b, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct proc_arg arg = { .b = b, .dir = dir };
	int before, after;

	SKIP_SINGLE_PROCESS(b);
	arg.db = open_db(mem, b, dir, "seq.tdb", VOLATILE_FLAGS,
			 DBWRAP_LOCK_ORDER_NONE);
	CHECK(arg.db != NULL, "open failed");
	before = dbwrap_get_seqnum(arg.db);
	CHECK(run_children(seqnum_writer_child, &arg, 1, 30) == 0, "writer failed");
	after = dbwrap_get_seqnum(arg.db);
	CHECK(before != after, "another process's write left seqnum at %d", before);
	talloc_free(mem);
	return PASS;
}

const struct test_case process_tests[] = {
	{ "DBTRANS (3 procs, transactions)", test_dbtrans },
	{ "4 procs x 200 increments, mixed", test_counter },
	{ "holder excludes other processes", test_exclusion },
	{ "WATCH3 core: dead holder unlocks", test_watch3 },
	{ "opened before fork: both sides", test_fork },
	{ "seqnum seen across processes", test_seqnum_shared },
	{ NULL, NULL },
};
