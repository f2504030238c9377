/*
 * The preload serves only the Samba release it was built for: the private
 * libraries' symbol versions, and whatever samba_abi.h chose, are tied to it.
 */

#ifndef DBWRAP_PY_VERSION_GUARD_H
#define DBWRAP_PY_VERSION_GUARD_H

#include <stdbool.h>

/*
 * True when the running Samba's release ("4.17.12" of "4.17.12-Debian") is
 * DBWRAP_PY_SAMBA_VERSION. Decided once per process (forked children inherit
 * it); a mismatch logs one line, naming both releases.
 */
bool dbwrap_py_samba_version_matches(void);

#endif /* DBWRAP_PY_VERSION_GUARD_H */
