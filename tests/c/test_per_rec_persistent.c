/*
 * Samba 4.25's per-record persistence (DBWRAP_FLAG_PER_REC_PERSISTENT) on
 * the tdb adapter writes native 4.25 files: the volatile tdb's header on
 * each value and its <name>_persistent.tdb. The rules themselves are the
 * conformance suite's (conformance/checks/checks_persistence.c), on every
 * adapter.
 */

#include "harness.h"

#if DBWRAP_PY_SAMBA_4_25_LAYOUT

#define PER_REC DBWRAP_FLAG_PER_REC_PERSISTENT
#define DB_FILE "per_rec.tdb"

static const struct dbwrap_wipe_flags wipe_volatile = { .wipe_default = true };

static struct db_context *open_per_rec(TALLOC_CTX *mem_ctx, const struct backend *b,
				       const char *dir)
{
	return reopen_db(mem_ctx, b, dir, DB_FILE, VOLATILE_FLAGS,
			 DBWRAP_LOCK_ORDER_1, PER_REC);
}

static NTSTATUS store_flagged(struct db_context *db, const char *key,
			      const char *value, int flag)
{
	struct db_record *rec = dbwrap_fetch_locked(db, db, str_data(key));
	NTSTATUS status;

	if (rec == NULL) {
		return NT_STATUS_INTERNAL_DB_ERROR;
	}
	status = dbwrap_record_store(rec, str_data(value), flag);
	TALLOC_FREE(rec);
	return status;
}

/* The record's value as a string ("" for none) and its persistence flag. */
static const char *fetch_flagged(struct db_context *db, const char *key,
				 bool *persistent)
{
	struct db_record *rec = dbwrap_fetch_locked(db, db, str_data(key));
	TDB_DATA v;
	char *text;

	if (rec == NULL) {
		return "(fetch_locked failed)";
	}
	v = dbwrap_record_get_value(rec);
	*persistent = dbwrap_record_get_flags(rec).persistent;
	text = v.dsize == 0 ? talloc_strdup(db, "")
			    : talloc_strndup(db, (const char *)v.dptr, v.dsize);
	TALLOC_FREE(rec);
	return text != NULL ? text : "(no memory)";
}

/* The tdb adapter's files are native 4.25 ones: each opens what the other wrote. */
static enum result test_files_are_native(const struct backend *b, const char *dir)
{
	static const struct backend native = { "native-tdb", NULL, true, NULL };
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db;
	bool persistent;
	const char *v;

	if (b->adapter == NULL || strcmp(b->adapter, "tdb") != 0 || b->options != NULL) {
		SKIP_BECAUSE("the tdb adapter's own files only");
	}
	db = open_per_rec(mem, b, dir);
	CHECK(db != NULL, "bridge open failed");
	CHECK(NT_STATUS_IS_OK(store_flagged(db, "b", "bridge", DBWRAP_STORE_PERSISTENT)), "store");
	CHECK(dbwrap_wipe(db, wipe_volatile) == 0, "wipe failed");
	TALLOC_FREE(db);
	db = open_per_rec(mem, &native, dir);
	CHECK(db != NULL, "native open failed");
	v = fetch_flagged(db, "b", &persistent);
	CHECK(strcmp(v, "bridge") == 0 && persistent, "native read '%s', persistent %d", v, persistent);
	CHECK(NT_STATUS_IS_OK(store_flagged(db, "n", "native", DBWRAP_STORE_PERSISTENT)), "store");
	CHECK(dbwrap_wipe(db, wipe_volatile) == 0, "native wipe failed");
	TALLOC_FREE(db);
	db = open_per_rec(mem, b, dir);
	CHECK(db != NULL, "bridge reopen failed");
	v = fetch_flagged(db, "n", &persistent);
	CHECK(strcmp(v, "native") == 0 && persistent, "bridge read '%s', persistent %d", v, persistent);
	TALLOC_FREE(mem);
	return PASS;
}

const struct test_case per_rec_tests[] = {
	{ "per-record: tdb files are native 4.25's", test_files_are_native },
	{ NULL, NULL },
};

#else

/* Before 4.25 Samba has no per-record persistence. */
const struct test_case per_rec_tests[] = {
	{ NULL, NULL },
};

#endif
