/*
 * test_dbwrap: Samba's real dbwrap front end (libdbwrap-samba4.so.0) against
 * native tdb and the dbwrap_py bridge, side by side in one run.
 *
 * Usage: test_dbwrap [substring-of-check-name]
 * Set DBWRAP_PY_PATH to tests/fixtures for the misbehaving adapter, and
 * DBWRAP_PY_PROXY_SOCKET to a node daemon's socket for the bridge+proxy
 * column (the tdb adapter in the daemon): `make test-c` starts one.
 */

#include <Python.h> /* to check that loading the bridge does not start Python */

#include <ftw.h>
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"

/* the tdb adapter's hot path through its Python methods, not native records */
static const char *const tdb_python_path[] = { "native_records=no", NULL };

/* the tdb adapter in the node daemon; the socket comes from the environment */
static char proxy_socket_option[300];
static const char *const proxy_options[] = {
	"transport=proxy", proxy_socket_option, "proxy_timeout=20", NULL
};

static const struct backend backends[] = {
	{ "native-tdb", NULL, true, NULL },
	{ "bridge+tdb", "tdb", true, NULL },
	{ "bridge+tdb-py", "tdb", true, tdb_python_path },
	{ "bridge+memory", "memory", false, NULL },
	{ "bridge+sqlite", "sqlite", true, NULL },
	{ "bridge+proxy", "tdb", true, proxy_options },
};
#define NUM_BACKENDS (sizeof(backends) / sizeof(backends[0]))

static const struct backend misbehaving = { "bridge+misbehaving", NULL, false, NULL };

static int counts[3]; /* PASS, FAIL, SKIP */

static int remove_entry(const char *path, const struct stat *st, int flag,
			struct FTW *ftw)
{
	return remove(path);
}

static const char *result_word(enum result r)
{
	return r == PASS ? "pass" : r == FAIL ? "FAIL" : "skip";
}

static enum result run_one(const struct test_case *t, const struct backend *b,
			   const char *root, int index)
{
	char dir[512];
	enum result r;

	snprintf(dir, sizeof(dir), "%s/%d-%s", root, index, b->name);
	mkdir(dir, 0700);
	result_note[0] = '\0';
	r = t->fn(b, dir);
	counts[r]++;
	return r;
}

static void run_group(const struct test_case *tests, const char *filter,
		      const char *root, int *index)
{
	enum result r[NUM_BACKENDS];
	char notes[NUM_BACKENDS][sizeof(result_note)];
	size_t i, j;

	for (i = 0; tests[i].name != NULL; i++) {
		if (filter != NULL && strstr(tests[i].name, filter) == NULL) {
			continue;
		}
		for (j = 0; j < NUM_BACKENDS; j++) {
			r[j] = run_one(&tests[i], &backends[j], root, (*index)++);
			snprintf(notes[j], sizeof(notes[j]), "%s", result_note);
		}
		printf("%-40s", tests[i].name);
		for (j = 0; j < NUM_BACKENDS; j++) {
			printf(" %-14s", result_word(r[j]));
		}
		printf("\n");
		for (j = 0; j < NUM_BACKENDS; j++) {
			if (r[j] != PASS && notes[j][0] != '\0') {
				printf("    %s: %s\n", backends[j].name, notes[j]);
			}
		}
		fflush(stdout);
	}
}

static void run_bridge_only(const struct test_case *tests, const char *filter,
			    const char *root, int *index)
{
	enum result r;
	size_t i;

	for (i = 0; tests[i].name != NULL; i++) {
		if (filter != NULL && strstr(tests[i].name, filter) == NULL) {
			continue;
		}
		r = run_one(&tests[i], &misbehaving, root, (*index)++);
		printf("%-40s %-14s %-14s\n", tests[i].name, "-", result_word(r));
		if (r != PASS) {
			printf("    %s: %s\n", misbehaving.name, result_note);
		}
		fflush(stdout);
	}
}

int main(int argc, char **argv)
{
	const char *filter = argc > 1 ? argv[1] : NULL;
	const char *tmp = getenv("TMPDIR");
	char root[512];
	int index = 0;
	size_t j;

	/* lazy start: loading the bridge must not start an interpreter */
	if (Py_IsInitialized()) {
		printf("FAIL: Python started before any database was opened\n");
		return 1;
	}
	if (getenv("DBWRAP_PY_PROXY_SOCKET") == NULL) {
		printf("FAIL: DBWRAP_PY_PROXY_SOCKET names no node daemon for bridge+proxy\n");
		return 1;
	}
	snprintf(proxy_socket_option, sizeof(proxy_socket_option),
		 "proxy_socket=%s", getenv("DBWRAP_PY_PROXY_SOCKET"));
	snprintf(root, sizeof(root), "%s/dbwrap_py_test.XXXXXX", tmp ? tmp : "/tmp");
	if (mkdtemp(root) == NULL) {
		perror("mkdtemp");
		return 1;
	}

	printf("%-40s", "check");
	for (j = 0; j < NUM_BACKENDS; j++) {
		printf(" %-14s", backends[j].name);
	}
	printf("\n");
	run_group(semantics_tests, filter, root, &index);
	run_group(process_tests, filter, root, &index);
	run_group(quiet_tests, filter, root, &index);
	run_group(per_rec_tests, filter, root, &index);
	run_bridge_only(error_tests, filter, root, &index);

	nftw(root, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
	printf("\n%d passed, %d failed, %d skipped\n", counts[PASS], counts[FAIL],
	       counts[SKIP]);
	return counts[FAIL] == 0 ? 0 : 1;
}
