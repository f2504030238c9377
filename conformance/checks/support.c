/*
 * What the checks share: opening a database on the target, child processes
 * with a time limit, and counters stored as 4-byte values.
 */

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

char check_note[512];
char check_measured[256];

struct db_context *check_open(TALLOC_CTX *mem_ctx, const struct target *t,
			      const char *dir, const char *file, int tdb_flags)
{
	char *path = talloc_asprintf(mem_ctx, "%s/%s", dir, file);
	struct db_context *db;

	if (t->adapter == NULL) {
		db = db_open_tdb(mem_ctx, path, 0, tdb_flags, O_RDWR | O_CREAT,
				 0600, DBWRAP_LOCK_ORDER_1, 0);
	} else {
		db = db_open_py(mem_ctx, path, 0, tdb_flags, O_RDWR | O_CREAT,
				0600, DBWRAP_LOCK_ORDER_1, 0, t->adapter,
				t->options);
	}
	if (db == NULL) {
		snprintf(check_note, sizeof(check_note), "open of %s failed: %s",
			 file, strerror(errno));
	}
	return db;
}

static void reap_late(pid_t *pids, int n)
{
	int i, wstatus;

	for (i = 0; i < n; i++) {
		if (pids[i] > 0) {
			kill(pids[i], SIGKILL);
			waitpid(pids[i], &wstatus, 0);
		}
	}
}

int run_children(int (*fn)(void *arg, int index), void *arg, int n,
		 unsigned seconds)
{
	pid_t pids[64];
	long deadline = now_ms() + seconds * 1000L;
	int i, failed = 0, running = 0, wstatus;

	if (n > 64) {
		return n;
	}
	fflush(NULL);
	for (i = 0; i < n; i++) {
		pids[i] = fork();
		if (pids[i] == 0) {
			alarm(seconds + 5); /* a hung child must not outlive the check */
			_exit(fn(arg, i));
		}
		if (pids[i] < 0) {
			failed++;
		} else {
			running++;
		}
	}
	while (running > 0 && now_ms() < deadline) {
		for (i = 0; i < n; i++) {
			if (pids[i] <= 0 || waitpid(pids[i], &wstatus, WNOHANG) == 0) {
				continue;
			}
			if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
				failed++;
			}
			pids[i] = 0;
			running--;
		}
		sleep_ms(5);
	}
	failed += running;
	reap_late(pids, n);
	return failed;
}

long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
	}
}

void sleep_until_ms(long at)
{
	long left = at - now_ms();

	if (left > 0) {
		sleep_ms(left);
	}
}

uint32_t value_u32(TDB_DATA value)
{
	uint32_t v = UINT32_MAX;

	if (value.dsize == sizeof(v)) {
		memcpy(&v, value.dptr, sizeof(v));
	}
	return v;
}

uint32_t fetch_u32(struct db_context *db, const char *key)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	TDB_DATA value = tdb_null;
	NTSTATUS status = dbwrap_fetch(db, mem, str_data(key), &value);
	uint32_t v;

	if (NT_STATUS_EQUAL(status, NT_STATUS_NOT_FOUND)) {
		v = 0;
	} else if (!NT_STATUS_IS_OK(status)) {
		v = UINT32_MAX;
	} else {
		v = value_u32(value);
	}
	talloc_free(mem);
	return v;
}

bool has_value(struct db_context *db, const char *key, const char *want)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	TDB_DATA got;
	bool same = NT_STATUS_IS_OK(dbwrap_fetch(db, mem, str_data(key), &got)) &&
		    got.dsize == strlen(want) && memcmp(got.dptr, want, got.dsize) == 0;

	talloc_free(mem);
	return same;
}

static uint32_t next_count(TDB_DATA value)
{
	return value.dsize == 0 ? 1 : value_u32(value) + 1;
}

unsigned increment_hold_us;

/* Holding the lock a moment widens the window a broken lock leaves open. */
static void hold_a_moment(void)
{
	struct timespec ts = { 0, increment_hold_us * 1000L };

	if (increment_hold_us > 0) {
		nanosleep(&ts, NULL);
	}
}

bool increment_fetch_locked(struct db_context *db, const char *key)
{
	struct db_record *rec = dbwrap_fetch_locked(db, NULL, str_data(key));
	uint32_t v;
	bool ok;

	if (rec == NULL) {
		return false;
	}
	v = next_count(dbwrap_record_get_value(rec));
	hold_a_moment();
	ok = NT_STATUS_IS_OK(dbwrap_record_store(rec, u32_data(&v), 0));
	talloc_free(rec);
	return ok;
}

static void increment_fn(struct db_record *rec, TDB_DATA value,
			 void *private_data)
{
	bool *ok = private_data;
	uint32_t v = next_count(value);

	hold_a_moment();
	*ok = NT_STATUS_IS_OK(dbwrap_record_store(rec, u32_data(&v), 0));
}

bool increment_do_locked(struct db_context *db, const char *key)
{
	bool ok = false;
	NTSTATUS status = dbwrap_do_locked(db, str_data(key), increment_fn, &ok);

	return NT_STATUS_IS_OK(status) && ok;
}
