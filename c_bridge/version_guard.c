/*
 * Compares the running Samba's release with the one the preload was built
 * for (see version_guard.h).
 */

#include <string.h>

#include "log.h"
#include "samba_abi.h"
#include "version_guard.h"

enum version_verdict { VERSION_UNCHECKED, VERSION_MATCHES, VERSION_DIFFERS };

/* The leading "major.minor.release" of a SAMBA_VERSION_STRING: vendors append a suffix. */
static size_t release_length(const char *version)
{
	return strspn(version, "0123456789.");
}

static bool same_release(const char *running)
{
	size_t len = release_length(running);

	return len == strlen(DBWRAP_PY_SAMBA_VERSION) &&
	       strncmp(running, DBWRAP_PY_SAMBA_VERSION, len) == 0;
}

bool dbwrap_py_samba_version_matches(void)
{
	/* once per process: db_open runs in smbd's main thread only */
	static enum version_verdict verdict = VERSION_UNCHECKED;
	const char *running;

	if (verdict != VERSION_UNCHECKED) {
		return verdict == VERSION_MATCHES;
	}
	running = samba_version_string();
	if (running != NULL && same_release(running)) {
		verdict = VERSION_MATCHES;
		return true;
	}
	verdict = VERSION_DIFFERS;
	dbwrap_py_log("-", "load",
		      "built for Samba %s, running Samba %s: the bridge is off "
		      "(databases routed to it fail to open, the others stay "
		      "Samba's own); rebuild dbwrap_py with make against this Samba",
		      DBWRAP_PY_SAMBA_VERSION, running != NULL ? running : "(unknown)");
	return false;
}
