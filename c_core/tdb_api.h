/*
 * What other C extensions may ask of dbwrap_py.adapters.tdb._tdb
 * (adapters/tdb/_tdb.c), through its `api` capsule: the node cache's fast
 * path (python/dbwrap_py/nodecache/_fastpath.c) works on local tdb files
 * the tdb adapter opened, shared with its Python side.
 */

#ifndef DBWRAP_PY_TDB_API_H
#define DBWRAP_PY_TDB_API_H

#include <Python.h>
#include <tdb.h>

#define DBWRAP_PY_TDB_API "dbwrap_py.adapters.tdb._tdb.api"
#define DBWRAP_PY_TDB_API_VERSION 1

struct dbwrap_py_tdb_api {
	unsigned version;
	/*
	 * Where a TdbRecords (a tdb adapter) keeps its tdb context: read it
	 * at each use, since its file updates it (a reopen after fork, a close
	 * leaves NULL). NULL with TypeError for any other object. The slot
	 * lives as long as the object.
	 */
	struct tdb_context *const *(*context_slot)(PyObject *records);
};

#endif /* DBWRAP_PY_TDB_API_H */
