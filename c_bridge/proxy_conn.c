/*
 * The process's connections to node daemons (proxy_conn.h): connect, greet,
 * one request and its reply at a time, each bounded by a deadline.
 *
 * Sockets stay blocking so that connect() waits, up to SO_SNDTIMEO, for room
 * in a busy daemon's backlog; reads and writes use MSG_DONTWAIT after
 * poll(), so none of them can outlast the deadline.
 */

#define _GNU_SOURCE /* struct ucred */

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "proxy_conn.h"

struct proxy_conn {
	struct proxy_conn *next;
	struct sockaddr_un addr;
	int fd;            /* -1: not connected */
	pid_t pid;         /* the process the socket belongs to */
	bool greeted;      /* HELLO answered on this socket */
	uint16_t version;  /* the one HELLO agreed */
	uint64_t generation;
	uint32_t max_message;
};

static struct proxy_conn *proxy_conns;
static bool proxy_atfork_registered;

/* -- time ------------------------------------------------------------------- */

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int ms_left(int64_t deadline)
{
	int64_t left = deadline - now_ms();

	return left > 0 ? (int)left : 0;
}

/* -- connecting ------------------------------------------------------------- */

/* Only system calls: it also runs in a fork's child handler. */
static void proxy_connect(struct proxy_conn *conn, unsigned timeout_ms)
{
	struct timeval tv = {
		.tv_sec = timeout_ms / 1000,
		.tv_usec = (timeout_ms % 1000) * 1000,
	};
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd == -1) {
		return;
	}
	(void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&conn->addr, sizeof(conn->addr)) != 0) {
		int saved = errno;

		close(fd);
		errno = saved;
		return;
	}
	conn->fd = fd;
	conn->greeted = false;
	conn->generation += 1;
}

static void proxy_drop(struct proxy_conn *conn)
{
	if (conn->fd != -1) {
		close(conn->fd);
		conn->fd = -1;
	}
	conn->greeted = false;
	conn->generation += 1; /* what was held on the old socket is gone */
}

/*
 * The child of a fork: the socket is the parent's. Close our copy, and
 * connect now with the parent's credentials if the parent was connected.
 */
static void proxy_atfork_child(void)
{
	struct proxy_conn *conn;
	bool was_connected;

	for (conn = proxy_conns; conn != NULL; conn = conn->next) {
		was_connected = (conn->fd != -1);
		proxy_drop(conn);
		conn->pid = getpid();
		if (was_connected) {
			proxy_connect(conn, 1000);
		}
	}
}

struct proxy_conn *proxy_conn_get(const char *socket_path)
{
	struct proxy_conn *conn;

	for (conn = proxy_conns; conn != NULL; conn = conn->next) {
		if (strcmp(conn->addr.sun_path, socket_path) == 0) {
			return conn;
		}
	}
	if (strlen(socket_path) >= sizeof(conn->addr.sun_path)) {
		errno = ENAMETOOLONG;
		return NULL;
	}
	/* lives as long as the process: databases keep pointers to it */
	conn = talloc_zero(NULL, struct proxy_conn);
	if (conn == NULL) {
		errno = ENOMEM;
		return NULL;
	}
	conn->addr.sun_family = AF_UNIX;
	strcpy(conn->addr.sun_path, socket_path);
	conn->fd = -1;
	conn->pid = getpid();
	conn->generation = 1;
	conn->max_message = PROXY_MAX_MESSAGE;
	if (!proxy_atfork_registered) {
		pthread_atfork(NULL, NULL, proxy_atfork_child);
		proxy_atfork_registered = true;
	}
	conn->next = proxy_conns;
	proxy_conns = conn;
	return conn;
}

uint64_t proxy_conn_generation(struct proxy_conn *conn)
{
	return conn->generation;
}

uint16_t proxy_conn_version(struct proxy_conn *conn)
{
	return conn->greeted ? conn->version : 0;
}

/* -- one exchange ----------------------------------------------------------- */

/* 0, or the errno that ended it (ETIMEDOUT at the deadline, EPIPE at EOF). */
static int proxy_send_all(int fd, const uint8_t *buf, size_t len,
			  int64_t deadline)
{
	struct pollfd pfd = { .fd = fd, .events = POLLOUT };
	ssize_t n;

	while (len > 0) {
		if (poll(&pfd, 1, ms_left(deadline)) == 0) {
			return ETIMEDOUT;
		}
		n = send(fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
			continue;
		}
		if (n < 0) {
			return errno;
		}
		buf += n;
		len -= n;
	}
	return 0;
}

static int proxy_recv_all(int fd, uint8_t *buf, size_t len, int64_t deadline)
{
	struct pollfd pfd = { .fd = fd, .events = POLLIN };
	ssize_t n;

	while (len > 0) {
		if (poll(&pfd, 1, ms_left(deadline)) == 0) {
			return ETIMEDOUT;
		}
		n = recv(fd, buf, len, MSG_DONTWAIT);
		if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
			continue;
		}
		if (n <= 0) {
			return (n == 0) ? EPIPE : errno;
		}
		buf += n;
		len -= n;
	}
	return 0;
}

/* A reply's body, a talloc child of mem_ctx; 0 or an errno. */
static int proxy_recv_reply(struct proxy_conn *conn, int64_t deadline,
			    TALLOC_CTX *mem_ctx, uint8_t **body, size_t *len)
{
	uint8_t head[4];
	uint32_t n;
	int err = proxy_recv_all(conn->fd, head, 4, deadline);

	if (err != 0) {
		return err;
	}
	n = head[0] | head[1] << 8 | head[2] << 16 | (uint32_t)head[3] << 24;
	if (n < 4 || n > conn->max_message) {
		return EPROTO;
	}
	*body = talloc_array(mem_ctx, uint8_t, n);
	if (*body == NULL) {
		return ENOMEM;
	}
	*len = n;
	return proxy_recv_all(conn->fd, *body, n, deadline);
}

/* How much of an error reply's cause the log line keeps (log.c's line is 1 KiB). */
#define PROXY_CAUSE_LOGGED 512

static NTSTATUS proxy_io_failed(struct proxy_conn *conn, const char *dbname,
				enum proxy_op op, const char *step, int err)
{
	NTSTATUS status = (err == ETIMEDOUT) ? NT_STATUS_IO_TIMEOUT
		: (err == ENOMEM) ? NT_STATUS_NO_MEMORY
		: NT_STATUS_DEVICE_NOT_READY;

	dbwrap_py_log(dbname, proxy_op_name(op),
		      "proxy daemon at %s: %s: %s (NTSTATUS 0x%08x)",
		      conn->addr.sun_path, step,
		      err == EPIPE ? "connection closed by the daemon"
				   : strerror(err),
		      (unsigned)NT_STATUS_V(status));
	proxy_drop(conn);
	return status;
}

static bool proxy_routine(enum proxy_op op, NTSTATUS status)
{
	/* NODE_CACHE at every open: most databases have no write-back cache */
	if (op == PROXY_NODE_CACHE) {
		return NT_STATUS_EQUAL(status, NT_STATUS_NOT_SUPPORTED);
	}
	return NT_STATUS_EQUAL(status, NT_STATUS_NOT_FOUND) ||
	       NT_STATUS_EQUAL(status, NT_STATUS_OBJECT_NAME_COLLISION) ||
	       NT_STATUS_EQUAL(status, NT_STATUS_FILE_LOCK_CONFLICT) ||
	       NT_STATUS_EQUAL(status, NT_STATUS_MEDIA_WRITE_PROTECTED);
}

/*
 * The daemon's cause as one printable line in buf: at most size - 1 bytes
 * of it (a cause may be any length up to a whole message, and a precision
 * of (int)dsize turns negative past 2 GiB), control bytes as '?' (a
 * newline would forge a second log line).
 */
static const char *proxy_cause_text(TDB_DATA cause, char *buf, size_t size)
{
	size_t n = (cause.dptr != NULL && cause.dsize < size) ? cause.dsize
		: (cause.dptr != NULL) ? size - 1 : 0;
	size_t i;

	for (i = 0; i < n; i++) {
		uint8_t c = cause.dptr[i];

		buf[i] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
	}
	buf[n] = '\0';
	return buf;
}

/* An error reply: its cause goes to the log, its status to the caller. */
static NTSTATUS proxy_error_reply(const char *dbname, enum proxy_op op,
				  NTSTATUS status, struct proxy_reader *r)
{
	char text[PROXY_CAUSE_LOGGED + 1];
	TDB_DATA cause = proxy_get_bytes(r);

	dbwrap_py_log_level(proxy_routine(op, status) ? DBWRAP_PY_LOG_ROUTINE
						  : DBWRAP_PY_LOG_ERROR,
			    dbname, proxy_op_name(op), "%s%s (NTSTATUS 0x%08x)",
			    proxy_cause_text(cause, text, sizeof(text)),
			    cause.dsize > PROXY_CAUSE_LOGGED ? "..." : "",
			    (unsigned)NT_STATUS_V(status));
	return status;
}

static NTSTATUS proxy_exchange(struct proxy_conn *conn, const char *dbname,
			       enum proxy_op op, struct proxy_writer *w,
			       int64_t deadline, TALLOC_CTX *mem_ctx,
			       struct proxy_reader *fields)
{
	uint8_t *body = NULL;
	size_t len = 0;
	NTSTATUS status;
	int err;

	if (!proxy_writer_finish(w)) {
		dbwrap_py_log(dbname, proxy_op_name(op),
			      "request over %u bytes, or no memory",
			      PROXY_MAX_MESSAGE);
		return NT_STATUS_INVALID_PARAMETER;
	}
	err = proxy_send_all(conn->fd, w->buf, w->len, deadline);
	if (err != 0) {
		return proxy_io_failed(conn, dbname, op, "send", err);
	}
	err = proxy_recv_reply(conn, deadline, mem_ctx, &body, &len);
	if (err != 0) {
		return proxy_io_failed(conn, dbname, op, "reply", err);
	}
	proxy_reader_init(fields, body, len);
	status = NT_STATUS(proxy_get_u32(fields));
	return NT_STATUS_IS_OK(status)
		? status : proxy_error_reply(dbname, op, status, fields);
}

/*
 * A HELLO's max_message must be within PROXY_MAX_MESSAGE (proxy_wire.h
 * says why). DBWRAP_PY_BROKEN_MAX_MESSAGE is the broken example of the
 * client fuzzer (build/proxy_client_broken, tests/proxy_client/): it
 * takes any value, and the fuzzer must fail. libdbwrap_py.so is never
 * built with it.
 */
static bool proxy_max_message_allowed(uint32_t max_message)
{
#ifdef DBWRAP_PY_BROKEN_MAX_MESSAGE
	return true;
#else
	return max_message <= PROXY_MAX_MESSAGE;
#endif
}

static NTSTATUS proxy_max_message_refused(struct proxy_conn *conn,
					  const char *dbname,
					  uint32_t max_message)
{
	NTSTATUS status = NT_STATUS_INVALID_NETWORK_RESPONSE;

	dbwrap_py_log(dbname, proxy_op_name(PROXY_HELLO),
		      "proxy daemon at %s: HELLO advertises messages of up to "
		      "%u bytes, over this client's limit of %u: refused "
		      "(NTSTATUS 0x%08x)", conn->addr.sun_path,
		      (unsigned)max_message, PROXY_MAX_MESSAGE,
		      (unsigned)NT_STATUS_V(status));
	proxy_drop(conn);
	return status;
}

/* HELLO on a new socket: the version, and the largest message the daemon takes. */
static NTSTATUS proxy_greet(struct proxy_conn *conn, const char *dbname,
			    int64_t deadline)
{
	TALLOC_CTX *tmp = talloc_new(NULL);
	struct proxy_writer w;
	struct proxy_reader r;
	NTSTATUS status;
	uint16_t version;
	uint32_t max_message;

	proxy_writer_request(&w, tmp, PROXY_HELLO, 0);
	proxy_put_u32(&w, PROXY_MAGIC);
	proxy_put_u16(&w, PROXY_MIN_VERSION);
	proxy_put_u16(&w, PROXY_VERSION);
	proxy_put_u32(&w, (uint32_t)getpid());
	status = proxy_exchange(conn, dbname, PROXY_HELLO, &w, deadline, tmp, &r);
	if (NT_STATUS_IS_OK(status)) {
		version = proxy_get_u16(&r);
		max_message = proxy_get_u32(&r);
		if (!proxy_reader_done(&r) || version < PROXY_MIN_VERSION ||
		    version > PROXY_VERSION || max_message < 64) {
			status = proxy_io_failed(conn, dbname, PROXY_HELLO,
						 "hello", EPROTO);
		} else if (!proxy_max_message_allowed(max_message)) {
			status = proxy_max_message_refused(conn, dbname, max_message);
		} else {
			conn->max_message = max_message;
			conn->version = version;
			conn->greeted = true;
		}
	}
	talloc_free(tmp);
	return status;
}

/*
 * Who listens on a new socket, before a byte goes to it: root (the node
 * daemon runs as root, docs/proxy-mode.md), or this process's own
 * effective user. smbd runs as root, so there it is root only; the other
 * case is a daemon and its clients run by one user (the test drivers, a
 * throwaway daemon), where the peer could ptrace this process anyway.
 * Anyone else at the path (a daemon gone and its path taken, a directory
 * others may write to) would be handed every record this process reads
 * and writes. SO_PEERCRED gives the credentials the listener had when it
 * called listen().
 */
static NTSTATUS proxy_check_peer(struct proxy_conn *conn, const char *dbname,
				 enum proxy_op op)
{
	NTSTATUS status = NT_STATUS_ACCESS_DENIED;
	struct ucred peer;
	socklen_t len = sizeof(peer);
	uid_t self = geteuid();

	if (getsockopt(conn->fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0) {
		return proxy_io_failed(conn, dbname, op, "peer credentials", errno);
	}
	if (peer.uid == 0 || peer.uid == self) {
		return NT_STATUS_OK;
	}
	dbwrap_py_log(dbname, proxy_op_name(op),
		      "proxy daemon at %s: the peer (pid %d, uid %u) is neither "
		      "root nor this process's user (uid %u): refused, nothing "
		      "sent (NTSTATUS 0x%08x)", conn->addr.sun_path, (int)peer.pid,
		      (unsigned)peer.uid, (unsigned)self,
		      (unsigned)NT_STATUS_V(status));
	proxy_drop(conn);
	return status;
}

static NTSTATUS proxy_ready(struct proxy_conn *conn, const char *dbname,
			    enum proxy_op op, int64_t deadline)
{
	NTSTATUS status;

	if (conn->pid != getpid()) { /* forked without our handler: the parent's */
		proxy_drop(conn);
		conn->pid = getpid();
	}
	if (conn->fd == -1) {
		proxy_connect(conn, (unsigned)ms_left(deadline));
		if (conn->fd == -1) {
			return proxy_io_failed(conn, dbname, op, "connect", errno);
		}
	}
	if (conn->greeted) {
		return NT_STATUS_OK;
	}
	status = proxy_check_peer(conn, dbname, op);
	return NT_STATUS_IS_OK(status) ? proxy_greet(conn, dbname, deadline) : status;
}

NTSTATUS proxy_conn_call(struct proxy_conn *conn, const char *dbname,
			 enum proxy_op op, struct proxy_writer *w,
			 unsigned timeout_ms, TALLOC_CTX *mem_ctx,
			 struct proxy_reader *fields)
{
	int64_t deadline = now_ms() + timeout_ms;
	NTSTATUS status = proxy_ready(conn, dbname, op, deadline);

	if (!NT_STATUS_IS_OK(status)) {
		return status;
	}
	return proxy_exchange(conn, dbname, op, w, deadline, mem_ctx, fields);
}
