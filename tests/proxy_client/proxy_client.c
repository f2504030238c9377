/*
 * proxy_client: the proxy transport's client, the bridge's own C
 * (transport_proxy.c, proxy_conn.c, proxy_wire.c, proxy_fastpath.c), driven
 * without Samba, for tests that put a fake node daemon on the other end:
 * tests/python/test_proxy_client.py (one attack each) and
 * dbwrap_py.proxy.fuzz_client (random replies, make test-fuzz-proxy).
 *
 *   proxy_client SOCKET TIMEOUT_S OP ...          the ops in order
 *   proxy_client SOCKET TIMEOUT_S random SEED S   random ops for S seconds
 *
 * OP: open, close, fetch, lock, unlock, store, delete, exists, seqnum,
 * locked, write_through, traverse, traverse_write, txn_start, txn_commit,
 * txn_cancel, wipe, check, db_id. Each prints one line on stdout as it
 * returns, "OP 0xNTSTATUS" (an op other than open before a database is
 * open prints "OP no-db"); the random form ends with "done N ops". The
 * bridge's log lines go to stderr. Exit 0 once every op has returned,
 * whatever its status; 2 on bad usage.
 *
 * The Makefile builds it with AddressSanitizer and UBSan: a memory error
 * or undefined behaviour ends it with a report on stderr and exit 1, and
 * so does an allocation over MAX_ALLOCATION_MB, which no reply within
 * PROXY_MAX_MESSAGE needs. build/proxy_client_broken is the same with
 * DBWRAP_PY_BROKEN_MAX_MESSAGE (proxy_conn.c): the fuzzer's broken example.
 */

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "transport.h"

/* over PROXY_MAX_MESSAGE (64 MiB) and its talloc header, far under 4 GiB */
#define MAX_ALLOCATION_MB 96
#define TRAVERSE_MOST 5 /* records a traverse takes before it stops */

#define STR(x) #x
#define XSTR(x) STR(x)

/* Sanitizer settings that hold wherever the driver runs (tests, fuzz, by hand). */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
	/* LeakSanitizer needs ptrace, which containers often refuse */
	return "detect_leaks=0:allocator_may_return_null=0:"
	       "max_allocation_size_mb=" XSTR(MAX_ALLOCATION_MB);
}

const char *__ubsan_default_options(void);
const char *__ubsan_default_options(void)
{
	return "halt_on_error=1:print_stacktrace=1";
}

struct client {
	const char *options[4];
	const struct dbwrap_py_record_ops *records;
	struct dbwrap_py_db *db;
	unsigned seed;
	int traversed;
};

/* -- values ----------------------------------------------------------------- */

static unsigned next_random(struct client *c)
{
	c->seed = c->seed * 1103515245u + 12345u;
	return (c->seed >> 8) & 0xffffff;
}

static TDB_DATA some_key(struct client *c)
{
	static char key[8];

	snprintf(key, sizeof(key), "k%u", next_random(c) % 8);
	return (TDB_DATA) { (uint8_t *)key, strlen(key) };
}

static void take_value(TDB_DATA value, bool exists, void *private_data)
{
	size_t i, sum = 0;

	for (i = 0; exists && i < value.dsize; i++) { /* every byte read */
		sum += value.dptr[i];
	}
	*(size_t *)private_data = sum;
}

static const TDB_DATA *locked_store(TDB_DATA value, bool exists, void *private_data)
{
	static uint8_t stored[] = "written in do_locked";
	static TDB_DATA v = { stored, sizeof(stored) - 1 };

	take_value(value, exists, private_data);
	return (value.dsize % 2 == 0) ? &v : NULL;
}

static int take_record(TDB_DATA key, TDB_DATA value, void *private_data)
{
	struct client *c = private_data;
	size_t sum = 0;

	take_value(key, true, &sum);
	take_value(value, true, &sum);
	return ++c->traversed >= TRAVERSE_MOST;
}

/* -- ops -------------------------------------------------------------------- */

static NTSTATUS op_open(struct client *c)
{
	struct dbwrap_py_open_args args = {
		.name = "proxy_client.tdb", .open_flags = O_RDWR | O_CREAT,
		.mode = 0600, .adapter = "memory", .options = c->options,
	};

	TALLOC_FREE(c->db);
	return dbwrap_py_transport_proxy.open(NULL, &args, &c->db, &c->records);
}

static NTSTATUS op_store(struct client *c, TDB_DATA key)
{
	uint8_t buf[64];
	TDB_DATA parts[2] = { { buf, next_random(c) % sizeof(buf) }, { buf, 3 } };

	memset(buf, 'v', sizeof(buf));
	return c->records->storev(c->db, key, parts, 2, (int)(next_random(c) % 4));
}

static NTSTATUS op_db_id(struct client *c)
{
	TALLOC_CTX *tmp = talloc_new(NULL);
	uint8_t *id = NULL;
	size_t idlen = 0, sum = 0;
	NTSTATUS status = dbwrap_py_transport_proxy.db_id(c->db, tmp, &id, &idlen);

	if (NT_STATUS_IS_OK(status)) {
		take_value((TDB_DATA) { id, idlen }, true, &sum);
	}
	talloc_free(tmp);
	return status;
}

static NTSTATUS op_traverse(struct client *c, bool write)
{
	int count = 0;

	c->traversed = 0;
	return dbwrap_py_transport_proxy.traverse(c->db, write, take_record, c, &count);
}

static NTSTATUS op_txn(struct client *c, enum dbwrap_py_txn_op op)
{
	return dbwrap_py_transport_proxy.transaction(c->db, op);
}

/* One op by name on an open database; false for a name it does not know. */
static bool run_op(struct client *c, const char *name, NTSTATUS *status)
{
	TDB_DATA key = some_key(c);
	size_t sum = 0;
	bool flag = false;
	int seqnum = 0;

#define OP(n, call) if (strcmp(name, n) == 0) { *status = (call); return true; }
	OP("fetch", c->records->fetch(c->db, key, take_value, &sum));
	OP("lock", c->records->lock(c->db, key, take_value, &sum));
	OP("unlock", c->records->unlock(c->db, key));
	OP("store", op_store(c, key));
	OP("delete", c->records->delete_rec(c->db, key));
	OP("exists", c->records->exists(c->db, key, &flag));
	OP("seqnum", c->records->seqnum(c->db, &seqnum));
	OP("locked", c->records->locked(c->db, key, locked_store, &sum));
	OP("write_through", c->records->write_through(c->db, key));
	OP("traverse", op_traverse(c, false));
	OP("traverse_write", op_traverse(c, true));
	OP("txn_start", op_txn(c, DBWRAP_PY_TXN_START_NONBLOCK));
	OP("txn_commit", op_txn(c, DBWRAP_PY_TXN_COMMIT));
	OP("txn_cancel", op_txn(c, DBWRAP_PY_TXN_CANCEL));
	OP("wipe", dbwrap_py_transport_proxy.wipe(c->db));
	OP("check", dbwrap_py_transport_proxy.check(c->db));
	OP("db_id", op_db_id(c));
#undef OP
	return false;
}

static const char *const random_ops[] = {
	"open", "close", "fetch", "lock", "unlock", "store", "delete", "exists",
	"seqnum", "locked", "write_through", "traverse", "traverse_write",
	"txn_start", "txn_commit", "txn_cancel", "wipe", "check", "db_id",
};
#define NUM_RANDOM_OPS (sizeof(random_ops) / sizeof(random_ops[0]))

/* Runs one op and prints its line; false for an unknown name. */
static bool step(struct client *c, const char *name)
{
	NTSTATUS status = NT_STATUS_OK;

	if (strcmp(name, "open") == 0) {
		status = op_open(c);
	} else if (strcmp(name, "close") == 0) {
		TALLOC_FREE(c->db); /* CLOSE, from the destructor */
	} else if (c->db == NULL) {
		printf("%s no-db\n", name);
		fflush(stdout);
		return true;
	} else if (!run_op(c, name, &status)) {
		return false;
	}
	printf("%s 0x%08x\n", name, (unsigned)NT_STATUS_V(status));
	fflush(stdout);
	return true;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Random ops (an open first, and whenever none is open) until the time is up. */
static int run_random(struct client *c, unsigned seed, double seconds)
{
	double end = now_s() + seconds;
	unsigned long n = 0;

	c->seed = seed;
	while (now_s() < end) {
		const char *name = (c->db == NULL)
			? "open" : random_ops[next_random(c) % NUM_RANDOM_OPS];

		step(c, name);
		n++;
	}
	printf("done %lu ops\n", n);
	return 0;
}

int main(int argc, char **argv)
{
	static char socket_option[300], timeout_option[64];
	struct client c = { .seed = 1 };
	int i;

	if (argc < 4) {
		fprintf(stderr, "usage: proxy_client SOCKET TIMEOUT_S OP ...\n"
				"       proxy_client SOCKET TIMEOUT_S random SEED SECONDS\n");
		return 2;
	}
	snprintf(socket_option, sizeof(socket_option), "proxy_socket=%s", argv[1]);
	snprintf(timeout_option, sizeof(timeout_option), "proxy_timeout=%s", argv[2]);
	c.options[0] = socket_option;
	c.options[1] = timeout_option;
	c.options[2] = "proxy_fastpath=yes"; /* NODE_CACHE after each OPEN */
	c.options[3] = NULL;
	if (strcmp(argv[3], "random") == 0) {
		if (argc != 6) {
			fprintf(stderr, "random needs SEED and SECONDS\n");
			return 2;
		}
		return run_random(&c, (unsigned)strtoul(argv[4], NULL, 10), atof(argv[5]));
	}
	for (i = 3; i < argc; i++) {
		if (!step(&c, argv[i])) {
			fprintf(stderr, "unknown op %s\n", argv[i]);
			return 2;
		}
	}
	TALLOC_FREE(c.db);
	return 0;
}
