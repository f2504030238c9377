/*
 * A misbehaving adapter never crashes the host: every failure becomes an
 * NTSTATUS at the dbwrap level and exactly one log line naming the database,
 * the operation and the exception. Uses tests/fixtures/.../misbehaving.py.
 */

#include <Python.h> /* only to check the bridge's GIL and lazy-start rules */

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"

#define MISBEHAVING "dbwrap_py_fixtures.misbehaving"

struct capture {
	int saved_fd;
	char path[512];
};

static void capture_start(struct capture *c, const char *dir)
{
	int fd;

	snprintf(c->path, sizeof(c->path), "%s/stderr.log", dir);
	fflush(stderr);
	c->saved_fd = dup(2);
	fd = open(c->path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
	dup2(fd, 2);
	close(fd);
}

/* The captured text (talloc'ed on mem); stderr is restored. */
static char *capture_end(struct capture *c, TALLOC_CTX *mem)
{
	char buf[8192];
	ssize_t n;
	int fd;

	fflush(stderr);
	dup2(c->saved_fd, 2);
	close(c->saved_fd);
	fd = open(c->path, O_RDONLY);
	n = (fd >= 0) ? read(fd, buf, sizeof(buf) - 1) : -1;
	if (fd >= 0) {
		close(fd);
	}
	buf[n > 0 ? n : 0] = '\0';
	return talloc_strdup(mem, buf);
}

static int count_lines_with(const char *text, const char *needle)
{
	int n = 0;

	while ((text = strstr(text, needle)) != NULL) {
		n++;
		text += strlen(needle);
	}
	return n;
}

static struct db_context *open_broken(TALLOC_CTX *mem, const char *dir,
				      const char *file, int flags, const char *rule)
{
	char *path = talloc_asprintf(mem, "%s/%s", dir, file);
	char *opt = talloc_asprintf(mem, "break=%s", rule);
	const char *options[] = { opt, NULL };

	return db_open_py(mem, path, 0, flags, O_RDWR | O_CREAT, 0600,
			  DBWRAP_LOCK_ORDER_NONE, 0, MISBEHAVING, options);
}

/* -- one operation per misbehaviour -------------------------------------------- */

enum op { OP_PARSE, OP_STORE, OP_FETCH_LOCKED, OP_FETCH_LOCKED_STORE,
	  OP_DO_LOCKED, OP_DELETE, OP_TRAVERSE_READ, OP_TRANSACTION };

struct error_case {
	const char *rule;        /* break=<method>:<how> */
	enum op op;
	const char *log_op;      /* the op= in the log line */
	uint32_t expected;       /* NTSTATUS at the dbwrap level */
	int log_lines;           /* 1 for failures; 0 for routine answers */
};

static void noop_fn(struct db_record *rec, TDB_DATA value, void *private_data)
{
}

static int count_fn(struct db_record *rec, void *private_data)
{
	*(int *)private_data += 1;
	return 0;
}

static NTSTATUS run_op(struct db_context *db, TALLOC_CTX *mem, enum op op)
{
	TDB_DATA key = str_data("k");
	struct db_record *rec;
	int count = 0;

	switch (op) {
	case OP_PARSE:
		return dbwrap_parse_record(db, key, NULL, NULL);
	case OP_STORE:
		return dbwrap_store(db, key, str_data("v"), 0);
	case OP_FETCH_LOCKED:
		return dbwrap_fetch_locked(db, mem, key) != NULL
			? NT_STATUS_OK : NT_STATUS_UNSUCCESSFUL;
	case OP_FETCH_LOCKED_STORE:
		rec = dbwrap_fetch_locked(db, mem, key);
		return rec != NULL ? dbwrap_record_store(rec, str_data("v"), 0)
				   : NT_STATUS_UNSUCCESSFUL;
	case OP_DO_LOCKED:
		return dbwrap_do_locked(db, key, noop_fn, NULL);
	case OP_DELETE:
		return dbwrap_delete(db, key);
	case OP_TRAVERSE_READ:
		return dbwrap_traverse_read(db, count_fn, &count, &count);
	case OP_TRANSACTION:
		return dbwrap_transaction_start(db) == 0
			? NT_STATUS_OK : NT_STATUS_UNSUCCESSFUL;
	}
	return NT_STATUS_INTERNAL_ERROR;
}

static const struct error_case error_cases[] = {
	{ "get:raise", OP_PARSE, "fetch", 0xC0000158, 1 },
	{ "get:typed-Timeout", OP_PARSE, "fetch", 0xC00000B5, 1 },
	{ "get:typed-Unavailable", OP_PARSE, "fetch", 0xC00000A3, 1 },
	{ "get:wrongtype", OP_PARSE, "fetch", 0xC0000158, 1 },
	{ "get:exit", OP_PARSE, "fetch", 0xC0000158, 1 },
	{ "put:raise", OP_STORE, "store+unlock", 0xC0000158, 1 },
	{ "put:raise", OP_FETCH_LOCKED_STORE, "store", 0xC0000158, 1 },
	{ "put:typed-WriteProtected", OP_STORE, "store+unlock", 0xC00000A2, 0 },
	{ "lock:raise", OP_FETCH_LOCKED, "lock", 0xC0000001, 1 },
	{ "lock:typed-LockConflict", OP_DO_LOCKED, "lock", 0xC0000054, 0 },
	{ "lock:typed-Timeout", OP_DO_LOCKED, "lock", 0xC00000B5, 1 },
	{ "remove:typed-NotFound", OP_DELETE, "delete", 0xC0000225, 0 },
	{ "get:wrongtype", OP_DO_LOCKED, "lock", 0xC0000158, 1 },
	{ "remove:typed-Corruption", OP_DELETE, "delete", 0xC00000E4, 1 },
	{ "remove:wrongtype", OP_DELETE, "delete", 0xC0000158, 1 },
	{ "scan:late", OP_TRAVERSE_READ, "traverse", 0xC00000E4, 1 },
	{ "scan:wrongtype", OP_TRAVERSE_READ, "traverse", 0xC00000E4, 1 },
	{ "transaction_start:raise", OP_TRANSACTION, "transaction_start", 0xC0000001, 1 },
};

static enum result test_error_mapping(const struct backend *b, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	size_t i;

	for (i = 0; i < sizeof(error_cases) / sizeof(error_cases[0]); i++) {
		const struct error_case *c = &error_cases[i];
		char *file = talloc_asprintf(mem, "broken%zu.tdb", i);
		struct db_context *db = open_broken(mem, dir, file, PERSISTENT_FLAGS,
						    c->rule);
		char *needle, *log;
		struct capture cap;
		NTSTATUS status;

		CHECK(db != NULL, "open with %s failed", c->rule);
		if (strncmp(c->rule, "put", 3) != 0) {
			/* give reads and deletes something to find */
			(void)dbwrap_store(db, str_data("k"), str_data("v"), 0);
		}
		capture_start(&cap, dir);
		status = run_op(db, mem, c->op);
		log = capture_end(&cap, mem);
		CHECK(NT_STATUS_V(status) == c->expected,
		      "%s: got %s, expected 0x%08x", c->rule, nt_errstr(status),
		      (unsigned)c->expected);
		needle = talloc_asprintf(mem, "dbwrap_py: db=%s/%s op=%s:", dir,
					 file, c->log_op);
		CHECK(count_lines_with(log, needle) == c->log_lines,
		      "%s: expected %d log line(s) '%s', got: %s", c->rule,
		      c->log_lines, needle, log);
		CHECK(count_lines_with(log, "dbwrap_py: db=") == c->log_lines,
		      "%s: other log lines: %s", c->rule, log);
	}
	talloc_free(mem);
	return PASS;
}

/* -- seqnum and id failures keep callers safe ---------------------------------- */

static enum result test_seqnum_and_id_errors(const struct backend *b, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = open_broken(mem, dir, "seqid.tdb", VOLATILE_FLAGS,
					    "seqnum:raise,db_id:raise,exists:wrongtype");
	struct capture cap;
	uint8_t id[256];
	size_t idlen;
	int s1, s2;
	char *log;

	CHECK(db != NULL, "open failed");
	capture_start(&cap, dir);
	s1 = dbwrap_get_seqnum(db);
	s2 = dbwrap_get_seqnum(db);
	idlen = dbwrap_db_id(db, id, sizeof(id));
	(void)dbwrap_store(db, str_data("k"), str_data("v"), 0);
	CHECK(!dbwrap_exists(db, str_data("k")), "a wrong type must not read as true");
	log = capture_end(&cap, mem);
	/* a failed seqnum never equals an earlier one, so caches revalidate */
	CHECK(s1 < 0 && s2 < 0 && s1 != s2, "seqnum on error: %d then %d", s1, s2);
	CHECK(idlen > 0 && idlen <= sizeof(id) && memmem(id, idlen, "seqid.tdb", 9) != NULL,
	      "db id falls back to the name");
	CHECK(count_lines_with(log, "op=seqnum:") == 2, "seqnum log lines: %s", log);
	CHECK(count_lines_with(log, "op=db_id:") == 1, "db_id log line: %s", log);
	CHECK(count_lines_with(log, "op=exists:") == 1, "exists log line: %s", log);
	talloc_free(mem);
	return PASS;
}

/* -- bad configuration fails db_open with errno and one line ------------------- */

struct open_case {
	const char *adapter;
	const char *option;
	int expected_errno;
	const char *log_text;
};

static const struct open_case open_cases[] = {
	{ "nosuchadapter", NULL, EINVAL, "unknown adapter 'nosuchadapter'" },
	{ "dbwrap_py_fixtures.import_error", NULL, EINVAL, "failed to import" },
	{ "memory", "bogus=1", EINVAL, "unknown option(s) bogus" },
	{ "memory", "novalue", EINVAL, "not of the form key=value" },
	{ "dbwrap_py.errors", NULL, EINVAL, "has no ADAPTER" },
};

static enum result test_bad_config(const struct backend *b, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	size_t i;

	for (i = 0; i < sizeof(open_cases) / sizeof(open_cases[0]); i++) {
		const struct open_case *c = &open_cases[i];
		const char *options[] = { c->option, NULL };
		char *path = talloc_asprintf(mem, "%s/cfg%zu.tdb", dir, i);
		struct db_context *db;
		struct capture cap;
		char *log;
		int err;

		capture_start(&cap, dir);
		errno = 0;
		db = db_open_py(mem, path, 0, VOLATILE_FLAGS, O_RDWR | O_CREAT,
				0600, DBWRAP_LOCK_ORDER_NONE, 0, c->adapter, options);
		err = errno;
		log = capture_end(&cap, mem);
		CHECK(db == NULL, "%s opened despite bad configuration", c->adapter);
		CHECK(err == c->expected_errno, "%s: errno %d, expected %d",
		      c->adapter, err, c->expected_errno);
		CHECK(strstr(log, c->log_text) != NULL && strstr(log, path) != NULL &&
		      count_lines_with(log, "dbwrap_py: db=") == 1,
		      "%s: log lacks '%s' or the db name: %s", c->adapter, c->log_text, log);
	}
	talloc_free(mem);
	return PASS;
}

/* -- a database that works logs nothing ----------------------------------------- */

static enum result test_quiet_when_working(const struct backend *b, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db;
	struct capture cap;
	TDB_DATA value;
	char *log;

	capture_start(&cap, dir);
	db = open_db(mem, b, dir, "quiet.tdb", VOLATILE_FLAGS, DBWRAP_LOCK_ORDER_NONE);
	if (db != NULL) {
		(void)dbwrap_store(db, str_data("k"), str_data("v"), 0);
		(void)dbwrap_fetch(db, mem, str_data("k"), &value);
		(void)dbwrap_fetch(db, mem, str_data("missing"), &value); /* NOT_FOUND is an answer */
	}
	log = capture_end(&cap, mem);
	CHECK(db != NULL, "open failed");
	/* e.g. proxy mode's NODE_CACHE question, answered NOT_SUPPORTED for a
	 * database without a write-back node cache, at every open */
	CHECK(count_lines_with(log, "dbwrap_py: db=") == 0, "logged: %s", log);
	talloc_free(mem);
	return PASS;
}

/* -- the GIL is released between calls ------------------------------------------ */

static enum result test_gil_released(const struct backend *b, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = open_broken(mem, dir, "gil.tdb", VOLATILE_FLAGS, "");

	CHECK(db != NULL, "open failed");
	CHECK(Py_IsInitialized(), "Python should run after the first open");
	CHECK(!PyGILState_Check(), "the GIL is held after db_open_py returned");
	CHECK_STATUS(dbwrap_store(db, str_data("k"), str_data("v"), 0), NT_STATUS_OK);
	CHECK(!PyGILState_Check(), "the GIL is held after a call returned");
	talloc_free(mem);
	CHECK(!PyGILState_Check(), "the GIL is held after close");
	return PASS;
}

/*
 * A caller's callback runs without the GIL: Samba's may block (g_lock's
 * asks ctdbd whether a holder lives), and the adapter's threads, a lease's
 * keepalive above all, must run meanwhile (issue 38: an etcd lease lapsed
 * while a do_locked callback waited out a ctdb recovery with the GIL held).
 */
static void gil_parser(TDB_DATA key, TDB_DATA data, void *private_data)
{
	int *held = private_data;

	*held = PyGILState_Check();
}

static void gil_do_locked(struct db_record *rec, TDB_DATA value, void *private_data)
{
	int *held = private_data;

	*held = PyGILState_Check();
}

static enum result test_callbacks_without_gil(const struct backend *b, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = open_broken(mem, dir, "gil_callbacks.tdb", VOLATILE_FLAGS, "");
	int in_do_locked = -1, in_parse = -1;

	CHECK(db != NULL, "open failed");
	CHECK_STATUS(dbwrap_store(db, str_data("k"), str_data("v"), 0), NT_STATUS_OK);
	CHECK_STATUS(dbwrap_do_locked(db, str_data("k"), gil_do_locked, &in_do_locked), NT_STATUS_OK);
	CHECK(in_do_locked == 0, "a do_locked callback ran with the GIL held");
	CHECK_STATUS(dbwrap_parse_record(db, str_data("k"), gil_parser, &in_parse), NT_STATUS_OK);
	CHECK(in_parse == 0, "a parse_record parser ran with the GIL held");
	talloc_free(mem);
	return PASS;
}

const struct test_case error_tests[] = {
	{ "adapter errors -> NTSTATUS + 1 log line", test_error_mapping },
	{ "seqnum/id/exists failures stay safe", test_seqnum_and_id_errors },
	{ "bad configuration fails db_open", test_bad_config },
	{ "GIL released between calls", test_gil_released },
	{ "callbacks run without the GIL", test_callbacks_without_gil },
	{ NULL, NULL },
};

/* on every backend */
const struct test_case quiet_tests[] = {
	{ "a working database logs nothing", test_quiet_when_working },
	{ NULL, NULL },
};
