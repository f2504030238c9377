/*
 * Transaction checks on persistent databases: atomic commit, rollback,
 * tdb's nesting rules, refusal on volatile databases, and isolation.
 */

#include <unistd.h>

#include "check.h"

#define SKIP_WITHOUT_TRANSACTIONS(t) do {				\
	if (!(t)->transactions) {					\
		SKIP_BECAUSE("the adapter declares no transactions");	\
	}								\
} while (0)

struct seen_by_child {
	const struct target *t;
	const char *dir;
};

/* A fresh process opens the database and must see all three keys. */
static int child_sees_commit(void *arg, int index)
{
	struct seen_by_child *s = arg;
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = check_open(mem, s->t, s->dir, "commit.tdb",
					   PERSISTENT_FLAGS);

	return db != NULL && has_value(db, "a", "1") && has_value(db, "b", "2") &&
	       has_value(db, "c", "3") ? 0 : 1;
}

static enum result check_commit(const struct target *t, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = check_open(mem, t, dir, "commit.tdb", PERSISTENT_FLAGS);
	struct seen_by_child s = { t, dir };

	SKIP_WITHOUT_TRANSACTIONS(t);
	CHECK_OPENED(db);
	CHECK(dbwrap_transaction_start(db) == 0, "transaction_start failed");
	CHECK_STATUS(dbwrap_store(db, str_data("a"), str_data("1"), 0), NT_STATUS_OK, "store a");
	CHECK_STATUS(dbwrap_store(db, str_data("b"), str_data("2"), 0), NT_STATUS_OK, "store b");
	CHECK_STATUS(dbwrap_store(db, str_data("c"), str_data("3"), 0), NT_STATUS_OK, "store c");
	CHECK(has_value(db, "b", "2"), "a read inside the transaction missed its write");
	CHECK(dbwrap_transaction_commit(db) == 0, "transaction_commit failed");
	CHECK(has_value(db, "a", "1") && has_value(db, "b", "2") && has_value(db, "c", "3"),
	      "a committed key is missing in this process");
	if (t->multi_process) {
		CHECK(run_children(child_sees_commit, &s, 1, 30) == 0,
		      "another process does not see every committed key; %s",
		      children_cause);
	}
	talloc_free(mem);
	return PASS;
}

static enum result check_cancel(const struct target *t, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = check_open(mem, t, dir, "cancel.tdb", PERSISTENT_FLAGS);

	SKIP_WITHOUT_TRANSACTIONS(t);
	CHECK_OPENED(db);
	CHECK_STATUS(dbwrap_store(db, str_data("kept"), str_data("old"), 0), NT_STATUS_OK,
		     "store before the transaction");
	CHECK(dbwrap_transaction_start(db) == 0, "transaction_start failed");
	CHECK_STATUS(dbwrap_store(db, str_data("kept"), str_data("new"), 0), NT_STATUS_OK,
		     "store in the transaction");
	CHECK_STATUS(dbwrap_store(db, str_data("added"), str_data("x"), 0), NT_STATUS_OK,
		     "store in the transaction");
	CHECK_STATUS(dbwrap_delete(db, str_data("kept")), NT_STATUS_OK,
		     "delete in the transaction");
	CHECK(dbwrap_transaction_cancel(db) == 0, "transaction_cancel failed");
	CHECK(has_value(db, "kept", "old"), "cancel did not restore the old value");
	CHECK(!dbwrap_exists(db, str_data("added")), "cancel left an added key");
	talloc_free(mem);
	return PASS;
}

static enum result check_nested(const struct target *t, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = check_open(mem, t, dir, "nested.tdb", PERSISTENT_FLAGS);

	SKIP_WITHOUT_TRANSACTIONS(t);
	CHECK_OPENED(db);
	CHECK(dbwrap_transaction_start(db) == 0, "outer start failed");
	CHECK(dbwrap_transaction_start(db) == 0, "nested start failed");
	CHECK_STATUS(dbwrap_store(db, str_data("n1"), str_data("1"), 0), NT_STATUS_OK, "store");
	CHECK(dbwrap_transaction_commit(db) == 0, "inner commit failed");
	CHECK(dbwrap_transaction_commit(db) == 0, "outer commit failed");
	CHECK(has_value(db, "n1", "1"), "a nested commit lost its write");

	CHECK(dbwrap_transaction_start(db) == 0, "outer start failed");
	CHECK(dbwrap_transaction_start(db) == 0, "nested start failed");
	CHECK_STATUS(dbwrap_store(db, str_data("n2"), str_data("2"), 0), NT_STATUS_OK, "store");
	CHECK(dbwrap_transaction_cancel(db) == 0, "inner cancel failed");
	CHECK(dbwrap_transaction_commit(db) != 0,
	      "the outer commit succeeded after an inner cancel (tdb refuses it)");
	CHECK(!dbwrap_exists(db, str_data("n2")), "a write of a refused commit landed");
	CHECK(dbwrap_transaction_start(db) == 0, "start after a refused commit failed");
	CHECK(dbwrap_transaction_cancel(db) == 0, "cancel failed");
	talloc_free(mem);
	return PASS;
}

static enum result check_volatile_refused(const struct target *t, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = check_open(mem, t, dir, "volatile.tdb", VOLATILE_FLAGS);

	CHECK_OPENED(db);
	CHECK(dbwrap_transaction_start(db) != 0,
	      "a transaction started on a volatile database");
	talloc_free(mem);
	return PASS;
}

/*
 * Isolation: a writer commits rounds that set x then, a moment later, y to
 * the round number. A reader reads x, then y. Had it seen an uncommitted x,
 * its later read of y could be older: y < x.
 */
#define ISOLATION_ROUNDS 40

static int isolation_writer(struct db_context *db)
{
	uint32_t n;

	for (n = 1; n <= ISOLATION_ROUNDS; n++) {
		if (dbwrap_transaction_start(db) != 0 ||
		    !NT_STATUS_IS_OK(dbwrap_store(db, str_data("x"), u32_data(&n), 0))) {
			return 1;
		}
		sleep_ms(5);
		if (!NT_STATUS_IS_OK(dbwrap_store(db, str_data("y"), u32_data(&n), 0)) ||
		    dbwrap_transaction_commit(db) != 0) {
			return 1;
		}
	}
	return 0;
}

static int isolation_reader(struct db_context *db)
{
	uint32_t x = 0, y;

	while (x < ISOLATION_ROUNDS) {
		x = fetch_u32(db, "x");
		y = fetch_u32(db, "y");
		if (x == UINT32_MAX || y == UINT32_MAX) {
			return 2;
		}
		if (y < x) {
			return 3; /* saw x of a transaction before its commit */
		}
		sleep_ms(1);
	}
	return 0;
}

static int isolation_child(void *arg, int index)
{
	struct seen_by_child *s = arg;
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = check_open(mem, s->t, s->dir, "isolation.tdb",
					   PERSISTENT_FLAGS);

	if (db == NULL) {
		return 1;
	}
	return index == 0 ? isolation_writer(db) : isolation_reader(db);
}

static enum result check_isolation(const struct target *t, const char *dir)
{
	struct seen_by_child s = { t, dir };
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = check_open(mem, t, dir, "isolation.tdb", PERSISTENT_FLAGS);
	int failed;

	SKIP_WITHOUT_TRANSACTIONS(t);
	if (!t->multi_process) {
		SKIP_BECAUSE("single-process adapter: no other process to see anything");
	}
	CHECK_OPENED(db);
	failed = run_children(isolation_child, &s, 3, 60);
	CHECK(failed == 0, "%d of 1 writer and 2 readers failed: a reader saw part of "
	      "a transaction, or a call failed; %s", failed, children_cause);
	MEASURED("%d transactions, 2 readers", ISOLATION_ROUNDS);
	talloc_free(mem);
	return PASS;
}

const struct check transaction_checks[] = {
	{ "txn.commit", "§1.8: a commit makes every write of the transaction visible",
	  check_commit },
	{ "txn.cancel", "§1.8: a cancel rolls back stores and deletes", check_cancel },
	{ "txn.nested", "§1.8: nested starts count; an inner cancel makes the outer commit fail",
	  check_nested },
	{ "txn.volatile-refused", "§1.8: no transactions on volatile (CLEAR_IF_FIRST) databases",
	  check_volatile_refused },
	{ "txn.isolation", "§1.8: other processes never see a partial transaction",
	  check_isolation },
	{ NULL },
};
