/*
 * bench_micro: per-operation latency distributions of one backend through
 * Samba's real dbwrap front end (libdbwrap-samba4), for `dbwrap-py bench
 * micro`. A benchmark, not a test: it asserts nothing.
 *
 * Usage: bench_micro BACKEND [-n MAX_OPS] [-t SECONDS] [-k KEYS] [-o K=V ...]
 *   BACKEND  "native" (Samba's own tdb backend) or an adapter name
 *   -n       at most this many timed operations per workload (default 20000)
 *   -t       and at most this many seconds per workload (default 2)
 *   -k       records in the key space (default 1000)
 *   -o       adapter option, repeatable (e.g. -o endpoints=127.0.0.1:2379)
 *   -d       an existing folder for the database files (default: a new
 *            one under /tmp; the caller removes what adapters leave there)
 *
 * Workloads: single calls (parse_record, store, do_locked read-modify-write,
 * fetch_locked + store), then YCSB-style mixes, each with uniform and
 * zipfian (theta 0.99) keys: read-mostly (95% parse_record, 5% do_locked
 * update, YCSB B), read-modify-write (50% parse_record, 50% do_locked
 * read-modify-write, YCSB F), and smbd's open+close of one file
 * (reference 2.2: 8 do_locked, 4 parse_record on locking.tdb; 2
 * fetch_locked, 1 store, 1 delete on smbXsrv_open_global.tdb).
 *
 * Each operation is timed alone with CLOCK_MONOTONIC (the ~20 ns of the
 * clock reads are included). Round trips per operation are read from the
 * adapters' `round_trips` counters (dbwrap_py.bench.micro.round_trips()),
 * -1 when the backend keeps none. Prints one JSON object on stdout.
 */

#include <Python.h>

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dbwrap_py.h"

#define MAX_OPTIONS 32
#define KEY_LEN 24
#define VALUE_LEN 200
#define ZIPF_THETA 0.99

struct settings {
	const char *backend;
	const char *dir;
	const char *options[MAX_OPTIONS + 1];
	int max_ops;
	double seconds;
	int keys;
};

struct bench {
	struct settings s;
	struct db_context *locking;     /* the workloads' main database */
	struct db_context *open_global; /* smbXsrv_open_global.tdb for open+close */
	double *zipf_cdf;               /* cumulative zipfian weights, keys long */
	double *latency_ns;             /* one workload's samples */
	unsigned int seed;
	uint32_t next_open_id;
};

enum dist { UNIFORM, ZIPFIAN };
static const char *dist_names[] = { "uniform", "zipfian" };

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* -- keys -------------------------------------------------------------- */

static double *zipf_cdf_new(int n, double theta)
{
	double *cdf = malloc(sizeof(double) * n), total = 0;
	int i;

	for (i = 0; i < n; i++) {
		total += 1.0 / pow(i + 1, theta);
		cdf[i] = total;
	}
	for (i = 0; i < n; i++) {
		cdf[i] /= total;
	}
	return cdf;
}

static double uniform01(struct bench *b)
{
	return (rand_r(&b->seed) + 0.5) / ((double)RAND_MAX + 1.0);
}

static int pick_key(struct bench *b, enum dist dist)
{
	double u;
	int lo = 0, hi = b->s.keys - 1;

	if (dist == UNIFORM) {
		return rand_r(&b->seed) % b->s.keys;
	}
	u = uniform01(b);
	while (lo < hi) { /* the first rank whose cumulative weight reaches u */
		int mid = (lo + hi) / 2;

		if (b->zipf_cdf[mid] < u) {
			lo = mid + 1;
		} else {
			hi = mid;
		}
	}
	return lo;
}

struct keybuf {
	char text[KEY_LEN];
	TDB_DATA data;
};

static TDB_DATA make_key(struct keybuf *k, const char *prefix, uint32_t n)
{
	int len = snprintf(k->text, sizeof(k->text), "%s%08x", prefix, n);

	k->data = (TDB_DATA) { (uint8_t *)k->text, len };
	return k->data;
}

/* -- record operations --------------------------------------------------- */

static uint8_t value_bytes[VALUE_LEN];

static void parser(TDB_DATA key, TDB_DATA data, void *private_data)
{
	*(size_t *)private_data += data.dsize;
}

static void op_parse(struct db_context *db, TDB_DATA key)
{
	size_t sink = 0;

	(void)dbwrap_parse_record(db, key, parser, &sink);
}

static void op_store(struct db_context *db, TDB_DATA key)
{
	(void)dbwrap_store(db, key, (TDB_DATA) { value_bytes, VALUE_LEN }, 0);
}

/* what g_lock does: read the record, write it back as three buffers */
static void rmw_fn(struct db_record *rec, TDB_DATA value, void *private_data)
{
	static uint8_t header[16], watchers[24];
	TDB_DATA bufs[3] = {
		{ header, sizeof(header) }, { watchers, sizeof(watchers) },
		{ value_bytes, VALUE_LEN - sizeof(header) - sizeof(watchers) },
	};

	header[0] = value.dsize > 0 ? value.dptr[0] + 1 : 0;
	(void)dbwrap_record_storev(rec, bufs, 3, 0);
}

static void delete_fn(struct db_record *rec, TDB_DATA value, void *private_data)
{
	(void)dbwrap_record_delete(rec);
}

static void op_rmw(struct db_context *db, TDB_DATA key)
{
	(void)dbwrap_do_locked(db, key, rmw_fn, NULL);
}

static void op_fetch_locked_store(struct db_context *db, TDB_DATA key)
{
	struct db_record *rec = dbwrap_fetch_locked(db, NULL, key);

	if (rec != NULL) {
		(void)dbwrap_record_store(rec, (TDB_DATA) { value_bytes, VALUE_LEN }, 0);
		TALLOC_FREE(rec);
	}
}

/* smbXsrv_open_global_allocate / smbXsrv_open_close on a fresh id */
static void open_global_add(struct bench *b, uint32_t id)
{
	struct keybuf k;
	struct db_record *rec = dbwrap_fetch_locked(b->open_global, NULL,
						    make_key(&k, "open-", id));

	if (rec != NULL) {
		(void)dbwrap_record_store(rec, (TDB_DATA) { value_bytes, 120 }, 0);
		TALLOC_FREE(rec);
	}
}

static void open_global_remove(struct bench *b, uint32_t id)
{
	struct keybuf k;
	struct db_record *rec = dbwrap_fetch_locked(b->open_global, NULL,
						    make_key(&k, "open-", id));

	if (rec != NULL) {
		(void)dbwrap_record_delete(rec);
		TALLOC_FREE(rec);
	}
}

/* One SMB2 CREATE + CLOSE of an uncontended file, as reference 2.2 traces it. */
static void op_open_close(struct bench *b, TDB_DATA path)
{
	uint32_t id = b->next_open_id++;

	op_rmw(b->locking, path);   /* g_lock_lock */
	op_parse(b->locking, path); /* g_lock_dump */
	op_parse(b->locking, path); /* locking_tdb_data_fetch */
	op_rmw(b->locking, path);   /* set_share_mode: g_lock_writev_data */
	open_global_add(b, id);
	op_rmw(b->locking, path);   /* destructor: share_mode_data_store */
	op_rmw(b->locking, path);   /* g_lock_unlock */

	op_rmw(b->locking, path);   /* get_existing_share_mode_lock */
	op_parse(b->locking, path);
	op_parse(b->locking, path);
	op_rmw(b->locking, path);   /* del_share_mode */
	open_global_remove(b, id);
	op_rmw(b->locking, path);   /* destructor store */
	(void)dbwrap_do_locked(b->locking, path, delete_fn, NULL); /* unlock deletes */
}

/* -- workloads ------------------------------------------------------------- */

enum workload_kind { W_PARSE, W_STORE, W_RMW, W_FETCH_LOCKED, W_READ_MOSTLY, W_RMW_MIX,
		     W_OPEN_CLOSE };

struct workload {
	const char *name;
	enum workload_kind kind;
	enum dist dist;
	const char *mix; /* NULL for a single call */
};

static const struct workload workloads[] = {
	{ "parse_record", W_PARSE, UNIFORM, NULL },
	{ "store", W_STORE, UNIFORM, NULL },
	{ "do_locked rmw", W_RMW, UNIFORM, NULL },
	{ "fetch_locked+store", W_FETCH_LOCKED, UNIFORM, NULL },
	{ "read-mostly", W_READ_MOSTLY, UNIFORM, "95% parse_record, 5% do_locked update" },
	{ "read-mostly", W_READ_MOSTLY, ZIPFIAN, "95% parse_record, 5% do_locked update" },
	{ "read-modify-write", W_RMW_MIX, UNIFORM, "50% parse_record, 50% do_locked rmw" },
	{ "read-modify-write", W_RMW_MIX, ZIPFIAN, "50% parse_record, 50% do_locked rmw" },
	{ "smbd open+close", W_OPEN_CLOSE, UNIFORM, "8 do_locked + 4 parse_record, 4 on open_global" },
	{ "smbd open+close", W_OPEN_CLOSE, ZIPFIAN, "8 do_locked + 4 parse_record, 4 on open_global" },
};
#define NUM_WORKLOADS (sizeof(workloads) / sizeof(workloads[0]))

static void run_one(struct bench *b, const struct workload *w)
{
	struct keybuf k;
	int n = pick_key(b, w->dist);
	TDB_DATA key;

	if (w->kind == W_OPEN_CLOSE) {
		op_open_close(b, make_key(&k, "path-", n));
		return;
	}
	key = make_key(&k, "key-", n);
	switch (w->kind) {
	case W_PARSE: op_parse(b->locking, key); break;
	case W_STORE: op_store(b->locking, key); break;
	case W_RMW: op_rmw(b->locking, key); break;
	case W_FETCH_LOCKED: op_fetch_locked_store(b->locking, key); break;
	case W_READ_MOSTLY:
		if (rand_r(&b->seed) % 100 < 95) {
			op_parse(b->locking, key);
		} else {
			op_rmw(b->locking, key);
		}
		break;
	case W_RMW_MIX:
		if (rand_r(&b->seed) % 2 == 0) {
			op_parse(b->locking, key);
		} else {
			op_rmw(b->locking, key);
		}
		break;
	default: break;
	}
}

/* The sum of the adapters' round_trips counters, -1 when none keeps one. */
static long round_trips(void)
{
	PyGILState_STATE gil;
	PyObject *module, *result;
	long total = -1;

	if (!Py_IsInitialized()) {
		return -1;
	}
	gil = PyGILState_Ensure();
	module = PyImport_ImportModule("dbwrap_py.bench.micro");
	result = module ? PyObject_CallMethod(module, "round_trips", NULL) : NULL;
	if (result != NULL) {
		total = PyLong_AsLong(result);
	} else {
		PyErr_Print();
	}
	Py_XDECREF(result);
	Py_XDECREF(module);
	PyGILState_Release(gil);
	return total;
}

static int compare_doubles(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double percentile(const double *sorted, int n, double p)
{
	int i = (int)ceil(p / 100.0 * n) - 1;

	return n == 0 ? 0 : sorted[i < 0 ? 0 : i];
}

static void measure(struct bench *b, const struct workload *w, int first)
{
	int warmup = b->s.max_ops / 20 < 50 ? b->s.max_ops / 20 : 50;
	double start, deadline, elapsed, sum = 0;
	long rt_before, rt_after;
	int i, n = 0;

	for (i = 0; i < warmup; i++) {
		run_one(b, w);
	}
	rt_before = round_trips();
	start = now_ns();
	deadline = start + b->s.seconds * 1e9;
	while (n < b->s.max_ops) {
		double t0 = now_ns(), t1;

		run_one(b, w);
		t1 = now_ns();
		b->latency_ns[n++] = t1 - t0;
		sum += t1 - t0;
		if (t1 > deadline) {
			break;
		}
	}
	elapsed = now_ns() - start;
	rt_after = round_trips();
	qsort(b->latency_ns, n, sizeof(double), compare_doubles);
	printf("%s\n    {\"workload\": \"%s\", \"keys\": \"%s\", \"mix\": \"%s\", \"ops\": %d,"
	       " \"ops_per_second\": %.1f, \"mean_us\": %.3f, \"p50_us\": %.3f,"
	       " \"p90_us\": %.3f, \"p99_us\": %.3f, \"max_us\": %.3f,"
	       " \"round_trips_per_op\": %.3f}",
	       first ? "" : ",", w->name, dist_names[w->dist], w->mix ? w->mix : "",
	       n, n / (elapsed / 1e9), sum / n / 1e3,
	       percentile(b->latency_ns, n, 50) / 1e3, percentile(b->latency_ns, n, 90) / 1e3,
	       percentile(b->latency_ns, n, 99) / 1e3, b->latency_ns[n - 1] / 1e3,
	       rt_before >= 0 && rt_after >= 0 ? (double)(rt_after - rt_before) / n : -1.0);
	fflush(stdout);
}

/* -- set-up ---------------------------------------------------------------- */

static struct db_context *open_db(TALLOC_CTX *mem, const struct settings *s,
				  const char *dir, const char *name)
{
	char *path = talloc_asprintf(mem, "%s/%s", dir, name);
	/* what smbd's db_open gives its volatile databases: robust mutexes */
	int flags = TDB_CLEAR_IF_FIRST | TDB_INCOMPATIBLE_HASH | TDB_SEQNUM |
		    TDB_MUTEX_LOCKING;

	unlink(path);
	if (strcmp(s->backend, "native") == 0) {
		return db_open_tdb(mem, path, 0, flags, O_RDWR | O_CREAT, 0600,
				   DBWRAP_LOCK_ORDER_NONE, 0);
	}
	return db_open_py(mem, path, 0, flags, O_RDWR | O_CREAT, 0600,
			  DBWRAP_LOCK_ORDER_NONE, 0, s->backend, s->options);
}

static int parse_args(int argc, char **argv, struct settings *s)
{
	int i, nopt = 0;

	*s = (struct settings) { .max_ops = 20000, .seconds = 2.0, .keys = 1000 };
	for (i = 1; i < argc; i++) {
		const char *next = i + 1 < argc ? argv[i + 1] : NULL;

		if (strcmp(argv[i], "-n") == 0 && next) {
			s->max_ops = atoi(argv[++i]);
		} else if (strcmp(argv[i], "-t") == 0 && next) {
			s->seconds = atof(argv[++i]);
		} else if (strcmp(argv[i], "-k") == 0 && next) {
			s->keys = atoi(argv[++i]);
		} else if (strcmp(argv[i], "-d") == 0 && next) {
			s->dir = argv[++i];
		} else if (strcmp(argv[i], "-o") == 0 && next && nopt < MAX_OPTIONS) {
			s->options[nopt++] = argv[++i];
		} else if (argv[i][0] != '-' && s->backend == NULL) {
			s->backend = argv[i];
		} else {
			return -1;
		}
	}
	return s->backend != NULL && s->max_ops > 0 && s->keys > 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
	char tmpdir[] = "/tmp/dbwrap_py_micro.XXXXXX";
	const char *dir;
	TALLOC_CTX *mem = talloc_new(NULL);
	struct bench b = { .seed = 12345 };
	struct keybuf k;
	size_t w;
	int i;

	if (parse_args(argc, argv, &b.s) != 0) {
		fprintf(stderr, "usage: bench_micro native|ADAPTER [-n MAX_OPS] [-t SECONDS]"
				" [-k KEYS] [-d DIR] [-o K=V ...]\n");
		return 2;
	}
	dir = b.s.dir != NULL ? b.s.dir : mkdtemp(tmpdir);
	if (dir == NULL) {
		perror("mkdtemp");
		return 1;
	}
	b.locking = open_db(mem, &b.s, dir, "locking.tdb");
	b.open_global = open_db(mem, &b.s, dir, "smbXsrv_open_global.tdb");
	if (b.locking == NULL || b.open_global == NULL) {
		fprintf(stderr, "bench_micro: cannot open the databases on %s\n", b.s.backend);
		return 1;
	}
	b.zipf_cdf = zipf_cdf_new(b.s.keys, ZIPF_THETA);
	b.latency_ns = malloc(sizeof(double) * b.s.max_ops);
	memset(value_bytes, 'v', sizeof(value_bytes));
	for (i = 0; i < b.s.keys; i++) { /* the read workloads hit */
		op_store(b.locking, make_key(&k, "key-", i));
	}

	printf("{\"backend\": \"%s\", \"keys\": %d, \"max_ops\": %d, \"seconds\": %g,"
	       " \"zipf_theta\": %g, \"results\": [", b.s.backend, b.s.keys, b.s.max_ops,
	       b.s.seconds, ZIPF_THETA);
	for (w = 0; w < NUM_WORKLOADS; w++) {
		measure(&b, &workloads[w], w == 0);
	}
	printf("\n]}\n");

	TALLOC_FREE(b.open_global);
	TALLOC_FREE(b.locking);
	for (i = 0; i < 2; i++) {
		const char *names[] = { "locking.tdb", "smbXsrv_open_global.tdb" };
		char *path = talloc_asprintf(mem, "%s/%s", dir, names[i]);

		unlink(path);
	}
	if (b.s.dir == NULL) {
		rmdir(dir); /* fails, harmlessly, when an adapter left files */
	}
	free(b.zipf_cdf);
	free(b.latency_ns);
	talloc_free(mem);
	return 0;
}
