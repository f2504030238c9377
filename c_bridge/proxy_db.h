/*
 * The proxy transport's open database, shared by transport_proxy.c (the
 * calls to the node daemon) and proxy_fastpath.c (a node cache's records
 * in this process).
 */

#ifndef DBWRAP_PY_PROXY_DB_H
#define DBWRAP_PY_PROXY_DB_H

#include "proxy_conn.h"
#include "transport.h"

struct nodecache_hold;

struct dbwrap_py_db {
	const char *name;
	struct proxy_conn *conn;
	uint64_t generation; /* the connection's, when `handle` was given */
	uint32_t handle;
	unsigned timeout_ms;
	struct dbwrap_py_open_args args; /* kept, to open again */
	bool want_fastpath;              /* proxy_fastpath (default yes) */
	struct nodecache_hold *fast;     /* the node cache's files, if the daemon named them */
	const TDB_DATA *daemon_locked;   /* the record a write traverse holds in the daemon, during fn */
};

/* Writes an op's fields after the request header. */
typedef void (*proxy_put_fn)(struct proxy_writer *w, const void *arg);

/*
 * One request on db, its reply in *r (living in mem_ctx). The database is
 * opened again first if the connection is new (the daemon restarted, or
 * this process forked).
 */
NTSTATUS proxy_call(struct dbwrap_py_db *db, TALLOC_CTX *mem_ctx,
		    enum proxy_op op, proxy_put_fn put, const void *arg,
		    unsigned timeout_ms, struct proxy_reader *r);
/* The reply's fields were all read, and nothing follows them. */
NTSTATUS proxy_reply_read(struct dbwrap_py_db *db, enum proxy_op op,
			  struct proxy_reader *r);
/* A reply whose fields are not what the op promises: logged. */
NTSTATUS proxy_malformed(struct dbwrap_py_db *db, enum proxy_op op);
/* An op whose reply has no fields. */
NTSTATUS proxy_simple(struct dbwrap_py_db *db, enum proxy_op op,
		      proxy_put_fn put, const void *arg);
/* put for an op whose one field is a key (arg: a TDB_DATA). */
void proxy_put_key(struct proxy_writer *w, const void *arg);

/* Every record operation through the daemon. */
extern const struct dbwrap_py_record_ops proxy_records;
/* The node cache's owned records here, the rest through the daemon. */
extern const struct dbwrap_py_record_ops proxy_fast_records;

/*
 * After each OPEN on a connection: ask the daemon for db's node cache and
 * open its files (kept when they are the same). Without them db->fast is
 * NULL and proxy_fast_records goes to the daemon.
 */
void proxy_fastpath_attach(struct dbwrap_py_db *db);

#endif /* DBWRAP_PY_PROXY_DB_H */
