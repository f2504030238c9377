/*
 * Loads the in-process transport (inproc_loader.h) and keeps what
 * dbwrap_py_configure() said until the interpreter starts.
 */

#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "dbwrap_py.h"
#include "inproc_loader.h"
#include "log.h"

#define INPROC_LIBRARY "libdbwrap_py_inproc.so"

static struct {
	const struct dbwrap_py_transport *transport;
	char venv[PATH_MAX];
	char module_path[PATH_MAX];
} loader;

void dbwrap_py_configure(const char *venv, const char *module_path)
{
	if (loader.transport != NULL) {
		return; /* Python may run already: too late to move it */
	}
	if (venv != NULL) {
		snprintf(loader.venv, sizeof(loader.venv), "%s", venv);
	}
	if (module_path != NULL) {
		snprintf(loader.module_path, sizeof(loader.module_path), "%s",
			 module_path);
	}
}

const char *dbwrap_py_configured_venv(void)
{
	return loader.venv;
}

const char *dbwrap_py_configured_module_path(void)
{
	return loader.module_path;
}

/* The in-process library's path: beside this one. */
static bool inproc_library_path(char *buf, size_t len)
{
	char path[PATH_MAX];
	Dl_info info;

	if (dladdr((void *)inproc_library_path, &info) == 0 ||
	    info.dli_fname == NULL || realpath(info.dli_fname, path) == NULL) {
		return false;
	}
	return snprintf(buf, len, "%s/%s", dirname(path), INPROC_LIBRARY) < (int)len;
}

const struct dbwrap_py_transport *dbwrap_py_inproc_transport(const char *dbname)
{
	char path[PATH_MAX];
	void *lib;

	if (loader.transport != NULL) {
		return loader.transport;
	}
	if (!inproc_library_path(path, sizeof(path))) {
		dbwrap_py_log(dbname, "open", "cannot tell where %s is",
			      INPROC_LIBRARY);
		return NULL;
	}
	/* global: Python's extension modules take libpython's symbols from it */
	lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
	if (lib == NULL) {
		dbwrap_py_log(dbname, "open", "%s", dlerror());
		return NULL;
	}
	loader.transport = dlsym(lib, "dbwrap_py_transport_inproc");
	if (loader.transport == NULL) {
		dbwrap_py_log(dbname, "open", "%s: %s", path, dlerror());
	}
	return loader.transport; /* the library stays loaded for good */
}
