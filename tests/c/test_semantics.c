/*
 * Single-process dbwrap semantics, through Samba's real dbwrap front end.
 * Each check mirrors one of Samba's local tests or a rule of the reference
 * (lib/dbwrap/dbwrap.c, dbwrap_tdb.c, source3/torture), and runs on native
 * tdb in the same program so every divergence shows.
 */

#include <stdlib.h>

#include "harness.h"

/* -- LOCAL-DBWRAP-DO-LOCKED1, plus the watch layer's read-your-writes -------- */

struct do_locked_state {
	struct db_context *db;
	TDB_DATA store;     /* store this, or delete if dptr is NULL */
	NTSTATUS status;
	NTSTATUS reread_status;
	TDB_DATA reread;    /* what parse_record saw inside the callback */
	bool value_valid;
};

static void copy_parser(TDB_DATA key, TDB_DATA data, void *private_data)
{
	TDB_DATA *out = private_data;

	out->dptr = talloc_memdup(NULL, data.dptr, data.dsize);
	out->dsize = data.dsize;
}

static void do_locked_fn(struct db_record *rec, TDB_DATA value, void *private_data)
{
	struct do_locked_state *state = private_data;

	state->value_valid = rec->value_valid;
	if (state->store.dptr != NULL) {
		state->status = dbwrap_record_store(rec, state->store, 0);
	} else {
		state->status = dbwrap_record_delete(rec);
	}
	/* db_watched_record_fini() re-reads the locked key like this */
	state->reread_status = dbwrap_parse_record(state->db, rec->key,
						   copy_parser, &state->reread);
}

static enum result test_do_locked1(const struct backend *b, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = open_db(mem, b, dir, "do_locked1.tdb",
					VOLATILE_FLAGS, DBWRAP_LOCK_ORDER_1);
	TDB_DATA key = str_data("key"), got = tdb_null;
	struct do_locked_state state = { .db = db, .store = str_data("value") };
	NTSTATUS status;

	CHECK(db != NULL, "open failed");
	status = dbwrap_do_locked(db, key, do_locked_fn, &state);
	CHECK_STATUS(status, NT_STATUS_OK);
	CHECK_STATUS(state.status, NT_STATUS_OK);
	CHECK(!state.value_valid, "value_valid must be false inside do_locked");
	CHECK_STATUS(state.reread_status, NT_STATUS_OK);
	CHECK(state.reread.dsize == 5 && memcmp(state.reread.dptr, "value", 5) == 0,
	      "the lock holder did not read its own write");
	talloc_free(state.reread.dptr);

	status = dbwrap_parse_record(db, key, copy_parser, &got);
	CHECK_STATUS(status, NT_STATUS_OK);
	CHECK(got.dsize == 5 && memcmp(got.dptr, "value", 5) == 0, "stored value differs");
	talloc_free(got.dptr);

	state = (struct do_locked_state) { .db = db };
	status = dbwrap_do_locked(db, key, do_locked_fn, &state);
	CHECK_STATUS(status, NT_STATUS_OK);
	CHECK_STATUS(state.status, NT_STATUS_OK);
	CHECK_STATUS(state.reread_status, NT_STATUS_NOT_FOUND);
	status = dbwrap_parse_record(db, key, NULL, NULL);
	CHECK_STATUS(status, NT_STATUS_NOT_FOUND);
	talloc_free(mem);
	return PASS;
}

/* -- a sequence of writes inside one do_locked ---------------------------------- */

/*
 * The bridge defers a plain store made inside do_locked until the unlock;
 * this sequence must still behave exactly as on native tdb, where every
 * write lands at once.
 */
struct write_sequence {
	struct db_context *db;
	NTSTATUS s1, s2, insert, del, s3, parse1, parse2, parse3;
	TDB_DATA read1, read2;
	bool exists;
};

static void write_sequence_fn(struct db_record *rec, TDB_DATA value,
			      void *private_data)
{
	struct write_sequence *w = private_data;

	w->s1 = dbwrap_record_store(rec, str_data("first"), 0);
	w->parse1 = dbwrap_parse_record(w->db, rec->key, copy_parser, &w->read1);
	w->s2 = dbwrap_record_store(rec, str_data("second"), TDB_REPLACE);
	w->exists = dbwrap_exists(w->db, rec->key);
	w->parse2 = dbwrap_parse_record(w->db, rec->key, copy_parser, &w->read2);
	w->insert = dbwrap_record_store(rec, str_data("never"), TDB_INSERT);
	w->del = dbwrap_record_delete(rec);
	w->parse3 = dbwrap_parse_record(w->db, rec->key, NULL, NULL);
	w->s3 = dbwrap_record_store(rec, str_data("third"), 0);
}

static enum result test_write_sequence(const struct backend *b, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = open_db(mem, b, dir, "seq.tdb", VOLATILE_FLAGS,
					DBWRAP_LOCK_ORDER_1);
	struct write_sequence w = { .db = db };
	TDB_DATA key = str_data("seqkey"), got;

	CHECK(db != NULL, "open failed");
	CHECK_STATUS(dbwrap_do_locked(db, key, write_sequence_fn, &w), NT_STATUS_OK);
	CHECK_STATUS(w.s1, NT_STATUS_OK);
	CHECK_STATUS(w.parse1, NT_STATUS_OK);
	CHECK(w.read1.dsize == 5 && memcmp(w.read1.dptr, "first", 5) == 0,
	      "first store not read back");
	CHECK_STATUS(w.s2, NT_STATUS_OK);
	CHECK(w.exists, "exists() missed the store made inside do_locked");
	CHECK(w.read2.dsize == 6 && memcmp(w.read2.dptr, "second", 6) == 0,
	      "second store not read back");
	CHECK_STATUS(w.insert, NT_STATUS_OBJECT_NAME_COLLISION);
	CHECK_STATUS(w.del, NT_STATUS_OK);
	CHECK_STATUS(w.parse3, NT_STATUS_NOT_FOUND);
	CHECK_STATUS(w.s3, NT_STATUS_OK);
	CHECK_STATUS(dbwrap_fetch(db, mem, key, &got), NT_STATUS_OK);
	CHECK(got.dsize == 5 && memcmp(got.dptr, "third", 5) == 0,
	      "the last store did not land");
	talloc_free(w.read1.dptr);
	talloc_free(w.read2.dptr);
	talloc_free(mem);
	return PASS;
}

/* -- LOCAL-RBTREE: flag statuses, 999 keys, traverse counts ------------------- */

static int count_fn(struct db_record *rec, void *private_data)
{
	return 0;
}

static int delete_fn(struct db_record *rec, void *private_data)
{
	int *deleted = private_data;

	if (NT_STATUS_IS_OK(dbwrap_record_delete(rec))) {
		*deleted += 1;
	}
	return 0;
}

static enum result check_flags(struct db_context *db)
{
	TDB_DATA key = str_data("flagkey");
	NTSTATUS status;

	status = dbwrap_store(db, key, str_data("a"), TDB_MODIFY);
	/* tdb says NOT_FOUND, rbt OBJECT_NAME_NOT_FOUND; the bridge follows tdb */
	CHECK_STATUS(status, NT_STATUS_NOT_FOUND);
	status = dbwrap_store(db, key, str_data("a"), TDB_INSERT);
	CHECK_STATUS(status, NT_STATUS_OK);
	status = dbwrap_store(db, key, str_data("b"), TDB_INSERT);
	CHECK_STATUS(status, NT_STATUS_OBJECT_NAME_COLLISION);
	status = dbwrap_store(db, key, str_data("c"), TDB_MODIFY);
	CHECK_STATUS(status, NT_STATUS_OK);
	status = dbwrap_store(db, key, str_data("d"), TDB_REPLACE);
	CHECK_STATUS(status, NT_STATUS_OK);
	status = dbwrap_delete(db, key);
	CHECK_STATUS(status, NT_STATUS_OK);
	status = dbwrap_delete(db, key);
	CHECK_STATUS(status, NT_STATUS_NOT_FOUND);
	return PASS;
}

static enum result test_rbtree(const struct backend *b, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = open_db(mem, b, dir, "rbtree.tdb", VOLATILE_FLAGS,
					DBWRAP_LOCK_ORDER_NONE);
	char key[32], value[32];
	int i, round, count = -1, deleted = 0;
	TDB_DATA got;
	NTSTATUS status;

	CHECK(db != NULL, "open failed");
	if (check_flags(db) != PASS) {
		return FAIL;
	}
	srandom(4711);
	for (round = 0; round < 2; round++) {
		for (i = 0; i < 999; i++) {
			snprintf(key, sizeof(key), "key-%d", i);
			snprintf(value, sizeof(value), "v%d-%ld", round, random());
			status = dbwrap_store(db, str_data(key), str_data(value), 0);
			CHECK_STATUS(status, NT_STATUS_OK);
			status = dbwrap_fetch(db, mem, str_data(key), &got);
			CHECK_STATUS(status, NT_STATUS_OK);
			CHECK(got.dsize == strlen(value) &&
			      memcmp(got.dptr, value, got.dsize) == 0,
			      "read-back of %s differs", key);
		}
	}
	status = dbwrap_traverse_read(db, count_fn, NULL, &count);
	CHECK_STATUS(status, NT_STATUS_OK);
	CHECK(count == 999, "traverse_read counted %d, expected 999", count);
	status = dbwrap_traverse(db, delete_fn, &deleted, &count);
	CHECK_STATUS(status, NT_STATUS_OK);
	CHECK(count == 999 && deleted == 999,
	      "deleting traverse: count %d, deleted %d", count, deleted);
	status = dbwrap_traverse_read(db, count_fn, NULL, &count);
	CHECK_STATUS(status, NT_STATUS_OK);
	CHECK(count == 0, "%d records left after deleting them all", count);
	talloc_free(mem);
	return PASS;
}

/* -- traverse_read refuses writes; early stop ---------------------------------- */

struct write_in_read_state {
	NTSTATUS store, del;
	int calls;
};

static int write_in_read_fn(struct db_record *rec, void *private_data)
{
	struct write_in_read_state *state = private_data;

	state->store = dbwrap_record_store(rec, str_data("x"), 0);
	state->del = dbwrap_record_delete(rec);
	state->calls += 1;
	return 0;
}

static int stop_fn(struct db_record *rec, void *private_data)
{
	return 1;
}

static enum result test_traverse_rules(const struct backend *b, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = open_db(mem, b, dir, "trav.tdb", VOLATILE_FLAGS,
					DBWRAP_LOCK_ORDER_NONE);
	struct write_in_read_state state = { .calls = 0 };
	int count = -1;
	NTSTATUS status;

	CHECK(db != NULL, "open failed");
	CHECK_STATUS(dbwrap_store(db, str_data("a"), str_data("1"), 0), NT_STATUS_OK);
	CHECK_STATUS(dbwrap_store(db, str_data("b"), str_data("2"), 0), NT_STATUS_OK);
	CHECK_STATUS(dbwrap_store(db, str_data("c"), str_data("3"), 0), NT_STATUS_OK);

	status = dbwrap_traverse_read(db, write_in_read_fn, &state, &count);
	CHECK_STATUS(status, NT_STATUS_OK);
	CHECK(state.calls == 3, "callback ran %d times", state.calls);
	CHECK_STATUS(state.store, NT_STATUS_MEDIA_WRITE_PROTECTED);
	CHECK_STATUS(state.del, NT_STATUS_MEDIA_WRITE_PROTECTED);

	/* tdb counts the record the callback stopped on */
	status = dbwrap_traverse(db, stop_fn, NULL, &count);
	CHECK_STATUS(status, NT_STATUS_OK);
	CHECK(count == 1, "early stop counted %d, expected 1", count);
	status = dbwrap_traverse_read(db, stop_fn, NULL, &count);
	CHECK_STATUS(status, NT_STATUS_OK);
	CHECK(count == 1, "early stop (read) counted %d, expected 1", count);
	/* the stopped traverse released its lock: the record is lockable */
	CHECK_STATUS(dbwrap_store(db, str_data("a"), str_data("9"), 0), NT_STATUS_OK);
	talloc_free(mem);
	return PASS;
}

/* -- fetch_locked of a missing key, record lifetime ---------------------------- */

static enum result test_fetch_locked(const struct backend *b, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = open_db(mem, b, dir, "fl.tdb", VOLATILE_FLAGS,
					DBWRAP_LOCK_ORDER_1);
	struct db_record *rec;
	TDB_DATA value;

	CHECK(db != NULL, "open failed");
	rec = dbwrap_fetch_locked(db, mem, str_data("missing"));
	CHECK(rec != NULL, "fetch_locked of a missing key must return a record");
	value = dbwrap_record_get_value(rec); /* panics unless value_valid */
	CHECK(value.dptr == NULL && value.dsize == 0, "missing key has a value");
	CHECK_STATUS(dbwrap_record_store(rec, str_data("new"), 0), NT_STATUS_OK);
	TALLOC_FREE(rec);

	rec = dbwrap_fetch_locked(db, mem, str_data("missing"));
	CHECK(rec != NULL, "second fetch_locked failed");
	value = dbwrap_record_get_value(rec);
	CHECK(value.dsize == 3 && memcmp(value.dptr, "new", 3) == 0, "value lost");
	CHECK_STATUS(dbwrap_record_delete(rec), NT_STATUS_OK);
	value = dbwrap_record_get_value(rec);
	CHECK(value.dsize == 0, "dbwrap sets the value to null after a delete");
	TALLOC_FREE(rec);
	CHECK(!dbwrap_exists(db, str_data("missing")), "deleted key still exists");
	talloc_free(mem);
	return PASS;
}

/* -- transactions (tdb rules) -------------------------------------------------- */

static enum result test_transactions(const struct backend *b, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = open_db(mem, b, dir, "trans.tdb", PERSISTENT_FLAGS,
					DBWRAP_LOCK_ORDER_1);
	struct db_context *vol = open_db(mem, b, dir, "trans_vol.tdb",
					 VOLATILE_FLAGS, DBWRAP_LOCK_ORDER_1);
	TDB_DATA key = str_data("tkey"), got;

	CHECK(db != NULL && vol != NULL, "open failed");
	CHECK(dbwrap_is_persistent(db) && !dbwrap_is_persistent(vol),
	      "persistence must follow TDB_CLEAR_IF_FIRST");
	CHECK(dbwrap_transaction_start(vol) != 0,
	      "transactions must be refused on a volatile database");

	CHECK(dbwrap_transaction_start(db) == 0, "start failed");
	CHECK_STATUS(dbwrap_store(db, key, str_data("cancelled"), 0), NT_STATUS_OK);
	CHECK(dbwrap_transaction_cancel(db) == 0, "cancel failed");
	CHECK_STATUS(dbwrap_fetch(db, mem, key, &got), NT_STATUS_NOT_FOUND);

	CHECK(dbwrap_transaction_start(db) == 0, "start failed");
	CHECK_STATUS(dbwrap_store(db, key, str_data("one"), 0), NT_STATUS_OK);
	CHECK_STATUS(dbwrap_store(db, str_data("tkey2"), str_data("two"), 0),
		     NT_STATUS_OK);
	CHECK(dbwrap_transaction_commit(db) == 0, "commit failed");
	CHECK_STATUS(dbwrap_fetch(db, mem, key, &got), NT_STATUS_OK);
	CHECK(got.dsize == 3 && memcmp(got.dptr, "one", 3) == 0, "commit lost");

	/* nested: an inner cancel makes the outer commit fail, nothing lands */
	CHECK(dbwrap_transaction_start(db) == 0, "outer start failed");
	CHECK_STATUS(dbwrap_store(db, key, str_data("nested"), 0), NT_STATUS_OK);
	CHECK(dbwrap_transaction_start(db) == 0, "inner start failed");
	CHECK(dbwrap_transaction_cancel(db) == 0, "inner cancel failed");
	CHECK(dbwrap_transaction_commit(db) != 0,
	      "outer commit must fail after an inner cancel");
	CHECK_STATUS(dbwrap_fetch(db, mem, key, &got), NT_STATUS_OK);
	CHECK(got.dsize == 3 && memcmp(got.dptr, "one", 3) == 0,
	      "a failed nested transaction leaked a write");

	CHECK_STATUS(dbwrap_transaction_start_nonblock(db), NT_STATUS_OK);
	CHECK(dbwrap_transaction_cancel(db) == 0, "cancel after nonblock start failed");
	talloc_free(mem);
	return PASS;
}

/* -- wipe, check, exists, id, seqnum ------------------------------------------- */

static enum result test_misc(const struct backend *b, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = open_db(mem, b, dir, "misc.tdb", VOLATILE_FLAGS,
					DBWRAP_LOCK_ORDER_NONE);
	uint8_t id1[256], id2[256];
	size_t idlen1;
	int seq1, seq2, count = -1;

	CHECK(db != NULL, "open failed");
	seq1 = dbwrap_get_seqnum(db);
	CHECK_STATUS(dbwrap_store(db, str_data("k"), str_data(""), 0), NT_STATUS_OK);
	seq2 = dbwrap_get_seqnum(db);
	CHECK(seq1 != seq2, "seqnum did not change on a store (%d)", seq1);
	CHECK(dbwrap_exists(db, str_data("k")), "an empty value must exist");
	CHECK(!dbwrap_exists(db, str_data("nope")), "a missing key exists");
	CHECK(dbwrap_check(db) == 0, "check failed");

	idlen1 = dbwrap_db_id(db, NULL, 0);
	CHECK(idlen1 > 0 && idlen1 <= sizeof(id1), "db id length %zu", idlen1);
	CHECK(dbwrap_db_id(db, id1, sizeof(id1)) == idlen1, "id length changed");
	CHECK(dbwrap_db_id(db, id2, sizeof(id2)) == idlen1, "id length changed");
	CHECK(memcmp(id1, id2, idlen1) == 0, "db id must be stable");

	CHECK(dbwrap_py_wipe(db) == 0, "wipe failed");
	CHECK_STATUS(dbwrap_traverse_read(db, count_fn, NULL, &count), NT_STATUS_OK);
	CHECK(count == 0, "%d records after wipe", count);
	talloc_free(mem);
	return PASS;
}

/* -- binary keys and a multi-buffer storev ------------------------------------- */

static enum result test_binary(const struct backend *b, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = open_db(mem, b, dir, "bin.tdb", VOLATILE_FLAGS,
					DBWRAP_LOCK_ORDER_NONE);
	uint8_t keybuf[] = { 0x00, 0xff, 0x00, 0x80, 0x7f };
	TDB_DATA key = { keybuf, sizeof(keybuf) }, got;
	TDB_DATA parts[3] = { str_data("ab"), { NULL, 0 }, str_data("cde") };
	struct db_record *rec;

	CHECK(db != NULL, "open failed");
	rec = dbwrap_fetch_locked(db, mem, key);
	CHECK(rec != NULL, "fetch_locked failed");
	CHECK_STATUS(dbwrap_record_storev(rec, parts, 3, 0), NT_STATUS_OK);
	TALLOC_FREE(rec);
	CHECK_STATUS(dbwrap_fetch(db, mem, key, &got), NT_STATUS_OK);
	CHECK(got.dsize == 5 && memcmp(got.dptr, "abcde", 5) == 0,
	      "storev buffers were not joined in order");
	talloc_free(mem);
	return PASS;
}

const struct test_case semantics_tests[] = {
	{ "DO-LOCKED1 (+ read-your-writes)", test_do_locked1 },
	{ "write sequence inside do_locked", test_write_sequence },
	{ "RBTREE (flags, 999 keys, traverse)", test_rbtree },
	{ "traverse_read protection, early stop", test_traverse_rules },
	{ "fetch_locked missing key, lifetime", test_fetch_locked },
	{ "transactions, nesting", test_transactions },
	{ "seqnum, exists, check, id, wipe", test_misc },
	{ "binary keys, multi-buffer storev", test_binary },
	{ NULL, NULL },
};
