/*
 * dbwrap_py logging: Samba's debug system when present, stderr otherwise.
 */

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>

#include "log.h"
#include "samba_abi.h"

#define DBWRAP_PY_LOG_MAX 1024

void dbwrap_py_log_level(int level, const char *dbname, const char *op,
			 const char *fmt, ...)
{
	char msg[DBWRAP_PY_LOG_MAX];
	samba_dbghdrclass_fn hdr;
	samba_dbgtext_fn text;
	samba_debuglevel_get_class_fn get_level;
	va_list ap;

	/* Looked up per call: logging is rare, and this keeps no global state. */
	hdr = (samba_dbghdrclass_fn)dlsym(RTLD_DEFAULT, "dbghdrclass");
	text = (samba_dbgtext_fn)dlsym(RTLD_DEFAULT, "dbgtext");
	get_level = (samba_debuglevel_get_class_fn)dlsym(RTLD_DEFAULT,
							 "debuglevel_get_class");
	if (hdr != NULL && text != NULL && get_level != NULL) {
		/* class 0 is DBGC_ALL, the "log level" of smb.conf */
		if (get_level(0) < level) {
			return;
		}
	} else if (level > DBWRAP_PY_LOG_ERROR) {
		return;
	}

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);

	if (hdr != NULL && text != NULL && get_level != NULL) {
		hdr(level, 0, "dbwrap_py", op);
		text("dbwrap_py: db=%s op=%s: %s\n", dbname, op, msg);
		return;
	}
	fprintf(stderr, "dbwrap_py: db=%s op=%s: %s\n", dbname, op, msg);
}
