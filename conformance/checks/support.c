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

char children_cause[384];

/* One child's stderr: echoed to ours, its last line kept as the cause. */
struct child_err {
	int fd;            /* read end of the child's stderr; -1 once closed */
	char tail[256];    /* the last bytes it wrote */
	size_t len;
};

static void child_err_drain(struct child_err *e)
{
	char buf[1024];
	ssize_t n = -1;
	size_t keep;

	while (e->fd >= 0 && (n = read(e->fd, buf, sizeof(buf))) != 0) {
		if (n < 0) {
			if (errno != EINTR) {
				break; /* EAGAIN: nothing more for now */
			}
			continue;
		}
		fwrite(buf, 1, n, stderr);
		keep = (size_t)n < sizeof(e->tail) - 1 ? (size_t)n : sizeof(e->tail) - 1;
		if (e->len + keep > sizeof(e->tail) - 1) {
			size_t drop = e->len + keep - (sizeof(e->tail) - 1);
			memmove(e->tail, e->tail + drop, e->len - drop);
			e->len -= drop;
		}
		memcpy(e->tail + e->len, buf + n - keep, keep);
		e->len += keep;
		e->tail[e->len] = '\0';
	}
	if (n == 0 && e->fd >= 0) {
		close(e->fd);
		e->fd = -1;
	}
}

/* The last two lines a child wrote, on one line, or a placeholder. */
static const char *child_err_last_lines(struct child_err *e)
{
	char *nl, *start;

	while (e->len > 0 && (e->tail[e->len - 1] == '\n' || e->tail[e->len - 1] == '\r')) {
		e->tail[--e->len] = '\0';
	}
	if (e->len == 0) {
		return "it wrote nothing to stderr";
	}
	nl = strrchr(e->tail, '\n');
	if (nl == NULL) {
		return e->tail;
	}
	*nl = '\0';
	start = strrchr(e->tail, '\n');
	*nl = '\n';
	start = start != NULL ? start + 1 : e->tail;
	for (nl = start; (nl = strchr(nl, '\n')) != NULL;) {
		*nl = ' '; /* one line in the note */
	}
	return start;
}

/* The first failed child's cause goes to children_cause. */
static void note_child_failure(int index, int wstatus, bool overran,
			       struct child_err *e)
{
	char how[64];

	if (children_cause[0] != '\0') {
		return;
	}
	if (overran) {
		snprintf(how, sizeof(how), "still running at the time limit");
	} else if (WIFSIGNALED(wstatus)) {
		snprintf(how, sizeof(how), "killed by signal %d", WTERMSIG(wstatus));
	} else {
		snprintf(how, sizeof(how), "exit %d", WEXITSTATUS(wstatus));
	}
	child_err_drain(e);
	snprintf(children_cause, sizeof(children_cause), "child %d: %s: %s",
		 index, how, child_err_last_lines(e));
}

static pid_t start_child(int (*fn)(void *arg, int index), void *arg, int index,
			 unsigned seconds, struct child_err *e)
{
	int fds[2], rc;
	pid_t pid;

	e->fd = -1;
	e->len = 0;
	e->tail[0] = '\0';
	if (pipe(fds) != 0) {
		return -1;
	}
	pid = fork();
	if (pid == 0) {
		close(fds[0]);
		dup2(fds[1], STDERR_FILENO);
		close(fds[1]);
		alarm(seconds + 5); /* a hung child must not outlive the check */
		check_note[0] = '\0';
		rc = fn(arg, index);
		if (rc != 0 && check_note[0] != '\0') {
			fprintf(stderr, "%s\n", check_note); /* e.g. check_open's */
		}
		fflush(stderr);
		_exit(rc);
	}
	close(fds[1]);
	if (pid < 0) {
		close(fds[0]);
		return pid;
	}
	fcntl(fds[0], F_SETFL, O_NONBLOCK);
	e->fd = fds[0];
	return pid;
}

int run_children(int (*fn)(void *arg, int index), void *arg, int n,
		 unsigned seconds)
{
	pid_t pids[64];
	struct child_err errs[64];
	long deadline = now_ms() + seconds * 1000L;
	int i, failed = 0, running = 0, wstatus;

	children_cause[0] = '\0';
	if (n > 64) {
		snprintf(children_cause, sizeof(children_cause),
			 "%d children asked for, at most 64", n);
		return n;
	}
	fflush(NULL);
	for (i = 0; i < n; i++) {
		pids[i] = start_child(fn, arg, i, seconds, &errs[i]);
		if (pids[i] < 0) {
			failed++;
			if (children_cause[0] == '\0') {
				snprintf(children_cause, sizeof(children_cause),
					 "child %d: fork failed: %s", i, strerror(errno));
			}
		} else {
			running++;
		}
	}
	while (running > 0 && now_ms() < deadline) {
		for (i = 0; i < n; i++) {
			if (pids[i] <= 0) {
				continue;
			}
			child_err_drain(&errs[i]);
			if (waitpid(pids[i], &wstatus, WNOHANG) == 0) {
				continue;
			}
			if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
				failed++;
				note_child_failure(i, wstatus, false, &errs[i]);
			}
			pids[i] = 0;
			running--;
		}
		sleep_ms(5);
	}
	failed += running;
	for (i = 0; i < n; i++) {
		if (pids[i] > 0) {
			note_child_failure(i, 0, true, &errs[i]);
		}
	}
	reap_late(pids, n);
	for (i = 0; i < n; i++) {
		if (errs[i].fd >= 0) {
			child_err_drain(&errs[i]);
			if (errs[i].fd >= 0) {
				close(errs[i].fd);
			}
		}
	}
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
