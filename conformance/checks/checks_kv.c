/*
 * Key/value checks: keys and values are opaque bytes, storev joins its
 * buffers, and the store flags and missing keys give tdb's statuses.
 */

#include <stdlib.h>

#include "check.h"

#define ONE_MIB (1024 * 1024)

static void copy_parser(TDB_DATA key, TDB_DATA data, void *private_data)
{
	TDB_DATA *out = private_data;

	out->dptr = talloc_memdup(NULL, data.dptr, data.dsize ? data.dsize : 1);
	out->dsize = data.dsize;
}

/* parse_record gives back exactly `want`; the note names `what`. */
static enum result expect_value(struct db_context *db, TDB_DATA key,
				TDB_DATA want, const char *what)
{
	TDB_DATA got = tdb_null;
	NTSTATUS status = dbwrap_parse_record(db, key, copy_parser, &got);
	bool same;

	CHECK_STATUS(status, NT_STATUS_OK, what);
	same = got.dsize == want.dsize &&
	       (want.dsize == 0 || memcmp(got.dptr, want.dptr, want.dsize) == 0);
	talloc_free(got.dptr);
	CHECK(same, "%s: read back %zu bytes that differ from the %zu stored",
	      what, got.dsize, want.dsize);
	CHECK(dbwrap_exists(db, key), "%s: exists() says no after a store", what);
	return PASS;
}

static enum result check_binary_keys(const struct target *t, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = check_open(mem, t, dir, "keys.tdb", VOLATILE_FLAGS);
	static uint8_t nul_key[] = { 0, 'a', 0 };
	static uint8_t nul_key_longer[] = { 0, 'a', 0, 'b' };
	static uint8_t not_utf8[] = { 0xff, 0xfe, 0x80, 0xc3 };
	static uint8_t one_byte[] = { 'x' };
	uint8_t long_key[1024];
	struct { const char *what; TDB_DATA key; } keys[] = {
		{ "key with NUL bytes", { nul_key, sizeof(nul_key) } },
		{ "longer key sharing a NUL prefix", { nul_key_longer, sizeof(nul_key_longer) } },
		{ "non-UTF-8 key", { not_utf8, sizeof(not_utf8) } },
		{ "1-byte key", { one_byte, sizeof(one_byte) } },
		{ "1 KiB key", { long_key, sizeof(long_key) } },
	};
	size_t i, n = sizeof(keys) / sizeof(keys[0]);
	char value[32];

	CHECK_OPENED(db);
	for (i = 0; i < sizeof(long_key); i++) {
		long_key[i] = i % 256;
	}
	for (i = 0; i < n; i++) {
		snprintf(value, sizeof(value), "value %zu", i);
		CHECK_STATUS(dbwrap_store(db, keys[i].key, str_data(value), 0),
			     NT_STATUS_OK, keys[i].what);
	}
	/* read all back after all stores, so one key cannot shadow another */
	for (i = 0; i < n; i++) {
		snprintf(value, sizeof(value), "value %zu", i);
		if (expect_value(db, keys[i].key, str_data(value), keys[i].what) != PASS) {
			return FAIL;
		}
	}
	MEASURED("%zu keys of 1 to 1024 bytes", n);
	talloc_free(mem);
	return PASS;
}

static enum result check_values(const struct target *t, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = check_open(mem, t, dir, "values.tdb", VOLATILE_FLAGS);
	size_t size = ONE_MIB, i;
	uint8_t *big;
	enum result r;

	CHECK_OPENED(db);
	CHECK_STATUS(dbwrap_store(db, str_data("empty"), tdb_null, 0),
		     NT_STATUS_OK, "store of an empty value");
	if (expect_value(db, str_data("empty"), tdb_null, "empty value") != PASS) {
		return FAIL;
	}
	if (t->max_value_size != 0 && t->max_value_size < size) {
		size = t->max_value_size;
	}
	big = talloc_size(mem, size);
	for (i = 0; i < size; i++) {
		big[i] = (i * 7 + i / 251) % 256;
	}
	CHECK_STATUS(dbwrap_store(db, str_data("big"), (TDB_DATA) { big, size }, 0),
		     NT_STATUS_OK, "store of the largest value");
	r = expect_value(db, str_data("big"), (TDB_DATA) { big, size },
			 "largest value");
	MEASURED("empty and %zu-byte values%s", size,
		 size < ONE_MIB ? " (the adapter's declared limit)" : "");
	talloc_free(mem);
	return r;
}

struct storev_state {
	NTSTATUS status;
};

static void storev_fn(struct db_record *rec, TDB_DATA value, void *private_data)
{
	struct storev_state *state = private_data;
	TDB_DATA parts[3] = { str_data("first,"), tdb_null, str_data("second,third") };

	state->status = dbwrap_record_storev(rec, parts, 3, 0);
}

static enum result check_storev(const struct target *t, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = check_open(mem, t, dir, "storev.tdb", VOLATILE_FLAGS);
	struct storev_state state = { NT_STATUS_INTERNAL_ERROR };
	TDB_DATA key = str_data("joined");
	TDB_DATA parts[2] = { str_data("ab"), str_data("cd") };
	struct db_record *rec;

	CHECK_OPENED(db);
	CHECK_STATUS(dbwrap_do_locked(db, key, storev_fn, &state), NT_STATUS_OK,
		     "do_locked");
	CHECK_STATUS(state.status, NT_STATUS_OK, "storev of 3 buffers in do_locked");
	if (expect_value(db, key, str_data("first,second,third"), "do_locked storev") != PASS) {
		return FAIL;
	}
	rec = dbwrap_fetch_locked(db, mem, key);
	CHECK(rec != NULL, "fetch_locked failed");
	CHECK_STATUS(dbwrap_record_storev(rec, parts, 2, 0), NT_STATUS_OK,
		     "storev of 2 buffers on a fetch_locked record");
	TALLOC_FREE(rec);
	if (expect_value(db, key, str_data("abcd"), "fetch_locked storev") != PASS) {
		return FAIL;
	}
	talloc_free(mem);
	return PASS;
}

static enum result check_store_flags(const struct target *t, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = check_open(mem, t, dir, "flags.tdb", VOLATILE_FLAGS);
	TDB_DATA key = str_data("flagkey");

	CHECK_OPENED(db);
	CHECK_STATUS(dbwrap_store(db, key, str_data("a"), TDB_MODIFY),
		     NT_STATUS_NOT_FOUND, "TDB_MODIFY of a missing key");
	CHECK(!dbwrap_exists(db, key), "a refused TDB_MODIFY stored the value");
	CHECK_STATUS(dbwrap_store(db, key, str_data("a"), TDB_INSERT),
		     NT_STATUS_OK, "TDB_INSERT of a new key");
	CHECK_STATUS(dbwrap_store(db, key, str_data("b"), TDB_INSERT),
		     NT_STATUS_OBJECT_NAME_COLLISION, "TDB_INSERT of an existing key");
	if (expect_value(db, key, str_data("a"), "after a refused TDB_INSERT") != PASS) {
		return FAIL;
	}
	CHECK_STATUS(dbwrap_store(db, key, str_data("c"), TDB_MODIFY),
		     NT_STATUS_OK, "TDB_MODIFY of an existing key");
	CHECK_STATUS(dbwrap_store(db, key, str_data("d"), TDB_REPLACE),
		     NT_STATUS_OK, "TDB_REPLACE of an existing key");
	if (expect_value(db, key, str_data("d"), "after TDB_REPLACE") != PASS) {
		return FAIL;
	}
	talloc_free(mem);
	return PASS;
}

static enum result check_missing(const struct target *t, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = check_open(mem, t, dir, "missing.tdb", VOLATILE_FLAGS);
	TDB_DATA key = str_data("never-stored"), value;
	struct db_record *rec;

	CHECK_OPENED(db);
	CHECK_STATUS(dbwrap_parse_record(db, key, NULL, NULL), NT_STATUS_NOT_FOUND,
		     "parse_record of a missing key");
	CHECK_STATUS(dbwrap_fetch(db, mem, key, &value), NT_STATUS_NOT_FOUND,
		     "fetch of a missing key");
	CHECK(!dbwrap_exists(db, key), "exists() of a missing key says yes");
	CHECK_STATUS(dbwrap_delete(db, key), NT_STATUS_NOT_FOUND,
		     "delete of a missing key");
	rec = dbwrap_fetch_locked(db, mem, key);
	CHECK(rec != NULL, "fetch_locked of a missing key failed");
	value = dbwrap_record_get_value(rec);
	CHECK(value.dsize == 0, "fetch_locked of a missing key has %zu bytes",
	      value.dsize);
	TALLOC_FREE(rec);
	CHECK(!dbwrap_exists(db, key), "freeing an unchanged record created the key");
	CHECK_STATUS(dbwrap_store(db, key, str_data("now"), 0), NT_STATUS_OK, "store");
	CHECK_STATUS(dbwrap_delete(db, key), NT_STATUS_OK, "delete of a stored key");
	CHECK_STATUS(dbwrap_parse_record(db, key, NULL, NULL), NT_STATUS_NOT_FOUND,
		     "parse_record after delete");
	talloc_free(mem);
	return PASS;
}

const struct check kv_checks[] = {
	{ "kv.binary-keys", "§1.6: keys are opaque bytes (NUL, non-UTF-8, 1 B to 1 KiB)",
	  check_binary_keys },
	{ "kv.values", "§1.3/§1.6: empty values are values; large values round-trip",
	  check_values },
	{ "kv.storev", "§1.3: storev stores its buffers joined", check_storev },
	{ "kv.store-flags", "§1.3/§1.12: TDB_INSERT, TDB_MODIFY and TDB_REPLACE statuses",
	  check_store_flags },
	{ "kv.missing", "§1.4/§1.6: a missing key gives NOT_FOUND; fetch_locked an empty record",
	  check_missing },
	{ NULL },
};
