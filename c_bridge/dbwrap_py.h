/*
 * dbwrap_py: a Samba dbwrap backend whose operations run in a Python adapter.
 */

#ifndef DBWRAP_PY_H
#define DBWRAP_PY_H

#include "samba_abi.h"

/*
 * Open database `name` on `adapter` (a short name such as "tdb", or a dotted
 * Python module). The arguments before `adapter` are db_open()'s, passed on
 * to the adapter. `options` is a NULL-terminated list of "key=value"
 * adapter options, or NULL.
 *
 * Returns a db_context that is a talloc child of mem_ctx, or NULL with errno
 * set and one log line saying why (unknown adapter, import error, bad
 * option, backend unreachable).
 */
struct db_context *db_open_py(TALLOC_CTX *mem_ctx, const char *name,
			      int hash_size, int tdb_flags, int open_flags,
			      mode_t mode, enum dbwrap_lock_order lock_order,
			      uint64_t dbwrap_flags, const char *adapter,
			      const char *const *options);

/*
 * Where the interpreter finds Python code, before it starts: `venv` replaces
 * the .venv found next to this library, `module_path` (colon-separated)
 * adds folders to import adapters from. NULL leaves a setting alone; once
 * Python runs in the process, later calls change nothing.
 */
void dbwrap_py_configure(const char *venv, const char *module_path);

#endif /* DBWRAP_PY_H */
