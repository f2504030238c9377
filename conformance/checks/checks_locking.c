/*
 * Record-locking checks: exclusion across processes (no lost update), the
 * holder reading its own writes, release on free and on SIGKILL, and fencing
 * of a paused holder.
 */

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

#define PROCS 4
#define INCREMENTS 200
#define COUNTERS 4

#define SKIP_SINGLE_PROCESS(t) do {					\
	if (!(t)->multi_process) {					\
		SKIP_BECAUSE("single-process adapter: no other process to exclude"); \
	}								\
} while (0)

enum increment_style { BY_FETCH_LOCKED, BY_DO_LOCKED, MIXED };

struct counter_arg {
	const struct target *t;
	const char *dir;
	enum increment_style style;
	int counters;
	long start_at;  /* all children start at once, so they contend */
};

static int increment_child(void *arg, int index)
{
	struct counter_arg *a = arg;
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = check_open(mem, a->t, a->dir, "counter.tdb",
					   VOLATILE_FLAGS);
	char key[32];
	bool ok, locked;
	int i;

	if (db == NULL) {
		return 1;
	}
	increment_hold_us = 100;
	sleep_until_ms(a->start_at);
	for (i = 0; i < INCREMENTS; i++) {
		/* every process walks the keys in the same order, so they collide */
		snprintf(key, sizeof(key), "counter-%d", i % a->counters);
		locked = a->style == BY_FETCH_LOCKED ||
			 (a->style == MIXED && (i + index) % 2 == 0);
		ok = locked ? increment_fetch_locked(db, key) : increment_do_locked(db, key);
		if (!ok) {
			fprintf(stderr, "increment %d of %s by %s failed\n", i, key,
				locked ? "fetch_locked" : "do_locked");
			return 2;
		}
	}
	return 0;
}

static enum result run_counters(const struct target *t, const char *dir,
				enum increment_style style, int counters)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = check_open(mem, t, dir, "counter.tdb", VOLATILE_FLAGS);
	struct counter_arg a = { t, dir, style, counters, now_ms() + 300 };
	uint32_t total = 0, n;
	long start;
	int failed, i;
	char key[32];

	SKIP_SINGLE_PROCESS(t);
	CHECK_OPENED(db);
	start = now_ms();
	failed = run_children(increment_child, &a, PROCS, 90);
	CHECK(failed == 0, "%d of %d processes failed an increment; %s", failed, PROCS,
	      children_cause);
	for (i = 0; i < counters; i++) {
		snprintf(key, sizeof(key), "counter-%d", i);
		n = fetch_u32(db, key);
		CHECK(n != UINT32_MAX, "cannot read %s", key);
		total += n;
	}
	CHECK(total == PROCS * INCREMENTS, "lost updates: %u of %d increments landed",
	      total, PROCS * INCREMENTS);
	MEASURED("%d processes x %d increments in %ld ms", PROCS, INCREMENTS,
		 now_ms() - start);
	talloc_free(mem);
	return PASS;
}

static enum result check_counter(const struct target *t, const char *dir)
{
	return run_counters(t, dir, BY_FETCH_LOCKED, 1);
}

static enum result check_counters(const struct target *t, const char *dir)
{
	return run_counters(t, dir, BY_DO_LOCKED, COUNTERS);
}

static enum result check_mixed(const struct target *t, const char *dir)
{
	return run_counters(t, dir, MIXED, 1);
}

/* -- the holder reads its own writes ------------------------------------------ */

struct own_writes {
	struct db_context *db;
	NTSTATUS store, parse;
	bool exists, same;
};

static void same_as_stored(TDB_DATA key, TDB_DATA data, void *private_data)
{
	bool *same = private_data;

	*same = data.dsize == 4 && memcmp(data.dptr, "mine", 4) == 0;
}

static void own_writes_fn(struct db_record *rec, TDB_DATA value, void *private_data)
{
	struct own_writes *w = private_data;

	w->store = dbwrap_record_store(rec, str_data("mine"), 0);
	w->exists = dbwrap_exists(w->db, rec->key);
	w->parse = dbwrap_parse_record(w->db, rec->key, same_as_stored, &w->same);
}

static enum result check_own_writes(const struct target *t, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = check_open(mem, t, dir, "own.tdb", VOLATILE_FLAGS);
	struct own_writes w = { .db = db };
	struct db_record *rec;
	bool same = false;

	CHECK_OPENED(db);
	CHECK_STATUS(dbwrap_do_locked(db, str_data("k1"), own_writes_fn, &w), NT_STATUS_OK,
		     "do_locked");
	CHECK_STATUS(w.store, NT_STATUS_OK, "store in do_locked");
	CHECK(w.exists, "exists() in do_locked missed the holder's store");
	CHECK_STATUS(w.parse, NT_STATUS_OK, "parse_record in do_locked");
	CHECK(w.same, "parse_record in do_locked did not see the holder's store");

	rec = dbwrap_fetch_locked(db, mem, str_data("k2"));
	CHECK(rec != NULL, "fetch_locked failed");
	CHECK_STATUS(dbwrap_record_store(rec, str_data("mine"), 0), NT_STATUS_OK,
		     "store on a fetch_locked record");
	CHECK_STATUS(dbwrap_parse_record(db, str_data("k2"), same_as_stored, &same),
		     NT_STATUS_OK, "parse_record while holding the record");
	CHECK(same, "the fetch_locked holder did not see its own store");
	TALLOC_FREE(rec);
	talloc_free(mem);
	return PASS;
}

/* -- release on free and on SIGKILL ------------------------------------------ */

struct holder {
	pid_t pid;
	int to_parent;    /* read: the child says "held" */
	int to_child;     /* write: the parent says "go on" */
};

/*
 * A child that takes the lock on `key` with fetch_locked, tells the parent,
 * waits for "go on", then stores `value` and exits 0 if the store worked.
 */
static bool start_holder(const struct target *t, const char *dir, const char *key,
			 const char *value, struct holder *h)
{
	int up[2], down[2];
	char byte = 0;

	if (pipe(up) != 0 || pipe(down) != 0) {
		return false;
	}
	fflush(NULL);
	h->pid = fork();
	if (h->pid == 0) {
		TALLOC_CTX *mem = talloc_new(NULL);
		struct db_context *db = check_open(mem, t, dir, "hold.tdb", VOLATILE_FLAGS);
		struct db_record *rec = db ? dbwrap_fetch_locked(db, mem, str_data(key)) : NULL;
		NTSTATUS status;

		close(up[0]);
		close(down[1]);
		if (rec == NULL || write(up[1], "h", 1) != 1) {
			_exit(1);
		}
		if (read(down[0], &byte, 1) != 1) {
			_exit(1);
		}
		status = dbwrap_record_store(rec, str_data(value), 0);
		TALLOC_FREE(rec);
		_exit(NT_STATUS_IS_OK(status) ? 0 : 4);
	}
	close(up[1]);
	close(down[0]);
	h->to_parent = up[0];
	h->to_child = down[1];
	return h->pid > 0 && read(h->to_parent, &byte, 1) == 1;
}

static int finish_holder(struct holder *h)
{
	int wstatus = -1;

	if (write(h->to_child, "g", 1) != 1) {
		kill(h->pid, SIGKILL);
	}
	waitpid(h->pid, &wstatus, 0);
	close(h->to_parent);
	close(h->to_child);
	return WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
}

/*
 * Takes the lock on key in this process, retrying a failed fetch_locked
 * (a networked adapter may time out while a lease runs out) until
 * deadline_ms. Returns the record, or NULL.
 */
static struct db_record *lock_until(struct db_context *db, TALLOC_CTX *mem,
				    const char *key, long deadline_ms)
{
	struct db_record *rec = NULL;

	while (rec == NULL && now_ms() < deadline_ms) {
		rec = dbwrap_fetch_locked(db, mem, str_data(key));
		if (rec == NULL) {
			sleep_ms(10);
		}
	}
	return rec;
}

/*
 * A child that tries to lock and store; exit 0 when it did. With ready and
 * go (pipe ends, else -1) it first opens the database, writes a byte to
 * ready and waits for one on go, the parent's "try now": the time a check
 * allows it then counts from its try, not from its open (an adapter's open
 * starts Python and makes a server's round trips, on a loaded machine more
 * than the 500 ms a check waits, and a lock that let it in went unseen).
 */
static pid_t start_contender_at(const struct target *t, const char *dir, const char *key,
				const char *value, long within_ms, int ready, int go)
{
	pid_t pid;

	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		TALLOC_CTX *mem;
		struct db_context *db;
		struct db_record *rec;
		char byte = 0;

		alarm(within_ms / 1000 + 60);
		mem = talloc_new(NULL);
		db = check_open(mem, t, dir, "hold.tdb", VOLATILE_FLAGS);
		if (ready >= 0 && (db == NULL || write(ready, "o", 1) != 1 ||
				   read(go, &byte, 1) != 1)) {
			_exit(1);
		}
		rec = db ? lock_until(db, mem, key, now_ms() + within_ms) : NULL;
		_exit(rec != NULL && NT_STATUS_IS_OK(dbwrap_record_store(
			rec, str_data(value), 0)) ? 0 : 1);
	}
	return pid;
}

static pid_t start_contender(const struct target *t, const char *dir,
			     const char *key, const char *value, long within_ms)
{
	return start_contender_at(t, dir, key, value, within_ms, -1, -1);
}

/*
 * start_contender_at with its pipes: returns once the contender has opened
 * the database (c->pid -1 if it could not); release_contender says "try now".
 */
static void start_opened_contender(const struct target *t, const char *dir, const char *key,
				   const char *value, long within_ms, struct holder *c)
{
	int up[2], down[2];
	char byte = 0;

	c->pid = -1;
	if (pipe(up) != 0) {
		return;
	}
	if (pipe(down) != 0) {
		close(up[0]);
		close(up[1]);
		return;
	}
	c->pid = start_contender_at(t, dir, key, value, within_ms, up[1], down[0]);
	close(up[1]);
	close(down[0]);
	c->to_parent = up[0];
	c->to_child = down[1];
	if (c->pid > 0 && read(c->to_parent, &byte, 1) != 1) {
		waitpid(c->pid, NULL, 0);
		c->pid = -1;
	}
}

static bool release_contender(struct holder *c)
{
	bool sent = write(c->to_child, "g", 1) == 1;

	close(c->to_parent);
	close(c->to_child);
	return sent;
}

/* Did pid exit (0 if so, -1 if still running), with status 0? */
static int exited_ok(pid_t pid, long wait_ms)
{
	long deadline = now_ms() + wait_ms;
	int wstatus;

	do {
		if (waitpid(pid, &wstatus, WNOHANG) == pid) {
			return WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0 ? 0 : 1;
		}
		sleep_ms(5);
	} while (now_ms() < deadline);
	return -1;
}

static long release_limit_ms(const struct target *t)
{
	return (long)(t->lock_release_seconds * 1000) + 1000;
}

static enum result check_release_on_free(const struct target *t, const char *dir)
{
	struct holder h, c;
	pid_t contender;
	int rc;

	SKIP_SINGLE_PROCESS(t);
	start_opened_contender(t, dir, "free", "contender", 30000, &c);
	CHECK(c.pid > 0, "the contender could not open the database");
	contender = c.pid;
	if (!start_holder(t, dir, "free", "holder", &h)) {
		kill(contender, SIGKILL);
		release_contender(&c);
		waitpid(contender, NULL, 0);
		CHECK(false, "the holder could not lock");
	}
	CHECK(release_contender(&c), "the contender was gone before it tried");
	rc = exited_ok(contender, 500);
	CHECK(rc == -1, "another process got the lock while it was held");
	CHECK(finish_holder(&h) == 0, "the holder's store failed");
	rc = exited_ok(contender, 5000);
	if (rc == -1) {
		kill(contender, SIGKILL);
		waitpid(contender, NULL, 0);
	}
	CHECK(rc == 0, "the lock was not free within 5 s of freeing the record");
	return PASS;
}

static enum result check_release_on_kill(const struct target *t, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db;
	struct db_record *rec;
	struct holder h;
	long killed, waited;

	SKIP_SINGLE_PROCESS(t);
	/* opened first: a lease runs from the holder's lock, and an open after
	 * it (300-900 ms under load) came out of the measured wait */
	db = check_open(mem, t, dir, "hold.tdb", VOLATILE_FLAGS);
	CHECK_OPENED(db);
	CHECK(start_holder(t, dir, "killed", "never", &h), "the holder could not lock");
	kill(h.pid, SIGKILL);
	killed = now_ms();
	finish_holder(&h);
	rec = lock_until(db, mem, "killed", killed + release_limit_ms(t) + 10000);
	waited = now_ms() - killed;
	CHECK(rec != NULL, "the lock was still held %ld ms after its holder was killed",
	      waited);
	MEASURED("lock free %ld ms after SIGKILL (declared %.1f s)", waited,
		 t->lock_release_seconds);
	CHECK(waited <= release_limit_ms(t),
	      "the lock was free only %ld ms after SIGKILL; declared %.1f s",
	      waited, t->lock_release_seconds);
	talloc_free(mem);
	return PASS;
}

/*
 * Fencing. A holder is paused with SIGSTOP. If locks never expire (tdb), no
 * other process may get the lock meanwhile. If they expire after a lease,
 * another process takes the lock and writes; the resumed holder's write
 * must then fail, and the value must stay the other process's.
 */
static enum result check_fencing(const struct target *t, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	long pause_ms = t->lock_release_seconds > 0 ? release_limit_ms(t) + 500 : 1500;
	struct db_context *db;
	struct holder h;
	pid_t contender;
	int rc, holder_rc;

	SKIP_SINGLE_PROCESS(t);
	db = check_open(mem, t, dir, "hold.tdb", VOLATILE_FLAGS);
	CHECK_OPENED(db);
	CHECK(start_holder(t, dir, "fenced", "stale-holder", &h), "the holder could not lock");
	kill(h.pid, SIGSTOP);
	contender = start_contender(t, dir, "fenced", "contender", pause_ms + 10000);
	CHECK(contender > 0, "fork failed");
	rc = exited_ok(contender, pause_ms);
	kill(h.pid, SIGCONT);
	holder_rc = finish_holder(&h);
	if (rc == -1) {
		rc = exited_ok(contender, 15000);
	}
	if (rc == -1) {
		kill(contender, SIGKILL);
		waitpid(contender, NULL, 0);
	}
	if (t->lock_release_seconds <= 0) {
		CHECK(holder_rc == 0, "the resumed holder's store failed (status %d)", holder_rc);
		CHECK(rc == 0, "the contender never got the lock after the holder let go");
		CHECK(has_value(db, "fenced", "contender"),
		      "the contender wrote while the paused holder still held the lock");
		MEASURED("paused holder kept the lock for %ld ms; no lease to outlive", pause_ms);
	} else {
		CHECK(rc == 0, "the contender did not get the lock within %ld ms of the "
		      "holder's pause (declared lease %.1f s)", pause_ms, t->lock_release_seconds);
		CHECK(holder_rc != 0, "the holder's write after losing its lease succeeded: "
		      "no fencing");
		CHECK(has_value(db, "fenced", "contender"),
		      "the value is not the contender's: the stale holder overwrote it");
		MEASURED("stale holder refused after a %ld ms pause", pause_ms);
	}
	talloc_free(mem);
	return PASS;
}

/*
 * do_locked's value must stay what it was while the callback writes: Samba's
 * db_tdb_do_locked hands over a copy. A backend that passes its own memory
 * (tdb's mmap) fails here. The callback can only write its own record
 * (dbwrap's lock order forbids a second lock on the database), and does:
 * it stores a large value (4 MiB, or the adapter's declared limit), which
 * grows the file and moves the map; deletes
 * the record, so its space goes back to tdb's free list; and inserts a
 * value of the first size, which takes that space. After each, it reads the
 * value it was handed again.
 */
#define HANDED_SIZE 300
#define GROWN_SIZE (4 * 1024 * 1024)

struct handed_state {
	size_t grown_size; /* GROWN_SIZE, or the adapter's declared limit */
	uint8_t copy[HANDED_SIZE];
	bool unchanged;
	char why[200];
};

static bool handed_same(struct handed_state *state, TDB_DATA value, const char *after)
{
	if (memcmp(state->copy, value.dptr, HANDED_SIZE) == 0) {
		return true;
	}
	snprintf(state->why, sizeof(state->why),
		 "the value handed to the callback changed under it after %s", after);
	return false;
}

static bool handed_write(struct handed_state *state, NTSTATUS status, const char *what)
{
	if (NT_STATUS_IS_OK(status)) {
		return true;
	}
	snprintf(state->why, sizeof(state->why), "%s inside do_locked failed: %s", what,
		 nt_errstr(status));
	return false;
}

static void handed_fn(struct db_record *rec, TDB_DATA value, void *private_data)
{
	struct handed_state *state = private_data;
	static uint8_t other[GROWN_SIZE];

	if (value.dsize != HANDED_SIZE) {
		snprintf(state->why, sizeof(state->why), "handed %zu bytes, stored %d",
			 value.dsize, HANDED_SIZE);
		return;
	}
	memcpy(state->copy, value.dptr, value.dsize);
	memset(other, 'x', sizeof(other));
	state->unchanged =
		handed_write(state, dbwrap_record_store(rec, (TDB_DATA) { other, state->grown_size },
							TDB_MODIFY), "TDB_MODIFY") &&
		handed_same(state, value, "a TDB_MODIFY that grew the file") &&
		handed_write(state, dbwrap_record_delete(rec), "delete") &&
		handed_same(state, value, "deleting the record") &&
		handed_write(state, dbwrap_record_store(rec, (TDB_DATA) { other, HANDED_SIZE },
							TDB_INSERT), "TDB_INSERT") &&
		handed_same(state, value, "a same-size TDB_INSERT");
}

static enum result check_handed_value(const struct target *t, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = check_open(mem, t, dir, "handed.tdb", VOLATILE_FLAGS);
	struct handed_state state = {
		.grown_size = (t->max_value_size != 0 && t->max_value_size < GROWN_SIZE)
			? t->max_value_size : GROWN_SIZE,
		.unchanged = false,
	};
	uint8_t stored[HANDED_SIZE];
	TDB_DATA key = str_data("handed"), value;
	size_t i;

	CHECK_OPENED(db);
	for (i = 0; i < sizeof(stored); i++) {
		stored[i] = (uint8_t)(i * 7 + 1);
	}
	CHECK_STATUS(dbwrap_store(db, key, (TDB_DATA) { stored, sizeof(stored) }, 0),
		     NT_STATUS_OK, "store");
	CHECK_STATUS(dbwrap_do_locked(db, key, handed_fn, &state), NT_STATUS_OK, "do_locked");
	CHECK(state.unchanged, "%s", state.why);
	CHECK_STATUS(dbwrap_fetch(db, mem, key, &value), NT_STATUS_OK, "fetch afterwards");
	CHECK(value.dsize == HANDED_SIZE, "after do_locked the record has %zu bytes, expected %d",
	      value.dsize, HANDED_SIZE);
	MEASURED("unchanged after a %zu KiB TDB_MODIFY, a delete and a same-size TDB_INSERT",
		 state.grown_size / 1024);
	talloc_free(mem);
	return PASS;
}

const struct check locking_checks[] = {
	{ "lock.counter", "§1.1: fetch_locked excludes other processes: N x M increments, none lost",
	  check_counter },
	{ "lock.counters", "§1.5: do_locked excludes other processes on each of several keys",
	  check_counters },
	{ "lock.mixed", "§1.1/§1.5: fetch_locked and do_locked exclude each other",
	  check_mixed },
	{ "lock.own-writes", "§1.5/§1.11: the holder reads its own writes while it holds the lock",
	  check_own_writes },
	{ "lock.handed-value", "§1.5: do_locked's value stays valid while the callback writes (Samba hands a copy)",
	  check_handed_value },
	{ "lock.release-on-free", "§1.1: freeing the record releases the lock",
	  check_release_on_free },
	{ "lock.release-on-kill", "§1.1: a killed holder's lock is released (at once for tdb, else within the lease)",
	  check_release_on_kill },
	{ "lock.fencing", "§3.3: a holder paused past its lease cannot overwrite the next holder's data",
	  check_fencing },
	{ NULL },
};
