/* errno for a db_open_py() that failed, from the transport's NTSTATUS. */

#ifndef DBWRAP_PY_ERRNO_MAP_H
#define DBWRAP_PY_ERRNO_MAP_H

#include "samba_abi.h"

int dbwrap_py_errno_from_ntstatus(NTSTATUS status);

#endif /* DBWRAP_PY_ERRNO_MAP_H */
