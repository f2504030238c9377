"""The proxy daemon: one per node, holding the adapters for smbd's processes.

    dbwrap-py proxy-daemon --socket PATH [--config FILE [--group NAME]] [--metrics-port [ADDR:]PORT]

One thread does it all: the socket I/O with ``selectors`` (accept, read
frames, write replies) and, between two selects, the requests and their
adapter calls (loop_tasks.py says why one thread). Record-lock and
transaction waits are parked, not blocking, so that thread serves any
number of waiters, and the thousands of connections a busy node has cost
one selector entry each. A reply is sent at once when the socket takes it
whole (nearly always: replies are small); the rest waits in the
connection's outbox for the socket to be writable. Other threads (a
signal, an adapter's callback) reach the loop through a queue and a
socketpair that wakes it.

A connection's end (EOF, reset, malformed input) lets go of all it held at
once: the kernel closes a killed smbd's socket, so its record locks pass to
the next waiter within milliseconds.
"""

from __future__ import annotations

import argparse
import contextlib
import grp
import os
import queue
import selectors
import signal
import socket
import stat
import struct
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from dbwrap_py.proxy import wire
from dbwrap_py.proxy.log import log, log_request_counts
from dbwrap_py.errors import DbwrapError
from dbwrap_py.metrics import MetricsServer, metrics_url, parse_listen
from dbwrap_py.proxy.loop_tasks import LoopTasks
from dbwrap_py.proxy.policy import DaemonConfig
from dbwrap_py.proxy.process import ProxyDaemonProcess
from dbwrap_py.proxy.session import Session
from dbwrap_py.proxy.shared import DatabaseTable

__all__ = ["ProxyDaemon", "ProxyDaemonProcess", "main"]

_UCRED = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid
_READ_SIZE = 256 * 1024


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    session: Session
    inbox: bytearray = field(default_factory=bytearray)
    outbox: bytearray = field(default_factory=bytearray)
    in_flight: bool = False  # a request is being answered: the peer must wait
    closing: bool = False    # close once the outbox is written
    closed: bool = False
    events: int = selectors.EVENT_READ  # what the selector watches for


def _file_kind(mode: int) -> str:
    """'a regular file', 'a symlink', ...: what sits at a path, for an error."""
    kinds = [(stat.S_ISLNK, "a symlink"), (stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"),
             (stat.S_ISFIFO, "a fifo"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")]
    return next((name for test, name in kinds if test(mode)), f"of mode {mode:o}")


def _unlink_if_same(path: str, expected: os.stat_result) -> None:
    """Unlink path if it is still the file ``expected`` was (device and inode)."""
    try:
        now = os.lstat(path)
    except FileNotFoundError:
        return
    if (now.st_dev, now.st_ino, stat.S_IFMT(now.st_mode)) != \
            (expected.st_dev, expected.st_ino, stat.S_IFMT(expected.st_mode)):
        raise OSError(f"{path} changed while the daemon looked at it: left in place")
    os.unlink(path)


def _groups_of(pid: int) -> set[int]:
    """The peer's supplementary groups (/proc: SO_PEERCRED has only its gid)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("Groups:"):
                    return {int(g) for g in line.split()[1:]}
    except OSError:
        pass
    return set()


class ProxyDaemon:
    """The server: ``bind()``, then ``serve()`` until ``stop()``."""

    def __init__(self, socket_path: str, group: str | None = None,
                 config: DaemonConfig | None = None) -> None:
        if group is not None and config is None:
            raise ValueError(f"--group {group} lets that group's members open databases through the "
                             "daemon as root: give --config FILE, naming the directories and adapters "
                             "they may use (docs/proxy-mode.md, \"Who may open what\")")
        self.socket_path = socket_path
        self.gid = grp.getgrnam(group).gr_gid if group is not None else None
        self.config = config
        self._selector = selectors.DefaultSelector()
        self._replies: queue.SimpleQueue[tuple[_Connection, bytes | None, bool]] = queue.SimpleQueue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._tasks = LoopTasks(self._wake)
        self.table = DatabaseTable(self._tasks, on_deadline=self._wake)
        self._listener: socket.socket | None = None
        self._bound: os.stat_result | None = None  # the socket file bind() made
        self._connections: set[_Connection] = set()
        self._stopping = False
        #: requests taken in, by op byte: a test sees which ops reached the daemon
        self.requests: dict[int, int] = {}
        self._metrics: MetricsServer | None = None

    def connected(self) -> int:
        """Connections (smbd processes) now."""
        return len(self._connections)

    def serve_metrics(self, addr: str, port: int) -> tuple[str, int]:
        """Prometheus metrics at http://ADDR:PORT/metrics until the daemon
        stops (metrics.py); where it listens."""
        from dbwrap_py.metrics import daemon_registry, serve

        self._metrics = serve(daemon_registry(self), addr, port)
        return self._metrics.address

    # -- the socket -------------------------------------------------------------

    def bind(self) -> None:
        """Listen on the socket path, 0600 (0660 with a group)."""
        self._remove_stale_socket()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # no moment where others could connect
        try:
            listener.bind(self.socket_path)
        finally:
            os.umask(old_umask)
        self._bound = os.lstat(self.socket_path)  # what _shut_down may remove
        if self.gid is not None:
            os.chown(self.socket_path, -1, self.gid)
            os.chmod(self.socket_path, 0o660)
        listener.listen(1024)
        listener.setblocking(False)
        self._listener = listener
        self._selector.register(listener, selectors.EVENT_READ, "accept")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")

    def _remove_stale_socket(self) -> None:
        """A dead daemon's socket goes; anything else at the path stays.

        Only a socket itself (lstat: a symlink is not followed) that nobody
        answers on is removed. A regular file, a directory or a symlink
        there is refused and left in place: it is not ours to delete, and
        as root, unlinking whatever a path names is how a planted symlink
        or a mistyped --socket destroys a file. The path is looked at again
        just before the unlink and must still be the same socket; someone
        who can swap it in between can write its directory, and could have
        replaced the socket itself anyway.
        """
        try:
            found = os.lstat(self.socket_path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(found.st_mode):
            raise OSError(f"{self.socket_path} exists and is {_file_kind(found.st_mode)}, not a "
                          f"socket: refusing to remove it; left in place (remove it, or choose "
                          f"another --socket)")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(self.socket_path)
        except OSError:
            _unlink_if_same(self.socket_path, found)  # a dead daemon's socket
            return
        finally:
            probe.close()
        raise OSError(f"another daemon answers on {self.socket_path}")

    def _allowed_peer(self, sock: socket.socket) -> int | None:
        """The peer's pid if it may talk to us (root, our user, the group)."""
        pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
        if uid in (0, os.getuid()):
            return pid
        if self.gid is not None and (gid == self.gid or self.gid in _groups_of(pid)):
            return pid
        log(f"refused pid {pid} (uid {uid}, gid {gid}): not root, not us, not in the group")
        return None

    # -- the loop ---------------------------------------------------------------

    def serve(self) -> None:
        self._tasks.bind_to_this_thread()
        while not self._stopping:
            self._tasks.run_pending()
            now = time.monotonic()
            due = [t for t in (self.table.expire(now), self.table.renew(now)) if t is not None]
            if self._tasks.pending():
                due.append(now)
            timeout = max(0.0, min(due) - time.monotonic()) if due else None
            for selected, events in self._selector.select(timeout):
                if selected.data == "accept":
                    self._accept()
                elif selected.data == "wake":
                    self._take_replies()
                else:
                    self._service(selected.data, events)
        self._shut_down()

    def _service(self, connection: _Connection, events: int) -> None:
        if connection.closed:  # dropped earlier in this turn
            return
        try:
            if events & selectors.EVENT_WRITE:
                self._flush(connection)
            if events & selectors.EVENT_READ and not connection.closed:
                self._read(connection)
        except Exception as exc:  # a bug of ours ends this connection, never the daemon
            self._drop(connection, f"internal error: {type(exc).__name__}: {exc}")

    def stop(self) -> None:
        """Safe from a signal handler: the loop ends at its next turn."""
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"s")

    def _accept(self) -> None:
        assert self._listener is not None
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # EMFILE and friends: log, keep serving
            log(f"accept: {exc}")
            time.sleep(0.05)  # the listener stays readable: do not spin on it
            return
        pid = self._allowed_peer(sock)
        if pid is None:
            sock.close()
            return
        sock.setblocking(False)
        connection = _Connection(sock, None)  # type: ignore[arg-type]
        connection.session = Session(self.table, self._tasks.post,
                                     lambda message, hang_up: self._reply(connection, message, hang_up),
                                     self.config)
        connection.session.peer_pid = pid
        self._connections.add(connection)
        self._selector.register(sock, selectors.EVENT_READ, connection)

    def _reply(self, connection: _Connection, message: bytes | None, hang_up: bool) -> None:
        """A request's answer (or a hang-up): on the loop's thread, out at
        once; from another thread, through the queue."""
        if not self._tasks.on_loop_thread():
            self._replies.put((connection, message, hang_up))
            self._wake()
            return
        if connection.closed:
            return
        connection.in_flight = False
        if message is not None:
            connection.outbox += message
        connection.closing = connection.closing or hang_up
        self._flush(connection)
        if not connection.closed:
            self._next_request(connection)

    def _wake(self) -> None:
        """The loop looks at replies, tasks and deadlines again (from any thread)."""
        with contextlib.suppress(BlockingIOError, OSError):
            self._wake_w.send(b"w")

    def _take_replies(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while self._wake_r.recv(4096):
                pass
        while True:
            try:
                self._reply(*self._replies.get_nowait())
            except queue.Empty:
                return

    def _read(self, connection: _Connection) -> None:
        try:
            data = connection.sock.recv(_READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(connection, None)
            return
        if connection.in_flight or connection.closing:
            self._drop(connection, "sent more while its request was being answered")
            return
        connection.inbox += data
        self._next_request(connection)

    def _next_request(self, connection: _Connection) -> None:
        """Queue the next complete frame's request, if there is one."""
        inbox = connection.inbox
        if connection.in_flight or connection.closing or len(inbox) < 4:
            return
        (length,) = wire.LENGTH.unpack_from(inbox)
        if length > wire.MAX_MESSAGE:
            self._drop(connection, f"malformed request: a body of {length} bytes")
            return
        if len(inbox) < 4 + length:
            return
        if len(inbox) > 4 + length:
            self._drop(connection, "malformed request: another request before this one's reply")
            return
        body = bytes(inbox[4:4 + length])
        del inbox[:4 + length]
        if body:
            self.requests[body[0]] = self.requests.get(body[0], 0) + 1
        connection.in_flight = True
        session = connection.session
        session.later(lambda: session.request(body))

    def _flush(self, connection: _Connection) -> None:
        if connection.outbox:
            try:
                sent = connection.sock.send(connection.outbox)
                del connection.outbox[:sent]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                self._drop(connection, None)
                return
        if connection.closing and not connection.outbox:
            self._drop(connection, None)
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if connection.outbox else 0)
        if events != connection.events:  # not a system call per reply
            self._selector.modify(connection.sock, events, connection)
            connection.events = events

    def _drop(self, connection: _Connection, reason: str | None) -> None:
        """Close the socket now; the session lets go of its holds in a task."""
        if connection.closed:
            return
        connection.closed = True
        self._connections.discard(connection)
        self._selector.unregister(connection.sock)
        connection.sock.close()
        session = connection.session
        session.later(lambda: session.hang_up(reason))

    def _shut_down(self) -> None:
        if self._listener is not None:
            self._selector.unregister(self._listener)
            self._listener.close()
        if self._bound is not None:
            with contextlib.suppress(OSError):  # ours only: what replaced it stays
                _unlink_if_same(self.socket_path, self._bound)
        for connection in list(self._connections):
            self._drop(connection, None)
        self._tasks.shutdown()  # the connections' hang-ups, before their databases close
        self.table.close_all()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
        if self._metrics is not None:
            self._metrics.close()
        log_request_counts(self.requests)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dbwrap-py proxy-daemon",
                                     description="the proxy mode's node daemon: "
                                                 "adapters for smbd's processes")
    parser.add_argument("--socket", required=True, help="the unix socket smbd's processes connect to")
    parser.add_argument("--group", help="a group whose members may connect too (socket mode 0660; "
                                        "needs --config)")
    parser.add_argument("--config", help="the root-owned file naming the directories, adapters and "
                                         "options peers may open (docs/proxy-mode.md)")
    parser.add_argument("--metrics-port", metavar="[ADDR:]PORT",
                        help="serve Prometheus metrics at http://ADDR:PORT/metrics (ADDR: 127.0.0.1 "
                             "unless given; 0: any free port); off without it")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = DaemonConfig.load(args.config) if args.config is not None else None
        listen = parse_listen(args.metrics_port) if args.metrics_port is not None else None
        daemon = ProxyDaemon(args.socket, args.group, config)
        if listen is not None:  # before the socket: a refused port leaves nothing behind
            addr, port = daemon.serve_metrics(*listen)
            log(f"metrics on {metrics_url(addr, port)}")
        daemon.bind()
    except (KeyError, OSError, ValueError, DbwrapError) as exc:  # KeyError: no such group
        print(f"dbwrap-py proxy-daemon: {exc}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: daemon.stop())
    signal.signal(signal.SIGINT, lambda *_: daemon.stop())
    print(f"dbwrap_py proxy daemon pid {os.getpid()} on {args.socket}", flush=True)
    daemon.serve()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
