/*
 * bench_bridge: what one dbwrap call costs through the bridge, against
 * Samba's native tdb backend in the same run, through Samba's real dbwrap
 * front end. A benchmark, not a test: it asserts nothing.
 *
 * Usage: bench_bridge [iterations] [results.json|-] [backend]
 * (one backend only, e.g. under valgrind --tool=callgrind)
 *
 * It also measures the storev design choice: handing the buffers to Python
 * joined into one bytes object (what the bridge does) against a list that
 * Python joins.
 */

#include <Python.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "dbwrap_py.h"

struct backend {
	const char *name;
	const char *adapter;          /* NULL: native tdb */
	const char *const *options;   /* adapter options, or NULL */
};

/* the tdb adapter through its Python methods instead of native records */
static const char *const python_path[] = { "native_records=no", NULL };

static struct backend backends[] = {
	{ "native-tdb", NULL, NULL },
	{ "bridge+tdb", "tdb", NULL },
	{ "bridge+tdb-py", "tdb", python_path },
	{ "bridge+memory", "memory", NULL },
	/*
	 * "bridge+extra": DBWRAP_PY_BENCH_ADAPTER with the options in
	 * DBWRAP_PY_BENCH_OPTIONS (K=V,K=V), e.g. etcd with the node cache on a
	 * throwaway etcd and agent that `dbwrap-py bench instructions` starts
	 */
	{ NULL, NULL, NULL },
};
#define NUM_BACKENDS (sizeof(backends) / sizeof(backends[0]))

/* The extra backend from the environment; false (and not listed) without one. */
static bool extra_backend(TALLOC_CTX *mem)
{
	const char *adapter = getenv("DBWRAP_PY_BENCH_ADAPTER");
	const char *options = getenv("DBWRAP_PY_BENCH_OPTIONS");
	char **list, *copy, *next;
	size_t n = 0;

	if (adapter == NULL) {
		return false;
	}
	copy = talloc_strdup(mem, options != NULL ? options : "");
	list = talloc_zero_array(mem, char *, strlen(copy) + 2);
	for (next = strtok(copy, ","); next != NULL; next = strtok(NULL, ",")) {
		list[n++] = next;
	}
	backends[NUM_BACKENDS - 1] = (struct backend) {
		"bridge+extra", adapter, (const char *const *)list,
	};
	return true;
}

enum op { OP_PARSE, OP_STORE, OP_DO_LOCKED_3BUF, OP_FETCH_LOCKED_STORE, NUM_OPS };
static const char *op_names[NUM_OPS] = {
	"parse_record (hit)", "dbwrap_store", "do_locked + storev(3 bufs)",
	"fetch_locked + store + free",
};

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void parser(TDB_DATA key, TDB_DATA data, void *private_data)
{
	*(size_t *)private_data += data.dsize;
}

static void store3_fn(struct db_record *rec, TDB_DATA value, void *private_data)
{
	static uint8_t header[16], watchers[24], payload[200];
	TDB_DATA bufs[3] = {
		{ header, sizeof(header) }, { watchers, sizeof(watchers) },
		{ payload, sizeof(payload) },
	};

	*(NTSTATUS *)private_data = dbwrap_record_storev(rec, bufs, 3, 0);
}

/* One function per operation, so callgrind can count each on its own. */
static const TDB_DATA bench_key = { (uint8_t *)"bench-key-0123456789", 20 };
static uint8_t bench_value[240];

static __attribute__((noinline)) void op_parse(struct db_context *db, int n)
{
	size_t sink = 0;
	int i;

	for (i = 0; i < n; i++) {
		(void)dbwrap_parse_record(db, bench_key, parser, &sink);
	}
}

static __attribute__((noinline)) void op_store(struct db_context *db, int n)
{
	TDB_DATA data = { bench_value, sizeof(bench_value) };
	int i;

	for (i = 0; i < n; i++) {
		(void)dbwrap_store(db, bench_key, data, 0);
	}
}

static __attribute__((noinline)) void op_do_locked_3buf(struct db_context *db, int n)
{
	NTSTATUS status;
	int i;

	for (i = 0; i < n; i++) {
		(void)dbwrap_do_locked(db, bench_key, store3_fn, &status);
	}
}

static __attribute__((noinline)) void op_fetch_locked_store(struct db_context *db, int n)
{
	TDB_DATA data = { bench_value, sizeof(bench_value) };
	struct db_record *rec;
	int i;

	for (i = 0; i < n; i++) {
		rec = dbwrap_fetch_locked(db, NULL, bench_key);
		(void)dbwrap_record_store(rec, data, 0);
		TALLOC_FREE(rec);
	}
}

static void (*const op_fns[NUM_OPS])(struct db_context *, int) = {
	op_parse, op_store, op_do_locked_3buf, op_fetch_locked_store,
};

static double run_op(struct db_context *db, enum op op, int n)
{
	double start;

	(void)dbwrap_store(db, bench_key, (TDB_DATA) { bench_value, sizeof(bench_value) }, 0);
	start = now_ns();
	op_fns[op](db, n);
	return (now_ns() - start) / n;
}

static struct db_context *open_backend(TALLOC_CTX *mem, const struct backend *b,
				       const char *dir)
{
	char *path = talloc_asprintf(mem, "%s/%s.tdb", dir, b->name);
	/* what smbd's db_open gives locking.tdb: robust mutexes */
	int flags = TDB_CLEAR_IF_FIRST | TDB_INCOMPATIBLE_HASH | TDB_SEQNUM |
		    TDB_MUTEX_LOCKING;

	unlink(path);
	if (b->adapter == NULL) {
		return db_open_tdb(mem, path, 0, flags, O_RDWR | O_CREAT, 0600,
				   DBWRAP_LOCK_ORDER_NONE, 0);
	}
	return db_open_py(mem, path, 0, flags, O_RDWR | O_CREAT, 0600,
			  DBWRAP_LOCK_ORDER_NONE, 0, b->adapter, b->options);
}

/* The storev choice: one joined bytes (built in C) against a list joined in Python. */
static void bench_storev_choice(int n, double *joined_ns, double *list_ns)
{
	static const char *code =
		"def store_joined(key, value, flag):\n"
		"    return len(value)\n"
		"def store_list(key, values, flag):\n"
		"    return len(b''.join(values))\n";
	PyGILState_STATE gil = PyGILState_Ensure();
	PyObject *globals = PyDict_New(), *joined, *list, *r;
	char bufs[3][200] = { { 0 } };
	size_t sizes[3] = { 16, 24, 200 };
	double start;
	int i, j;

	PyDict_SetItemString(globals, "__builtins__", PyEval_GetBuiltins());
	r = PyRun_String(code, Py_file_input, globals, globals);
	Py_XDECREF(r);
	joined = PyDict_GetItemString(globals, "store_joined");
	list = PyDict_GetItemString(globals, "store_list");

	start = now_ns();
	for (i = 0; i < n; i++) {
		PyObject *args[3];
		size_t total = sizes[0] + sizes[1] + sizes[2], off = 0;

		args[0] = PyBytes_FromStringAndSize("bench-key-0123456789", 20);
		args[1] = PyBytes_FromStringAndSize(NULL, total);
		for (j = 0; j < 3; j++) {
			memcpy(PyBytes_AS_STRING(args[1]) + off, bufs[j], sizes[j]);
			off += sizes[j];
		}
		args[2] = PyLong_FromLong(0);
		r = PyObject_Vectorcall(joined, args, 3, NULL);
		Py_XDECREF(r);
		for (j = 0; j < 3; j++) {
			Py_DECREF(args[j]);
		}
	}
	*joined_ns = (now_ns() - start) / n;

	start = now_ns();
	for (i = 0; i < n; i++) {
		PyObject *args[3];

		args[0] = PyBytes_FromStringAndSize("bench-key-0123456789", 20);
		args[1] = PyList_New(3);
		for (j = 0; j < 3; j++) {
			PyList_SET_ITEM(args[1], j,
					PyBytes_FromStringAndSize(bufs[j], sizes[j]));
		}
		args[2] = PyLong_FromLong(0);
		r = PyObject_Vectorcall(list, args, 3, NULL);
		Py_XDECREF(r);
		for (j = 0; j < 3; j++) {
			Py_DECREF(args[j]);
		}
	}
	*list_ns = (now_ns() - start) / n;
	Py_DECREF(globals);
	PyGILState_Release(gil);
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 20000;
	const char *json_path = (argc > 2 && strcmp(argv[2], "-") != 0) ? argv[2] : NULL;
	const char *only = argc > 3 ? argv[3] : NULL;
	double ns[NUM_BACKENDS][NUM_OPS], joined_ns, list_ns;
	char dir[] = "/tmp/dbwrap_py_bench.XXXXXX";
	TALLOC_CTX *mem = talloc_new(NULL);
	FILE *json;
	size_t b, op;

	if (mkdtemp(dir) == NULL) {
		perror("mkdtemp");
		return 1;
	}
	memset(ns, 0, sizeof(ns));
	(void)extra_backend(mem);
	for (b = 0; b < NUM_BACKENDS; b++) {
		struct db_context *db;

		if (backends[b].name == NULL ||
		    (only != NULL && strcmp(only, backends[b].name) != 0)) {
			continue;
		}
		db = open_backend(mem, &backends[b], dir);
		if (db == NULL) {
			fprintf(stderr, "cannot open %s\n", backends[b].name);
			return 1;
		}
		for (op = 0; op < NUM_OPS; op++) {
			(void)run_op(db, op, n / 10); /* warm up */
			ns[b][op] = run_op(db, op, n);
		}
		TALLOC_FREE(db);
	}
	joined_ns = list_ns = 0;
	if (Py_IsInitialized()) { /* a bridged backend ran */
		bench_storev_choice(n, &joined_ns, &list_ns);
	}

	printf("%-30s", "ns per call");
	for (b = 0; b < NUM_BACKENDS; b++) {
		printf(" %22s", backends[b].name != NULL ? backends[b].name : "-");
	}
	printf("\n");
	for (op = 0; op < NUM_OPS; op++) {
		printf("%-30s", op_names[op]);
		for (b = 0; b < NUM_BACKENDS; b++) {
			printf(" %10.0f (%5.2fx tdb)", ns[b][op],
			       ns[0][op] > 0 ? ns[b][op] / ns[0][op] : 0.0);
		}
		printf("\n");
	}
	printf("\nstorev into Python, 3 buffers (240 bytes): joined in C %.0f ns, "
	       "list joined in Python %.0f ns (%.2fx)\n", joined_ns, list_ns,
	       list_ns / joined_ns);

	if (json_path != NULL && (json = fopen(json_path, "w")) != NULL) {
		fprintf(json, "{\"iterations\": %d, \"ns_per_call\": {", n);
		for (b = 0; b < NUM_BACKENDS; b++) {
			if (backends[b].name == NULL) {
				continue;
			}
			fprintf(json, "%s\"%s\": {", b ? ", " : "", backends[b].name);
			for (op = 0; op < NUM_OPS; op++) {
				fprintf(json, "%s\"%s\": %.1f", op ? ", " : "",
					op_names[op], ns[b][op]);
			}
			fprintf(json, "}");
		}
		fprintf(json, "}, \"storev_joined_ns\": %.1f, \"storev_list_ns\": %.1f}\n",
			joined_ns, list_ns);
		fclose(json);
		printf("results: %s\n", json_path);
	}
	talloc_free(mem);
	return 0;
}
