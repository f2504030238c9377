/*
 * dbwrap_check: the adapter conformance suite's driver.
 *
 * Every check runs through Samba's real dbwrap front end
 * (libdbwrap-samba4.so.0) on the bridge, the path smbd uses, or on native
 * Samba tdb for reference (--native). Each prints one JSON line: the check,
 * the dbwrap rule it enforces, pass/fail/skip, the evidence or the reason,
 * and what it measured.
 */

#ifndef DBWRAP_PY_CHECK_H
#define DBWRAP_PY_CHECK_H

#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "dbwrap_py.h"

/* What is under test, and what its adapter declared (Capabilities). */
struct target {
	const char *adapter;          /* NULL: Samba's native tdb */
	const char *const *options;   /* NULL-terminated "key=value", or NULL */
	bool multi_process;
	bool transactions;
	double lock_release_seconds;  /* 0: a dead holder's lock goes at once */
	size_t max_value_size;        /* 0: no declared limit */
	const char *checker;          /* the Porcupine checker binary, or NULL */
};

enum result { PASS, FAIL, SKIP };

struct check {
	const char *name;   /* group.name, e.g. "lock.counter" */
	const char *rule;   /* the dbwrap rule, citing reference section 1 */
	enum result (*fn)(const struct target *t, const char *dir);
};

/* Filled by a check: why it failed or skipped, and what it measured. */
extern char check_note[512];
extern char check_measured[256];

#define VOLATILE_FLAGS (TDB_CLEAR_IF_FIRST | TDB_INCOMPATIBLE_HASH | TDB_SEQNUM)
#define PERSISTENT_FLAGS TDB_DEFAULT

#define CHECK(cond, ...) do {						\
	if (!(cond)) {							\
		snprintf(check_note, sizeof(check_note), __VA_ARGS__);	\
		return FAIL;						\
	}								\
} while (0)

#define CHECK_STATUS(status, expected, what) CHECK(			\
	NT_STATUS_EQUAL((status), (expected)),				\
	"%s: got %s, expected %s", (what), nt_errstr(status),		\
	nt_errstr(expected))

/* check_open() already wrote the note */
#define CHECK_OPENED(db) do {						\
	if ((db) == NULL) {						\
		return FAIL;						\
	}								\
} while (0)

#define SKIP_BECAUSE(...) do {						\
	snprintf(check_note, sizeof(check_note), __VA_ARGS__);		\
	return SKIP;							\
} while (0)

#define MEASURED(...) \
	snprintf(check_measured, sizeof(check_measured), __VA_ARGS__)

/* -- support.c ------------------------------------------------------------ */

/* Open `file` under dir on the target; NULL and a note on failure. */
struct db_context *check_open(TALLOC_CTX *mem_ctx, const struct target *t,
			      const char *dir, const char *file, int tdb_flags);

/*
 * Runs fn(arg, index) in n children; returns how many failed or overran.
 * Each child's stderr is echoed; the first failed child's exit and its last
 * stderr lines (the bridge's log line, the child's own words) go to
 * children_cause, for the check's note.
 */
extern char children_cause[384];
int run_children(int (*fn)(void *arg, int index), void *arg, int n,
		 unsigned seconds);

long now_ms(void);
void sleep_ms(long ms);

static inline TDB_DATA str_data(const char *s)
{
	return (TDB_DATA) { (uint8_t *)s, strlen(s) };
}

static inline TDB_DATA u32_data(uint32_t *v)
{
	return (TDB_DATA) { (uint8_t *)v, sizeof(*v) };
}

/* A 4-byte value as a number; UINT32_MAX for anything else. */
uint32_t value_u32(TDB_DATA value);

/* Does key hold exactly the string want (without its NUL)? */
bool has_value(struct db_context *db, const char *key, const char *want);

/* The value of key as a number: 0 when missing, UINT32_MAX on error. */
uint32_t fetch_u32(struct db_context *db, const char *key);

/* Microseconds the increments below hold the lock between read and store. */
extern unsigned increment_hold_us;

/* Sleep until the CLOCK_MONOTONIC millisecond `at`: children start together. */
void sleep_until_ms(long at);

/* One fetch_locked + store of value+1; false on any error. */
bool increment_fetch_locked(struct db_context *db, const char *key);

/* One do_locked + store of value+1; false on any error. */
bool increment_do_locked(struct db_context *db, const char *key);

/* -- the check groups, each a NULL-terminated table ------------------------- */

extern const struct check kv_checks[];
extern const struct check traverse_checks[];
extern const struct check transaction_checks[];
extern const struct check database_checks[];
extern const struct check locking_checks[];
extern const struct check history_checks[];
extern const struct check persistence_checks[];

#endif /* DBWRAP_PY_CHECK_H */
