/*
 * The history check: concurrent clients read, write and atomically
 * increment a few keys, recording when each call started and returned, and
 * Porcupine (the checker in conformance/linearizability) decides whether the
 * results could have come from the calls taking effect one at a time, each
 * somewhere between its call and its return: linearizability.
 */

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

#define CLIENTS 4
#define KEYS 3
#define OPS_PER_CLIENT 150
#define CLIENT_SECONDS 60
#define CHECKER_TIMEOUT "30s"      /* Porcupine's own limit, exit 3 */
#define CHECKER_SECONDS 40         /* then the process is killed */
#define START_DELAY_NS 300000000LL /* clients start together, after opening */
#define HOLD_NS 100000L            /* an increment holds its lock this long */

static const char *const keys[KEYS] = { "k0", "k1", "k2" };

struct history_op {
	const char *kind;   /* "get", "put" or "rmw" */
	int key;
	uint32_t input;     /* put: the value written */
	uint32_t output;    /* get: the value read; rmw: the value before */
	int64_t call, ret;  /* CLOCK_MONOTONIC, ns */
};

struct history_run {
	const struct target *t;
	const char *dir;
	int64_t start_ns;
};

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void get_parser(TDB_DATA key, TDB_DATA data, void *private_data)
{
	uint32_t *v = private_data;

	*v = value_u32(data);
}

/* A read by parse_record or by fetch; NULL, or what went wrong. */
static const char *history_get(TALLOC_CTX *mem, struct db_context *db,
			       struct history_op *op, bool by_fetch)
{
	TDB_DATA key = str_data(keys[op->key]), value = tdb_null;
	NTSTATUS status;

	op->kind = "get";
	op->output = UINT32_MAX;
	op->call = now_ns();
	if (by_fetch) {
		status = dbwrap_fetch(db, mem, key, &value);
		op->output = value_u32(value);
	} else {
		status = dbwrap_parse_record(db, key, get_parser, &op->output);
	}
	op->ret = now_ns();
	if (!NT_STATUS_IS_OK(status)) {
		return talloc_asprintf(mem, "%s %s: %s", by_fetch ?
				       "fetch" : "parse_record",
				       keys[op->key], nt_errstr(status));
	}
	if (op->output == UINT32_MAX) {
		return talloc_asprintf(mem, "%s holds a value that is not 4 bytes",
				       keys[op->key]);
	}
	return NULL;
}

static const char *history_put(TALLOC_CTX *mem, struct db_context *db,
			       struct history_op *op)
{
	NTSTATUS status;

	op->kind = "put";
	op->call = now_ns();
	status = dbwrap_store(db, str_data(keys[op->key]), u32_data(&op->input), 0);
	op->ret = now_ns();
	if (!NT_STATUS_IS_OK(status)) {
		return talloc_asprintf(mem, "store %s: %s", keys[op->key],
				       nt_errstr(status));
	}
	return NULL;
}

struct rmw_state {
	bool called;
	uint32_t old;
	NTSTATUS stored;
};

/* Reads the old value, holds the lock a little, stores the old value + 1. */
static void rmw_fn(struct db_record *rec, TDB_DATA value, void *private_data)
{
	struct rmw_state *s = private_data;
	uint32_t v = value_u32(value);

	s->called = true;
	s->old = v;
	/* without exclusion, updates now get lost */
	nanosleep(&(struct timespec) { 0, HOLD_NS }, NULL);
	if (v != UINT32_MAX) {
		v += 1;
		s->stored = dbwrap_record_store(rec, u32_data(&v), 0);
	}
}

/* The same with fetch_locked: the lock goes with the record. */
static bool rmw_fetch_locked(TALLOC_CTX *mem, struct db_context *db,
			     TDB_DATA key, struct rmw_state *s)
{
	struct db_record *rec = dbwrap_fetch_locked(db, mem, key);

	if (rec == NULL) {
		return false;
	}
	rmw_fn(rec, dbwrap_record_get_value(rec), s);
	TALLOC_FREE(rec);
	return true;
}

/* An atomic increment; the output is the value before. */
static const char *history_rmw(TALLOC_CTX *mem, struct db_context *db,
			       struct history_op *op, bool by_fetch_locked)
{
	struct rmw_state s = { .stored = NT_STATUS_OK };
	TDB_DATA key = str_data(keys[op->key]);
	const char *how = by_fetch_locked ? "fetch_locked" : "do_locked";
	NTSTATUS status = NT_STATUS_OK;
	bool locked = true;

	op->kind = "rmw";
	op->call = now_ns();
	if (by_fetch_locked) {
		locked = rmw_fetch_locked(mem, db, key, &s);
	} else {
		status = dbwrap_do_locked(db, key, rmw_fn, &s);
	}
	op->ret = now_ns();
	op->output = s.old;
	if (!locked) {
		return talloc_asprintf(mem, "fetch_locked %s failed", keys[op->key]);
	}
	if (!NT_STATUS_IS_OK(status)) {
		return talloc_asprintf(mem, "%s %s: %s", how, keys[op->key],
				       nt_errstr(status));
	}
	if (!NT_STATUS_IS_OK(s.stored)) {
		return talloc_asprintf(mem, "%s %s: its store: %s", how,
				       keys[op->key], nt_errstr(s.stored));
	}
	if (!s.called) {
		return talloc_asprintf(mem, "do_locked %s did not call its function",
				       keys[op->key]);
	}
	if (s.old == UINT32_MAX) {
		return talloc_asprintf(mem, "%s holds a value that is not 4 bytes",
				       keys[op->key]);
	}
	return NULL;
}

/*
 * Operation seq of client: 40% reads (parse_record, fetch), 20% writes,
 * 40% increments (do_locked, fetch_locked).
 */
static const char *history_op(TALLOC_CTX *mem, struct db_context *db,
			      struct history_op *op, int client, int seq,
			      unsigned *seed)
{
	int dice = rand_r(seed) % 10;

	op->key = rand_r(seed) % KEYS;
	op->input = 0;
	if (dice < 4) {
		return history_get(mem, db, op, dice % 2 == 0);
	}
	if (dice < 6) {
		/* unique: increments never add up to the next 1000 */
		op->input = (client + 1) * 1000000 + (seq + 1) * 1000;
		return history_put(mem, db, op);
	}
	return history_rmw(mem, db, op, dice % 2 == 1);
}

static bool write_history(const char *dir, int client,
			  const struct history_op *ops, int n)
{
	char path[700];
	FILE *f;
	int i;

	snprintf(path, sizeof(path), "%s/history-%d.jsonl", dir, client);
	f = fopen(path, "w");
	if (f == NULL) {
		return false;
	}
	for (i = 0; i < n; i++) {
		fprintf(f, "{\"client\":%d,\"op\":\"%s\",\"key\":\"%s\","
			"\"input\":%u,\"output\":%u,\"call\":%lld,\"return\":%lld}\n",
			client, ops[i].kind, keys[ops[i].key], ops[i].input,
			ops[i].output, (long long)ops[i].call, (long long)ops[i].ret);
	}
	return fclose(f) == 0;
}

/* Why client failed, for the parent: <dir>/client-<i>.err. */
static void write_problem(const char *dir, int client, const char *problem)
{
	char path[700];
	FILE *f;

	snprintf(path, sizeof(path), "%s/client-%d.err", dir, client);
	f = fopen(path, "w");
	if (f != NULL) {
		fprintf(f, "client %d: %s", client, problem);
		fclose(f);
	}
}

static void wait_until(int64_t ns)
{
	struct timespec ts = { ns / 1000000000LL, ns % 1000000000LL };

	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
	}
}

static int history_client(void *arg, int index)
{
	struct history_run *run = arg;
	TALLOC_CTX *mem = talloc_new(NULL);
	struct history_op ops[OPS_PER_CLIENT];
	struct db_context *db = check_open(mem, run->t, run->dir, "history.tdb",
					   VOLATILE_FLAGS);
	unsigned seed = 0x5eed + index;
	const char *problem = db == NULL ? check_note : NULL;
	int i;

	wait_until(run->start_ns);
	for (i = 0; problem == NULL && i < OPS_PER_CLIENT; i++) {
		problem = history_op(mem, db, &ops[i], index, i, &seed);
	}
	if (problem == NULL && !write_history(run->dir, index, ops, OPS_PER_CLIENT)) {
		problem = "cannot write its history";
	}
	if (problem != NULL) {
		write_problem(run->dir, index, problem);
		return 1;
	}
	talloc_free(mem);
	return 0;
}

/* The first client's reason for failing, or a guess. */
static const char *client_problem(TALLOC_CTX *mem, const char *dir)
{
	char line[400];
	int i;

	for (i = 0; i < CLIENTS; i++) {
		char *path = talloc_asprintf(mem, "%s/client-%d.err", dir, i);
		FILE *f = fopen(path, "r");
		bool got = f != NULL && fgets(line, sizeof(line), f) != NULL;

		if (f != NULL) {
			fclose(f);
		}
		if (got) {
			return talloc_strdup(mem, line);
		}
	}
	return "none said why (killed, or over the time limit)";
}

/* Joins the clients' histories into path; the number of operations or -1. */
static int join_histories(TALLOC_CTX *mem, const char *dir, const char *path)
{
	FILE *out = fopen(path, "w");
	char line[400];
	int i, n = 0;

	if (out == NULL) {
		return -1;
	}
	for (i = 0; i < CLIENTS; i++) {
		FILE *in = fopen(talloc_asprintf(mem, "%s/history-%d.jsonl", dir, i), "r");

		if (in == NULL) {
			fclose(out);
			return -1;
		}
		while (fgets(line, sizeof(line), in) != NULL) {
			fputs(line, out);
			n++;
		}
		fclose(in);
	}
	return fclose(out) == 0 ? n : -1;
}

/* Reads fd to its end or the deadline, keeping what fits in out. */
static void read_output(int fd, char *out, size_t size, long deadline)
{
	struct pollfd pfd = { .fd = fd, .events = POLLIN };
	size_t used = 0;
	char buf[1024];
	ssize_t got;

	out[0] = '\0';
	while (now_ms() < deadline && poll(&pfd, 1, deadline - now_ms()) > 0) {
		got = read(fd, buf, sizeof(buf));
		if (got <= 0) {
			break;
		}
		if (used + 1 < size) {
			size_t take = (size_t)got < size - 1 - used ?
				      (size_t)got : size - 1 - used;

			memcpy(out + used, buf, take);
			used += take;
			out[used] = '\0';
		}
	}
	while (used > 0 && out[used - 1] == '\n') {
		out[--used] = '\0';
	}
}

/*
 * Runs the checker on history, its output (stdout and stderr) in out.
 * Returns its exit status, -1 when it overran CHECKER_SECONDS and was
 * killed, -2 when it could not start.
 */
static int run_checker(const char *checker, const char *history, char *out,
		       size_t size)
{
	long deadline = now_ms() + CHECKER_SECONDS * 1000L;
	int fds[2], wstatus;
	pid_t pid;

	if (pipe(fds) != 0) {
		snprintf(out, size, "pipe: %s", strerror(errno));
		return -2;
	}
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		dup2(fds[1], STDOUT_FILENO);
		dup2(fds[1], STDERR_FILENO);
		close(fds[0]);
		close(fds[1]);
		execl(checker, checker, "-timeout", CHECKER_TIMEOUT, history,
		      (char *)NULL);
		fprintf(stderr, "cannot run %s: %s\n", checker, strerror(errno));
		_exit(127);
	}
	close(fds[1]);
	if (pid < 0) {
		snprintf(out, size, "fork: %s", strerror(errno));
		close(fds[0]);
		return -2;
	}
	read_output(fds[0], out, size, deadline);
	close(fds[0]);
	while (waitpid(pid, &wstatus, WNOHANG) == 0) {
		if (now_ms() >= deadline) {
			kill(pid, SIGKILL);
			waitpid(pid, &wstatus, 0);
			return -1;
		}
		sleep_ms(10);
	}
	return WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
}

static enum result check_linearizability(const struct target *t, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct history_run run = { .t = t, .dir = dir };
	char *history = talloc_asprintf(mem, "%s/history.jsonl", dir);
	char output[sizeof(check_note) - 64];
	struct db_context *db;
	uint32_t zero = 0;
	int i, failed, ops, code;
	long start;

	if (!t->multi_process) {
		SKIP_BECAUSE("single-process adapter: no concurrent clients");
	}
	if (t->checker == NULL) {
		SKIP_BECAUSE("no linearizability checker: build it with make");
	}
	db = check_open(mem, t, dir, "history.tdb", VOLATILE_FLAGS);
	if (db == NULL) {
		return FAIL; /* check_open wrote the note */
	}
	for (i = 0; i < KEYS; i++) {
		CHECK_STATUS(dbwrap_store(db, str_data(keys[i]), u32_data(&zero), 0),
			     NT_STATUS_OK, "store of the initial 0");
	}
	run.start_ns = now_ns() + START_DELAY_NS;
	failed = run_children(history_client, &run, CLIENTS, CLIENT_SECONDS);
	CHECK(failed == 0, "%d of %d clients failed; %s; %s", failed, CLIENTS,
	      client_problem(mem, dir), children_cause);
	ops = join_histories(mem, dir, history);
	CHECK(ops > 0, "cannot join the clients' histories into %s", history);

	start = now_ms();
	code = run_checker(t->checker, history, output, sizeof(output));
	MEASURED("%d operations by %d clients on %d keys; checked in %ld ms",
		 ops, CLIENTS, KEYS, now_ms() - start);
	CHECK(code != 1, "%s", output);
	CHECK(code != 3, "checker timed out (undecided after %s)", CHECKER_TIMEOUT);
	CHECK(code != -1, "checker did not finish within %d s", CHECKER_SECONDS);
	CHECK(code == 0, "checker failed (exit %d): %s", code, output);
	talloc_free(mem);
	return PASS;
}

const struct check history_checks[] = {
	{ "history.linearizability",
	  "§1.1/§1.5: fetch_locked and do_locked make read-modify-write atomic; "
	  "parse_record reads the latest committed value (concurrent gets, "
	  "stores and locked increments must be linearizable)",
	  check_linearizability },
	{ NULL },
};
