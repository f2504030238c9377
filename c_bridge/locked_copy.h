/*
 * do_locked for a table whose lock hands out the record's own memory (a tdb
 * map, which may move when the callback writes): lock, copy the value,
 * run the callback on the copy, store what it returns, unlock. Samba's
 * db_tdb_do_locked promises its callback the same stable value.
 */

#ifndef DBWRAP_PY_LOCKED_COPY_H
#define DBWRAP_PY_LOCKED_COPY_H

#include "transport.h"

/* With the table's own lock, storev and unlock; the lock goes even if the store fails. */
NTSTATUS dbwrap_py_locked_copying(const struct dbwrap_py_record_ops *ops,
				  struct dbwrap_py_db *db, const char *dbname,
				  TDB_DATA key, dbwrap_py_locked_fn fn,
				  void *private_data);

#endif /* DBWRAP_PY_LOCKED_COPY_H */
