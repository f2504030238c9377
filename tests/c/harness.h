/*
 * A small harness for running dbwrap checks against several backends in one
 * program: native Samba tdb (db_open_tdb) and the bridge with each adapter.
 */

#ifndef DBWRAP_PY_TEST_HARNESS_H
#define DBWRAP_PY_TEST_HARNESS_H

#include <fcntl.h>
#include <stdio.h>
#include <string.h>

#include "dbwrap_py.h"

struct backend {
	const char *name;
	const char *adapter;   /* NULL: Samba's native tdb backend */
	bool multi_process;    /* several processes share one database */
	const char *const *options; /* adapter options, NULL-terminated, or NULL */
};

enum result { PASS, FAIL, SKIP };

struct test_case {
	const char *name;
	enum result (*fn)(const struct backend *b, const char *dir);
};

/* A fresh database file under dir, removed first. */
struct db_context *open_db(TALLOC_CTX *mem_ctx, const struct backend *b,
			   const char *dir, const char *file, int tdb_flags,
			   enum dbwrap_lock_order order);

/* open_db with db_open's dbwrap_flags (DBWRAP_FLAG_*); again on the same file. */
struct db_context *reopen_db(TALLOC_CTX *mem_ctx, const struct backend *b,
			     const char *dir, const char *file, int tdb_flags,
			     enum dbwrap_lock_order order, uint64_t dbwrap_flags);

/* Reason a check skipped or failed; printed in the result table. */
extern char result_note[256];

#define VOLATILE_FLAGS (TDB_CLEAR_IF_FIRST | TDB_INCOMPATIBLE_HASH | TDB_SEQNUM)
#define PERSISTENT_FLAGS TDB_DEFAULT

#define CHECK(cond, ...) do {						\
	if (!(cond)) {							\
		snprintf(result_note, sizeof(result_note), __VA_ARGS__); \
		fprintf(stderr, "    check failed at %s:%d: %s: %s\n",	\
			__FILE__, __LINE__, #cond, result_note);	\
		return FAIL;						\
	}								\
} while (0)

#define CHECK_STATUS(status, expected) CHECK(				\
	NT_STATUS_EQUAL((status), (expected)),				\
	"got %s, expected %s", nt_errstr(status), nt_errstr(expected))

#define SKIP_BECAUSE(...) do {						\
	snprintf(result_note, sizeof(result_note), __VA_ARGS__);	\
	return SKIP;							\
} while (0)

static inline TDB_DATA str_data(const char *s)
{
	return (TDB_DATA) { (uint8_t *)s, strlen(s) };
}

/* Test groups, each a NULL-terminated table. */
extern const struct test_case semantics_tests[];
extern const struct test_case process_tests[];
extern const struct test_case error_tests[];
extern const struct test_case quiet_tests[];
extern const struct test_case per_rec_tests[]; /* Samba 4.25 on: else empty */

/*
 * Runs fn(arg) in n children at once and waits at most `seconds` for all.
 * Returns how many failed: a non-zero exit, a signal, or the time limit
 * (late children are killed).
 */
int run_children(int (*fn)(void *arg), void *arg, int n, unsigned seconds);

#endif
