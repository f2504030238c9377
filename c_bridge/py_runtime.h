/*
 * The embedded interpreter: started on first use in a process, kept across
 * fork, and never holding the GIL between calls.
 */

#ifndef DBWRAP_PY_PY_RUNTIME_H
#define DBWRAP_PY_PY_RUNTIME_H

#include <Python.h>

#include "samba_abi.h"

/*
 * Start Python if this process has not yet (idempotent). The venv is
 * smb.conf's dbwrap_py:venv, else (not in an installed build) $DBWRAP_PY_VENV
 * or the project's .venv found next to this library, else none: the system
 * python3, which finds an installed package in its own dist-packages.
 * Returns false after logging why for `dbname`.
 */
bool py_runtime_start(const char *dbname);

/* dbwrap_py.database.open_database, a borrowed reference (GIL held). */
PyObject *py_runtime_open_database(void);

/*
 * Turn the pending Python exception into an NTSTATUS and one log line
 * naming the database and the operation. Clears the exception. GIL held.
 */
NTSTATUS py_runtime_status_from_exception(const char *dbname, const char *op);

#endif /* DBWRAP_PY_PY_RUNTIME_H */
