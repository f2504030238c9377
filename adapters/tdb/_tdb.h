/*
 * dbwrap_py.adapters.tdb._tdb: the tdb adapter's one way into libtdb.
 *
 * TdbFile is one open tdb in this process (_tdb_file.c): open, reopen
 * after fork, close, and the database-wide operations. TdbRecords is the
 * C base class of the adapter (_tdb_record_methods.c): the record
 * operations as its methods, on the TdbFile it is given, and the same
 * operations for the bridge as native records (_tdb_native.c).
 *
 * Errors: the adapter hands each TdbFile a dict from tdb error code (and
 * -1, for "closed") to a dbwrap_py exception class, and a class for any
 * other code. Python calls raise those classes; native calls return their
 * `ntstatus`, so both paths answer alike (_tdb.c).
 */

#ifndef DBWRAP_PY_ADAPTERS_TDB_H
#define DBWRAP_PY_ADAPTERS_TDB_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <tdb.h>

/* tdb's error codes are small; any other code takes the fallback */
#define TDB_ERROR_CODES 32
/* the code for "the database is closed" in the adapter's error dict */
#define TDB_ERROR_CLOSED (-1)
/* what the bridge makes of a MemoryError (tdb's TDB_ERR_OOM) */
#define NTSTATUS_NO_MEMORY 0xC0000017u

/* The adapter's error classes, and the same as NTSTATUS codes. */
struct tdb_error_map {
	PyObject *errors;   /* dict: tdb error code -> exception class */
	PyObject *fallback; /* exception class for any other code */
	uint32_t status_by_error[TDB_ERROR_CODES];
	uint32_t closed_status; /* errors[-1]'s */
	uint32_t fallback_status;
};

typedef struct TdbRecords TdbRecords;

typedef struct {
	PyObject_HEAD
	struct tdb_context *tdb; /* NULL once closed */
	TdbRecords *users;       /* whose context to keep current (not counted) */
	pid_t pid;               /* the process tdb was opened (or reopened) in */
	char *name;              /* talloc'd; for a fresh open after fork */
	int hash_size, tdb_flags, open_flags;
	mode_t mode;
	bool seqnum_enabled; /* switched on after the open: again after a fresh one */
	struct tdb_error_map map;
} TdbFile;

struct TdbRecords {
	PyObject_HEAD
	/*
	 * file->tdb, kept current by the file (tdb_file_attach): the hot path
	 * reads it with one load. NULL once the adapter or its file is closed.
	 */
	struct tdb_context *tdb;
	TdbFile *file;          /* the file the record operations use; NULL once closed */
	TdbRecords *next_user;  /* in file->users */
	PyObject *closed_class; /* what a call raises once closed (from the last file) */
	uint32_t closed_status; /* and what a native call returns */
};

extern PyTypeObject TdbFileType;
extern PyTypeObject TdbRecordsType;

/* _tdb.c: the error map */
int tdb_error_map_init(struct tdb_error_map *map, PyObject *errors,
		       PyObject *fallback);
void tdb_error_map_clear(struct tdb_error_map *map);
PyObject *tdb_error_map_class(const struct tdb_error_map *map, int code);
PyObject *tdb_raise(const struct tdb_error_map *map, struct tdb_context *tdb,
		    const char *what);
uint32_t tdb_error_status(const struct tdb_error_map *map, int code);

/* _tdb_file.c: the TdbRecords whose context follows the file's */
void tdb_file_attach(TdbFile *file, TdbRecords *user);
void tdb_file_detach(TdbFile *file, TdbRecords *user);

/* _tdb_native.c */
PyObject *tdb_records_native_capsule(TdbRecords *self, PyObject *unused);

/* The record operations' context: NULL once the adapter or its file is closed. */
static inline struct tdb_context *tdb_records_tdb(const TdbRecords *self)
{
	return self->tdb;
}

#endif /* DBWRAP_PY_ADAPTERS_TDB_H */
