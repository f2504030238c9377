/*
 * A process's connection to the node daemon (proxy mode), one per daemon
 * socket, shared by every database the process opened on it.
 *
 * The daemon ties record locks, transactions and traverses to the
 * connection, and lets go of them when it closes: the kernel closes it when
 * the process dies, SIGKILL included. So a connection belongs to exactly one
 * process. A forked child closes its copy at once and connects anew, in the
 * fork handler, while it still runs with the parent's credentials: smbd's
 * children later switch to the connected user, who may not reach the
 * socket. Each new connection has a new generation; a database opened on an
 * older one opens again before its next request.
 *
 * Every call is bounded: a daemon that is gone, dies, or does not answer in
 * time gives an NTSTATUS and one log line, and the connection is dropped (a
 * late reply can never be taken for the next one's). The next call connects
 * again.
 *
 * The connections are the proxy transport's only global state, as the
 * interpreter handle is the in-process transport's.
 */

#ifndef DBWRAP_PY_PROXY_CONN_H
#define DBWRAP_PY_PROXY_CONN_H

#include "proxy_wire.h"

struct proxy_conn;

/* The process's connection to the daemon at `socket_path` (made on first use). */
struct proxy_conn *proxy_conn_get(const char *socket_path);

/* Changes whenever the connection is made anew; never 0. */
uint64_t proxy_conn_generation(struct proxy_conn *conn);

/* The protocol version agreed on the current socket; 0 before HELLO. */
uint16_t proxy_conn_version(struct proxy_conn *conn);

/*
 * Send the finished request `w` and wait up to timeout_ms for the reply.
 * On success the reply's fields (after the status) are in *fields, pointing
 * into a body that is a talloc child of mem_ctx. An error reply's cause is
 * logged for `dbname` and its status returned.
 */
NTSTATUS proxy_conn_call(struct proxy_conn *conn, const char *dbname,
			 enum proxy_op op, struct proxy_writer *w,
			 unsigned timeout_ms, TALLOC_CTX *mem_ctx,
			 struct proxy_reader *fields);

#endif /* DBWRAP_PY_PROXY_CONN_H */
