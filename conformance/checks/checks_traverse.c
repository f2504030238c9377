/*
 * Traverse checks: counts, write protection in traverse_read, deleting every
 * record in a read-write traverse, and stopping early.
 */

#include "check.h"

#define RECORDS 100

static struct db_context *open_filled(TALLOC_CTX *mem, const struct target *t,
				      const char *dir, const char *file)
{
	struct db_context *db = check_open(mem, t, dir, file, VOLATILE_FLAGS);
	char key[16], value[16];
	int i;

	for (i = 0; db != NULL && i < RECORDS; i++) {
		snprintf(key, sizeof(key), "key-%03d", i);
		snprintf(value, sizeof(value), "value-%03d", i);
		if (!NT_STATUS_IS_OK(dbwrap_store(db, str_data(key), str_data(value), 0))) {
			snprintf(check_note, sizeof(check_note), "store of %s failed", key);
			return NULL;
		}
	}
	return db;
}

struct seen {
	int calls;
	int stop_after;        /* return non-zero at this call; 0: never */
	bool key_seen[RECORDS];
	int wrong;             /* records whose key or value is not ours */
	int duplicates;
	NTSTATUS store, delete;
};

static int record_fn(struct db_record *rec, void *private_data)
{
	struct seen *s = private_data;
	TDB_DATA key = dbwrap_record_get_key(rec);
	TDB_DATA value = dbwrap_record_get_value(rec);
	char want[16];
	int i;

	s->calls++;
	if (key.dsize == 7 && sscanf((const char *)key.dptr, "key-%03d", &i) == 1 &&
	    i >= 0 && i < RECORDS) {
		snprintf(want, sizeof(want), "value-%03d", i);
		if (value.dsize != strlen(want) || memcmp(value.dptr, want, value.dsize) != 0) {
			s->wrong++;
		}
		s->duplicates += s->key_seen[i];
		s->key_seen[i] = true;
	} else {
		s->wrong++;
	}
	return s->stop_after != 0 && s->calls >= s->stop_after;
}

static enum result check_counts(const struct target *t, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = open_filled(mem, t, dir, "count.tdb");
	struct seen ro = { 0 }, rw = { 0 };
	int count = -1;

	CHECK_OPENED(db);
	CHECK_STATUS(dbwrap_traverse_read(db, record_fn, &ro, &count), NT_STATUS_OK,
		     "traverse_read");
	CHECK(count == RECORDS && ro.calls == RECORDS,
	      "traverse_read: count %d, %d callbacks, expected %d", count, ro.calls, RECORDS);
	CHECK(ro.wrong == 0 && ro.duplicates == 0,
	      "traverse_read: %d wrong records, %d seen twice", ro.wrong, ro.duplicates);
	CHECK_STATUS(dbwrap_traverse(db, record_fn, &rw, &count), NT_STATUS_OK,
		     "traverse");
	CHECK(count == RECORDS && rw.calls == RECORDS,
	      "traverse: count %d, %d callbacks, expected %d", count, rw.calls, RECORDS);
	CHECK(rw.wrong == 0 && rw.duplicates == 0,
	      "traverse: %d wrong records, %d seen twice", rw.wrong, rw.duplicates);
	talloc_free(mem);
	return PASS;
}

static int write_fn(struct db_record *rec, void *private_data)
{
	struct seen *s = private_data;

	s->calls++;
	s->store = dbwrap_record_store(rec, str_data("overwritten"), 0);
	s->delete = dbwrap_record_delete(rec);
	return 1;
}

static enum result check_read_only(const struct target *t, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = open_filled(mem, t, dir, "readonly.tdb");
	struct seen s = { 0 }, after = { 0 };
	int count;

	CHECK_OPENED(db);
	CHECK_STATUS(dbwrap_traverse_read(db, write_fn, &s, &count), NT_STATUS_OK,
		     "traverse_read");
	CHECK(s.calls == 1, "the callback ran %d times, expected 1", s.calls);
	CHECK_STATUS(s.store, NT_STATUS_MEDIA_WRITE_PROTECTED, "store in traverse_read");
	CHECK_STATUS(s.delete, NT_STATUS_MEDIA_WRITE_PROTECTED, "delete in traverse_read");
	CHECK_STATUS(dbwrap_traverse_read(db, record_fn, &after, &count), NT_STATUS_OK,
		     "traverse_read afterwards");
	CHECK(count == RECORDS && after.wrong == 0,
	      "a refused write changed the data: %d records, %d wrong", count, after.wrong);
	talloc_free(mem);
	return PASS;
}

static int delete_fn(struct db_record *rec, void *private_data)
{
	int *deleted = private_data;

	if (NT_STATUS_IS_OK(dbwrap_record_delete(rec))) {
		*deleted += 1;
	}
	return 0;
}

static enum result check_delete_all(const struct target *t, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = open_filled(mem, t, dir, "deleteall.tdb");
	struct seen s = { 0 };
	int deleted = 0, count = -1;

	CHECK_OPENED(db);
	CHECK_STATUS(dbwrap_traverse(db, delete_fn, &deleted, &count), NT_STATUS_OK,
		     "deleting traverse");
	CHECK(count == RECORDS && deleted == RECORDS,
	      "deleting traverse: count %d, %d deleted, expected %d", count, deleted,
	      RECORDS);
	CHECK_STATUS(dbwrap_traverse_read(db, record_fn, &s, &count), NT_STATUS_OK,
		     "traverse_read afterwards");
	CHECK(count == 0, "%d records left after deleting all", count);
	talloc_free(mem);
	return PASS;
}

static enum result check_early_stop(const struct target *t, const char *dir)
{
	TALLOC_CTX *mem = talloc_new(NULL);
	struct db_context *db = open_filled(mem, t, dir, "stop.tdb");
	struct seen ro = { .stop_after = 10 }, rw = { .stop_after = 10 };
	int count = -1;

	CHECK_OPENED(db);
	CHECK_STATUS(dbwrap_traverse_read(db, record_fn, &ro, &count), NT_STATUS_OK,
		     "traverse_read stopped early");
	CHECK(ro.calls == 10 && count == 10,
	      "traverse_read went on after a non-zero return: %d callbacks, count %d",
	      ro.calls, count);
	CHECK_STATUS(dbwrap_traverse(db, record_fn, &rw, &count), NT_STATUS_OK,
		     "traverse stopped early");
	CHECK(rw.calls == 10 && count == 10,
	      "traverse went on after a non-zero return: %d callbacks, count %d",
	      rw.calls, count);
	talloc_free(mem);
	return PASS;
}

const struct check traverse_checks[] = {
	{ "traverse.counts", "§1.7: both traverses see every record once and count them",
	  check_counts },
	{ "traverse.read-only", "§1.7: writes in traverse_read give MEDIA_WRITE_PROTECTED",
	  check_read_only },
	{ "traverse.delete-all", "§1.7: a read-write traverse may delete every record",
	  check_delete_all },
	{ "traverse.early-stop", "§1.7: a non-zero return stops the walk; the count includes that record (tdb)",
	  check_early_stop },
	{ NULL },
};
