/*
 * The bridge's struct db_context (db_ops.c), for the layers built on it
 * inside the bridge (per_rec_persistent.c).
 */

#ifndef DBWRAP_PY_DB_OPS_H
#define DBWRAP_PY_DB_OPS_H

#include "transport.h"

/*
 * db_open_py() with every argument, the bridge's own included
 * (writes_through); never per-record persistent itself.
 */
struct db_context *dbwrap_py_open(TALLOC_CTX *mem_ctx,
				  const struct dbwrap_py_open_args *args);

/*
 * A record of a dbwrap_py_open() database, locked by the caller: its value,
 * or its absence, is in the backend when this returns (transport.h,
 * write_through). A store that waits for the unlock goes first.
 */
NTSTATUS dbwrap_py_record_write_through(struct db_record *rec);

#endif /* DBWRAP_PY_DB_OPS_H */
