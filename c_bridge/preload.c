/*
 * libdbwrap_py_preload.so: puts chosen databases of an unmodified smbd (or
 * smbpasswd, net, ...) on dbwrap_py, via LD_PRELOAD.
 *
 * Samba reaches every database through db_open(), exported by libsmbconf
 * (from 4.25 through db_open_ex(), which db_open calls). This library
 * defines both: a database enabled in smb.conf goes to db_open_py(), every
 * other one to the real function (dlsym RTLD_NEXT).
 *
 *   dbwrap_py:module = tdb                  adapter: short name or dotted module
 *   dbwrap_py:locking.tdb = yes             which databases go through the bridge
 *   dbwrap_py:<option> = value              adapter option, every database
 *   dbwrap_py:<db>:<option> = value         adapter option, one database
 *   dbwrap_py:venv, dbwrap_py:pythonpath    where the bridge finds Python code
 *
 * A database routed to the bridge never falls back to tdb: if db_open_py
 * fails, db_open fails, with errno set and one line in the log.
 *
 * Built for one Samba release (DBWRAP_PY_SAMBA_VERSION, from the Makefile).
 * In any other Samba it logs one line at the first db_open and the bridge is
 * off: every database not routed to it is Samba's own, untouched, and one
 * routed to it fails to open (ENOTSUP), so smbd stops with its own error
 * rather than serve from a local tdb what smb.conf put elsewhere (on a
 * cluster's shared store, a silent local locking.tdb would lose share modes).
 */

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "dbwrap_py.h"
#include "log.h"
#include "version_guard.h"

#define OPTION_PREFIX "dbwrap_py:"

/* Samba's own openers, as samba_abi.h declares them */
typedef __typeof__(db_open) *db_open_fn;
typedef __typeof__(db_open_ex) *db_open_ex_fn;

struct preload_conf {
	const char *module;
	const char *venv;
	const char *pythonpath;
	const char **options; /* NULL-terminated "key=value" */
	size_t num_options;
};

static const char *db_basename(const char *name)
{
	const char *slash = strrchr(name, '/');

	return slash != NULL ? slash + 1 : name;
}

static bool ends_with(const char *s, const char *suffix)
{
	size_t ls = strlen(s), lx = strlen(suffix);

	return ls >= lx && strcmp(s + ls - lx, suffix) == 0;
}

/* Set or replace key=value in the option list (later settings win). */
static bool conf_set_option(struct preload_conf *conf, const char *key,
			    const char *value)
{
	size_t keylen = strlen(key), i;
	char *pair = talloc_asprintf(conf, "%s=%s", key, value);

	if (pair == NULL) {
		return false;
	}
	for (i = 0; i < conf->num_options; i++) {
		if (strncmp(conf->options[i], key, keylen) == 0 &&
		    conf->options[i][keylen] == '=') {
			conf->options[i] = pair;
			return true;
		}
	}
	conf->options = talloc_realloc(conf, conf->options, const char *,
				       conf->num_options + 2);
	if (conf->options == NULL) {
		return false;
	}
	conf->options[conf->num_options++] = pair;
	conf->options[conf->num_options] = NULL;
	return true;
}

static bool conf_set(struct preload_conf *conf, const char *key,
		     const char *value)
{
	char *copy = talloc_strdup(conf, value);

	if (copy == NULL) {
		return false;
	}
	if (strcmp(key, "module") == 0) {
		conf->module = copy;
	} else if (strcmp(key, "venv") == 0) {
		conf->venv = copy;
	} else if (strcmp(key, "pythonpath") == 0) {
		conf->pythonpath = copy;
	} else {
		return conf_set_option(conf, key, value);
	}
	return true;
}

/*
 * One "dbwrap_py:<rest> = value" line. Routing switches (<db>.tdb) are not
 * options; <db>:<option> applies to that database only, in a second pass.
 */
static bool conf_take(struct preload_conf *conf, const char *base,
		      const char *rest, const char *value, bool per_db_pass)
{
	const char *colon = strchr(rest, ':');
	size_t baselen = strlen(base);

	if (colon == NULL) {
		if (per_db_pass || ends_with(rest, ".tdb")) {
			return true;
		}
		return conf_set(conf, rest, value);
	}
	if (!per_db_pass || (size_t)(colon - rest) != baselen ||
	    strncasecmp(rest, base, baselen) != 0) {
		return true;
	}
	return conf_set(conf, colon + 1, value);
}

/* Samba's own view of [global] (includes, registry config) via lp_dump(). */
static char *global_section(TALLOC_CTX *mem_ctx)
{
	char *buf = NULL, *result, *next;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	if (f == NULL) {
		return NULL;
	}
	lp_dump(f, false, 0);
	fclose(f);
	result = talloc_strdup(mem_ctx, buf != NULL ? buf : "");
	free(buf);
	if (result != NULL && (next = strstr(result, "\n[")) != NULL &&
	    (next = strstr(next + 2, "\n[")) != NULL) {
		*next = '\0'; /* keep [global] only */
	}
	return result;
}

static bool conf_parse(struct preload_conf *conf, const char *base,
		       bool per_db_pass)
{
	char *text = global_section(conf), *line, *save = NULL, *eq;

	if (text == NULL) {
		return false;
	}
	for (line = strtok_r(text, "\n", &save); line != NULL;
	     line = strtok_r(NULL, "\n", &save)) {
		line += strspn(line, " \t");
		if (strncmp(line, OPTION_PREFIX, strlen(OPTION_PREFIX)) != 0 ||
		    (eq = strstr(line, " = ")) == NULL) {
			continue;
		}
		*eq = '\0';
		if (!conf_take(conf, base, line + strlen(OPTION_PREFIX), eq + 3,
			       per_db_pass)) {
			return false;
		}
	}
	return true;
}

/*
 * The tdb_flags native db_open() would hand to tdb: robust mutexes for
 * CLEAR_IF_FIRST databases, and TDB_NOMMAP under "use mmap = no".
 */
static int native_tdb_flags(const char *base, int tdb_flags)
{
	bool try_mutex, require_mutex;

	if (!lp_use_mmap()) {
		tdb_flags |= TDB_NOMMAP;
	}
	if (!(tdb_flags & TDB_CLEAR_IF_FIRST)) {
		return tdb_flags;
	}
	try_mutex = lp_parm_bool(-1, "dbwrap_tdb_mutexes", "*", true);
	try_mutex = lp_parm_bool(-1, "dbwrap_tdb_mutexes", base, try_mutex);
	if (!lp_use_mmap()) {
		try_mutex = false; /* mutexes live in the mmap */
	}
	if (try_mutex && tdb_runtime_check_for_robust_mutexes()) {
		tdb_flags |= TDB_MUTEX_LOCKING;
	}
	require_mutex = lp_parm_bool(-1, "dbwrap_tdb_require_mutexes", "*", false);
	require_mutex = lp_parm_bool(-1, "dbwrap_tdb_require_mutexes", base,
				     require_mutex);
	return require_mutex ? (tdb_flags | TDB_MUTEX_LOCKING) : tdb_flags;
}

/*
 * The hash size native db_open() would hand to tdb: "tdb_hash_size:<db>"
 * over the caller's (from 4.22.1), then "tdb_hashsize:<db>" when it is
 * still 0 (every release checked).
 */
static int native_hash_size(const char *base, int hash_size)
{
#if DBWRAP_PY_SAMBA_DB_OPEN_TDB_HASH_SIZE
	hash_size = lp_parm_int(-1, "tdb_hash_size", base, hash_size);
#endif
	if (hash_size == 0) {
		hash_size = lp_parm_int(-1, "tdb_hashsize", base, 0);
	}
	return hash_size;
}

static struct db_context *preload_open_py(TALLOC_CTX *mem_ctx, const char *name,
					  int hash_size, int tdb_flags,
					  int open_flags, mode_t mode,
					  enum dbwrap_lock_order lock_order,
					  uint64_t dbwrap_flags)
{
	const char *base = db_basename(name);
	struct preload_conf *conf = talloc_zero(NULL, struct preload_conf);
	struct db_context *db = NULL;
	int err = ENOMEM;

	if (conf != NULL && conf_parse(conf, base, false) &&
	    conf_parse(conf, base, true)) {
		dbwrap_py_configure(conf->venv, conf->pythonpath);
		db = db_open_py(mem_ctx, name, native_hash_size(base, hash_size),
				native_tdb_flags(base, tdb_flags), open_flags,
				mode, lock_order, dbwrap_flags,
				conf->module != NULL ? conf->module : "tdb",
				conf->options);
		err = errno;
	} else {
		dbwrap_py_log(name, "open", "cannot read the dbwrap_py options");
	}
	TALLOC_FREE(conf);
	errno = err;
	return db;
}

/* The next definition of `symbol` (Samba's own), or NULL after a log line. */
static void *real_opener(const char *name, const char *symbol)
{
	/* looked up per call: opens are rare, and this keeps no global state */
	void *fn = dlsym(RTLD_NEXT, symbol);

	if (fn == NULL) {
		dbwrap_py_log(name != NULL ? name : "?", "open",
			      "the real %s was not found: %s", symbol, dlerror());
		errno = ENOSYS;
	}
	return fn;
}

static bool routed_to_bridge(const char *name)
{
	return name != NULL &&
	       lp_parm_bool(-1, "dbwrap_py", db_basename(name), false);
}

/* A database smb.conf routes to the bridge: opened there, or refused. */
static struct db_context *preload_open_routed(TALLOC_CTX *mem_ctx,
					      const char *name, int hash_size,
					      int tdb_flags, int open_flags,
					      mode_t mode,
					      enum dbwrap_lock_order lock_order,
					      uint64_t dbwrap_flags)
{
	if (!dbwrap_py_samba_version_matches()) {
		dbwrap_py_log(name, "open", "not opened: the bridge is off in "
			      "this Samba (built for %s)", DBWRAP_PY_SAMBA_VERSION);
		errno = ENOTSUP;
		return NULL;
	}
	return preload_open_py(mem_ctx, name, hash_size, tdb_flags, open_flags,
			       mode, lock_order, dbwrap_flags);
}

/*
 * Up to 4.24 every open comes here. From 4.25 Samba's db_open() calls
 * db_open_ex() below (which g_lock also calls), so a database not routed
 * here is still seen there: both apply the same routing.
 */
struct db_context *db_open(TALLOC_CTX *mem_ctx, const char *name,
			   int hash_size, int tdb_flags, int open_flags,
			   mode_t mode, enum dbwrap_lock_order lock_order,
			   uint64_t dbwrap_flags)
{
	db_open_fn real_db_open;

	dbwrap_py_samba_version_matches(); /* logs a mismatch once */
	if (routed_to_bridge(name)) {
		return preload_open_routed(mem_ctx, name, hash_size, tdb_flags,
					   open_flags, mode, lock_order,
					   dbwrap_flags);
	}
	real_db_open = (db_open_fn)real_opener(name, "db_open");
	return real_db_open == NULL ? NULL
		: real_db_open(mem_ctx, name, hash_size, tdb_flags, open_flags,
			       mode, lock_order, dbwrap_flags);
}

/*
 * Samba 4.25's db_open_ex (the event, messaging and ctdb contexts are for
 * Samba's own backends). Defined in every build, so that a preload built for
 * an older release, loaded into 4.25, still refuses what smb.conf routes to
 * the bridge instead of leaving g_lock.tdb on a local tdb.
 */
struct db_context *db_open_ex(TALLOC_CTX *mem_ctx, struct tevent_context *ev,
			      struct messaging_context *msg,
			      struct ctdbd_connection *ctdb_conn,
			      const char *name, int hash_size, int tdb_flags,
			      int open_flags, mode_t mode,
			      enum dbwrap_lock_order lock_order,
			      uint64_t dbwrap_flags)
{
	db_open_ex_fn real_db_open_ex;

	dbwrap_py_samba_version_matches();
	if (routed_to_bridge(name)) {
		return preload_open_routed(mem_ctx, name, hash_size, tdb_flags,
					   open_flags, mode, lock_order,
					   dbwrap_flags);
	}
	real_db_open_ex = (db_open_ex_fn)real_opener(name, "db_open_ex");
	return real_db_open_ex == NULL ? NULL
		: real_db_open_ex(mem_ctx, ev, msg, ctdb_conn, name, hash_size,
				  tdb_flags, open_flags, mode, lock_order,
				  dbwrap_flags);
}
