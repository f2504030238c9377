/*
 * The in-process transport lives in its own library, libdbwrap_py_inproc.so,
 * the only part of the bridge linked with libpython. It is loaded on the
 * first database opened in process, so a process whose databases all go
 * through the proxy never maps libpython.
 */

#ifndef DBWRAP_PY_INPROC_LOADER_H
#define DBWRAP_PY_INPROC_LOADER_H

#include "transport.h"

/*
 * The in-process transport, loaded on first use from the folder of this
 * library; NULL after a log line for `dbname` when it cannot be loaded.
 */
const struct dbwrap_py_transport *dbwrap_py_inproc_transport(const char *dbname);

/* What dbwrap_py_configure() was given ("" when nothing), for py_runtime.c. */
const char *dbwrap_py_configured_venv(void);
const char *dbwrap_py_configured_module_path(void);

#endif /* DBWRAP_PY_INPROC_LOADER_H */
