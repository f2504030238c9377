"""Bad replies for smbd's side of the proxy: a fake node daemon under the C client.

    python -m dbwrap_py.proxy.fuzz_client CLIENT [SECONDS [SEED]]

CLIENT is ``build/proxy_client`` (tests/proxy_client/proxy_client.c): the
bridge's own client code (transport_proxy.c, proxy_conn.c, proxy_wire.c,
proxy_fastpath.c) with AddressSanitizer and UBSan, running random database
calls for SECONDS. This daemon answers each request it gets with one case:
a well-formed reply with random fields, an error with a random status and
cause (long ones, control bytes), a mutated reply, a frame whose length is
short or over the limit, a truncated reply then a close or silence,
garbage, a reply with bytes after it, a close, or a HELLO that advertises
messages over ``wire.MAX_MESSAGE``, a version out of range, or too small a
maximum.

It fails when the client

* dies (a signal, a sanitizer's report, an exit status other than 0), or
  does not end in time;
* leaves a call without its status line (every call must return an
  NTSTATUS);
* sends a request on a connection it had to give up: after a HELLO
  refused (malformed, a version out of range, a maximum under 64 or over
  ``MAX_MESSAGE``), a reply whose length is over the limit or short, a
  cut reply, or a timeout, the connection is dead to it; before its HELLO
  is accepted, only HELLO may come;
* sends an op the version agreed on the connection does not have
  (``wire.OP_VERSION``), or a database handle no OPEN gave on that
  connection.

The sanitizers also fail any allocation over the driver's
MAX_ALLOCATION_MB (96 MiB): a reply's length is allocated before its body
arrives, so a client that took a length over ``MAX_MESSAGE`` on a daemon's
say-so dies there. ``build/proxy_client_broken`` is the broken example:
without the HELLO clamp it must fail (tests/python/test_proxy_client.py).
"""

from __future__ import annotations

import collections
import contextlib
import random
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dbwrap_py import ntstatus as nt
from dbwrap_py.proxy import wire
from dbwrap_py.proxy.wire import Op, Writer

#: proxy_timeout the client runs with: a silent case costs this much
CLIENT_TIMEOUT = 0.1
#: how long past SECONDS the client may take to end (a LOCK's reply may take
#: proxy_timeout plus 5 s, transport_proxy.c's slack, before it gives up)
END_GRACE = 30.0
#: ops whose reply the client awaits for proxy_timeout plus 5 s (its slack for
#: a lock's wait): never left unanswered, or each silence would cost that
LONG_WAIT_OPS = frozenset({Op.LOCK, Op.TRAVERSE_NEXT})
SANITIZER_MARKS = ("ERROR: AddressSanitizer", "runtime error:", "ERROR: LeakSanitizer",
                   "SUMMARY: UndefinedBehaviorSanitizer")
ERROR_STATUSES = [nt.NT_STATUS_NOT_FOUND, nt.NT_STATUS_NOT_SUPPORTED, nt.NT_STATUS_IO_TIMEOUT,
                  nt.NT_STATUS_FILE_LOCK_CONFLICT, nt.NT_STATUS_DEVICE_NOT_READY,
                  nt.NT_STATUS_OBJECT_NAME_COLLISION, nt.NT_STATUS_INTERNAL_DB_CORRUPTION,
                  0x00000103, 0x40000000, 0x80000005, 0xFFFFFFFF]


@dataclass
class ClientFuzzReport:
    cases: int = 0
    by_kind: collections.Counter[str] = field(default_factory=collections.Counter)
    by_op: collections.Counter[str] = field(default_factory=collections.Counter)
    connections: int = 0
    ops: int | None = None          # "done N ops", when the client got that far
    status_lines: int = 0
    returncode: int | None = None
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def broken(self) -> bool:
        return bool(self.failures)


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    accepted: bool = False        # a HELLO reply the client must take was sent
    dead_because: str | None = None  # the client must send nothing more
    limit: int = wire.MAX_MESSAGE    # what the client takes, as far as we know
    version: int = wire.VERSION
    unknown: bool = False         # stray bytes were sent: one more exchange, then the end
    handles: set[int] = field(default_factory=set)  # what OPEN gave on this connection


class _Closed(Exception):
    """The case ended the connection (ours to close)."""


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def _hello_verdict(body: bytes) -> tuple[bool, int, str | None]:
    """(accepted, max_message, why the client must hang up) for a HELLO reply body."""
    r = wire.Reader(body)
    try:
        status = r.u32()
        if status != 0:
            return False, 0, None  # an error reply: it may say HELLO again
        version, max_message = r.u16(), r.u32()
        r.end()
    except wire.Malformed:
        return False, 0, "a malformed HELLO reply"
    if not wire.MIN_VERSION <= version <= wire.VERSION:
        return False, 0, f"a HELLO reply with version {version}"
    if max_message < 64:
        return False, 0, f"a HELLO reply with max_message {max_message}"
    if max_message > wire.MAX_MESSAGE:
        return False, 0, f"a HELLO reply advertising max_message {max_message} > {wire.MAX_MESSAGE}"
    return True, max_message, None


def _opened_handle(body: bytes) -> set[int]:
    """The handle an OPEN reply gives the client, if it takes one."""
    r = wire.Reader(body)
    try:
        status, handle = r.u32(), r.u32()
        r.end()
    except wire.Malformed:
        return set()
    return {handle} if status == 0 and handle != 0 else set()


class _Cases:
    """The replies, one per request; each sends, and may end the connection."""

    def __init__(self, rng: random.Random, place: Path) -> None:
        self.rng = rng
        self.place = place

    # -- well-formed fields -------------------------------------------------------

    def _bytes(self, most: int = 64) -> bytes:
        return self.rng.randbytes(self.rng.randint(0, most))

    def ok_body(self, op: int, conn: _Connection) -> bytes:
        rng = self.rng
        w = wire.reply_ok()
        if op == Op.HELLO:
            w.u16(rng.randint(wire.MIN_VERSION, wire.VERSION))
            w.u32(rng.choice([64, 4096, wire.MAX_MESSAGE, rng.randint(64, wire.MAX_MESSAGE)]))
        elif op == Op.OPEN:
            w.u32(rng.choice([1, 2, rng.randrange(1 << 32)]))
        elif op in (Op.FETCH, Op.LOCK):
            w.opt(rng.choice([None, self._bytes(), self._bytes(4096)]))
        elif op in (Op.EXISTS, Op.MOVE_IN):
            w.u8(rng.randint(0, 1))
        elif op in (Op.SEQNUM, Op.TRAVERSE_START):
            w.u32(rng.randrange(1 << 32))
        elif op == Op.TRAVERSE_NEXT:
            more = rng.random() < 0.7
            w.u8(int(more))
            if more:
                w.bytes(self._bytes()).bytes(self._bytes(1024))
        elif op == Op.DB_ID:
            w.bytes(self._bytes(32))
        elif op == Op.NODE_CACHE:  # files that do not exist: the fast path stays off
            n = rng.randrange(1 << 16)
            w.str(str(self.place / f"records-{n}.tdb")).str(str(self.place / f"buckets-{n}.tdb"))
            w.str(str(self.place / f"agent-{n}")).bytes(self._bytes(16))
            w.u64(rng.randrange(1 << 64)).u32(rng.randrange(1 << 32))
        return w.body()

    def error_body(self, cause_most: int = 2000) -> bytes:
        status = self.rng.choice(ERROR_STATUSES + [self.rng.randrange(1, 1 << 32)])
        return Writer().u32(status).bytes(self._bytes(cause_most)).body()

    def mutate(self, body: bytes) -> bytes:
        data = bytearray(body)
        for _ in range(self.rng.randint(1, 4)):
            choice = self.rng.random()
            if data and choice < 0.5:
                data[self.rng.randrange(len(data))] = self.rng.randrange(256)
            elif data and choice < 0.75:
                del data[self.rng.randrange(len(data)):]
            else:
                at = self.rng.randrange(len(data) + 1)
                data[at:at] = self.rng.randbytes(self.rng.randint(1, 8))
        if len(data) < 4:
            data += bytes(4 - len(data))  # a status at least: short frames are a case of their own
        return bytes(data)

    # -- the cases: (name, weight, fn(conn, op) -> frame bytes sent) -----------

    def pick(self, op: int) -> tuple[str, Callable[[_Connection, int], None]]:
        cases: list[tuple[str, int, Callable[[_Connection, int], None]]] = [
            ("valid", 40, self.valid),
            ("error", 12, self.error),
            ("long_cause", 2, self.long_cause),
            ("mutated", 16, self.mutated),
            ("valid_then_extra", 3, self.valid_then_extra),
            ("short_frame", 2, self.short_frame),
            ("over_limit", 3, self.over_limit),
            ("big_claim_then_close", 1, self.big_claim_then_close),
            ("cut_then_close", 4, self.cut_then_close),
            ("garbage", 2, self.garbage),
            ("close", 2, self.close),
        ]
        if op not in LONG_WAIT_OPS:
            cases.append(("cut_then_silence", 1, self.cut_then_silence))
        if op == Op.HELLO:
            cases += [("hello_over_max", 10, self.hello_over_max),
                      ("hello_bad_version", 2, self.hello_bad_version),
                      ("hello_small_max", 2, self.hello_small_max)]
        names, weights, fns = zip(*cases)
        i = self.rng.choices(range(len(cases)), weights=weights)[0]
        return names[i], fns[i]

    def _send(self, conn: _Connection, data: bytes) -> None:
        try:
            conn.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            raise _Closed() from None

    def _framed(self, conn: _Connection, op: int, body: bytes) -> None:
        """A whole frame: the client reads it as the reply."""
        if op == Op.HELLO:
            accepted, max_message, dead = _hello_verdict(body)
            conn.accepted, conn.dead_because = accepted, dead
            if accepted:
                conn.limit = max_message
                conn.version = struct.unpack_from("<H", body, 4)[0]
        elif len(body) > conn.limit:
            conn.dead_because = f"a reply of {len(body)} bytes over its limit of {conn.limit}"
        elif op == Op.OPEN:
            conn.handles |= _opened_handle(body)
        self._send(conn, wire.LENGTH.pack(len(body)) + body)

    def _dead(self, conn: _Connection, why: str) -> None:
        conn.dead_because = why

    def valid(self, conn: _Connection, op: int) -> None:
        self._framed(conn, op, self.ok_body(op, conn))

    def error(self, conn: _Connection, op: int) -> None:
        self._framed(conn, op, self.error_body())

    def long_cause(self, conn: _Connection, op: int) -> None:
        """The log line's clamp: a cause of up to 1 MiB, any bytes."""
        body = Writer().u32(self.rng.choice(ERROR_STATUSES)).bytes(
            self.rng.randbytes(self.rng.randint(513, 1 << 20))).body()
        self._framed(conn, op, body)

    def mutated(self, conn: _Connection, op: int) -> None:
        body = self.ok_body(op, conn) if self.rng.random() < 0.8 else self.error_body(64)
        self._framed(conn, op, self.mutate(body))

    def valid_then_extra(self, conn: _Connection, op: int) -> None:
        """A reply and bytes after it: the next call reads them as its reply,
        then ours after them. The rules no longer say what it may send, and
        the connection ends after that exchange (a wait for bytes that never
        come would cost a LOCK's timeout and slack)."""
        self._framed(conn, op, self.ok_body(op, conn))
        conn.unknown = True
        self._send(conn, self.rng.randbytes(self.rng.randint(1, 16)))

    def short_frame(self, conn: _Connection, op: int) -> None:
        n = self.rng.randint(0, 3)
        self._dead(conn, f"a reply of {n} bytes (under a status)")
        self._send(conn, wire.LENGTH.pack(n) + self.rng.randbytes(n))

    def over_limit(self, conn: _Connection, op: int) -> None:
        """A length over the limit, with no body: refused at once, never allocated."""
        low = min(conn.limit + 1, 0xFFFFFFFF)
        claim = self.rng.choice([low, max(low, wire.MAX_MESSAGE + 1), 0xFFFFFFFF,
                                 self.rng.randint(low, 0xFFFFFFFF)])
        self._dead(conn, f"a reply claiming {claim} bytes, over its limit of {conn.limit}")
        self._send(conn, wire.LENGTH.pack(claim))

    def big_claim_then_close(self, conn: _Connection, op: int) -> None:
        """A length within the limit, up to 64 MiB, and then the end."""
        claim = self.rng.randint(min(1 << 20, conn.limit), conn.limit)
        self._send(conn, wire.LENGTH.pack(claim) + self._bytes(16))
        raise _Closed()

    def _cut(self, op: int, conn: _Connection) -> bytes:
        frame = wire.Writer().bytes(self.ok_body(op, conn)).body()  # the length, then the body
        return frame[:self.rng.randrange(len(frame))]

    def cut_then_close(self, conn: _Connection, op: int) -> None:
        self._send(conn, self._cut(op, conn))
        raise _Closed()

    def cut_then_silence(self, conn: _Connection, op: int) -> None:
        self._dead(conn, "a reply cut short, then silence (its timeout)")
        self._send(conn, self._cut(op, conn))

    def garbage(self, conn: _Connection, op: int) -> None:
        self._send(conn, self.rng.randbytes(self.rng.randint(1, 64)))
        raise _Closed()

    def close(self, conn: _Connection, op: int) -> None:
        raise _Closed()

    def hello_over_max(self, conn: _Connection, op: int) -> None:
        """The attack: a daemon that would have each client allocate up to 4 GiB."""
        max_message = self.rng.choice([wire.MAX_MESSAGE + 1, 0xFFFFFFFF,
                                       self.rng.randint(wire.MAX_MESSAGE + 1, 0xFFFFFFFF)])
        self._framed(conn, op, wire.reply_ok().u16(wire.VERSION).u32(max_message).body())

    def hello_bad_version(self, conn: _Connection, op: int) -> None:
        version = self.rng.choice([0, wire.VERSION + 1, 0xFFFF])
        self._framed(conn, op, wire.reply_ok().u16(version).u32(wire.MAX_MESSAGE).body())

    def hello_small_max(self, conn: _Connection, op: int) -> None:
        self._framed(conn, op, wire.reply_ok().u16(wire.VERSION).u32(self.rng.randint(0, 63)).body())


class FakeDaemon:
    """A unix socket server that answers each request with a random case."""

    def __init__(self, socket_path: str, rng: random.Random, report: ClientFuzzReport,
                 place: Path) -> None:
        self.socket_path = socket_path
        self.report = report
        self.cases = _Cases(rng, place)
        self._lock = threading.Lock()  # one case at a time: the rng and the report
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(socket_path)
        self._listener.listen(64)
        self._socks: set[socket.socket] = set()
        self._socks_lock = threading.Lock()
        self._stopping = False
        self.failed = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._socks_lock:
            for sock in list(self._socks):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(10)

    def _fail(self, message: str) -> None:
        with self._lock:
            if len(self.report.failures) < 20:
                self.report.failures.append(message)
        self.failed.set()

    def _accept_loop(self) -> None:
        while not self._stopping:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            with self._socks_lock:
                self._socks.add(sock)
            with self._lock:
                self.report.connections += 1
            threading.Thread(target=self._serve, args=(_Connection(sock),), daemon=True).start()

    def _serve(self, conn: _Connection) -> None:
        try:
            while not self._stopping and self._one_request(conn):
                pass
        except OSError:
            pass
        except Exception as exc:  # a bug of the fuzzer's own must not pass for a quiet run
            self._fail(f"the fuzzing daemon itself: {type(exc).__name__}: {exc}")
        finally:
            with self._socks_lock:
                self._socks.discard(conn.sock)
            conn.sock.close()

    @staticmethod
    def _broken_rule(conn: _Connection, op: Op, db: int) -> str | None:
        """Why the client must not have sent op (on database handle db) on conn, or None."""
        if conn.dead_because is not None:
            return f"after {conn.dead_because}"
        if not conn.accepted and op != Op.HELLO:
            return "before its HELLO was accepted"
        if conn.accepted and op == Op.HELLO:
            return "again after its HELLO was accepted"
        if wire.OP_VERSION.get(op, wire.MIN_VERSION) > conn.version:
            return f"on a connection that agreed version {conn.version}"
        if op not in (Op.HELLO, Op.OPEN) and db not in conn.handles:
            return f"with handle {db}, which no OPEN gave on this connection"
        return None

    def _one_request(self, conn: _Connection) -> bool:
        """Read a request and answer it; False when the connection is over."""
        head = _recv_exact(conn.sock, 4)
        if head is None:
            return False
        (length,) = wire.LENGTH.unpack(head)
        if length < wire.REQUEST_HEADER.size or length > wire.MAX_MESSAGE:
            self._fail(f"the client sent a request of {length} bytes")
            return False
        body = _recv_exact(conn.sock, length)
        if body is None:
            return False
        op, zero1, zero2, db = wire.REQUEST_HEADER.unpack_from(body)
        name = Op(op).name if op in Op._value2member_map_ else str(op)
        if op not in Op._value2member_map_ or zero1 or zero2:
            self._fail(f"the client sent a malformed request header: op {op}, {zero1}, {zero2}")
            return False
        if not conn.unknown:
            broken = self._broken_rule(conn, Op(op), db)
            if broken is not None:
                self._fail(f"the client sent {name} {broken}")
                return False
        unknown = conn.unknown
        with self._lock:
            kind, case = self.cases.pick(op)
            self.report.cases += 1
            self.report.by_kind[kind] += 1
            self.report.by_op[name] += 1
            try:
                case(conn, op)
            except _Closed:
                return False
        return not unknown


def _check_client(report: ClientFuzzReport, stdout: str, stderr: str, ended: bool) -> None:
    """What the client's output says; ``ended``: it ran to its end (not killed by us)."""
    lines = stdout.splitlines()
    calls = [line for line in lines if not line.startswith("done ")]
    report.status_lines = len(calls)
    for mark in SANITIZER_MARKS:
        if mark in stderr:
            at = stderr.index(mark)
            report.failures.append(f"the client's sanitizer: {stderr[at:at + 1500]}")
            break
    without = [line for line in calls if len(line.split()) != 2 or
               not (line.split()[1] == "no-db" or line.split()[1].startswith("0x"))]
    if without and (ended or without[0] != calls[-1]):  # a killed client's last line may be cut
        report.failures.append(f"a call without an NTSTATUS: {without[0]!r}")
    if not ended:
        return
    if report.returncode != 0:
        why = (f"killed by signal {-report.returncode}" if report.returncode is not None
               and report.returncode < 0 else f"exit status {report.returncode}")
        report.failures.append(f"the client ended with {why}")
        return
    done = [line for line in lines if line.startswith("done ")]
    if not done:
        report.failures.append("the client ended without its 'done' line")
        return
    report.ops = int(done[-1].split()[1])
    if report.ops != report.status_lines:
        report.failures.append(f"{report.ops} calls, {report.status_lines} status lines")


def fuzz(client: str | Path, seconds: float, seed: int,
         client_timeout: float = CLIENT_TIMEOUT) -> ClientFuzzReport:
    """The client under a fake daemon for ``seconds``; it stops at the first
    rule the client breaks."""
    report = ClientFuzzReport()
    place = Path(tempfile.mkdtemp(prefix="dbwrap-py-fuzz-client-"))
    daemon = FakeDaemon(str(place / "s.sock"), random.Random(seed), report, place)
    started = time.monotonic()
    try:
        daemon.start()
        with open(place / "out", "w+", errors="replace") as out, \
                open(place / "err", "w+", errors="replace") as err:
            process = subprocess.Popen([str(client), daemon.socket_path, f"{client_timeout:g}",
                                        "random", str(seed), f"{seconds:g}"],
                                       stdin=subprocess.DEVNULL, stdout=out, stderr=err)
            deadline = started + seconds + END_GRACE
            killed = False
            while process.poll() is None:
                if daemon.failed.is_set() or time.monotonic() > deadline:
                    if not daemon.failed.is_set():
                        report.failures.append(f"the client did not end within {seconds + END_GRACE:g} s")
                    process.kill()  # by PID: it broke a rule, nothing more to learn
                    killed = True
                    process.wait()
                    break
                time.sleep(0.05)
            report.returncode = process.returncode
            out.seek(0)
            err.seek(0)
            _check_client(report, out.read(), err.read(), ended=not killed)
    finally:
        daemon.stop()
        report.seconds = time.monotonic() - started
        shutil.rmtree(place, ignore_errors=True)
    return report


def summary(report: ClientFuzzReport, seed: int) -> str:
    kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(report.by_kind.items()))
    return (f"proxy client fuzz, seed {seed}: {report.cases} cases in {report.seconds:.1f} s "
            f"({kinds}) on {report.connections} connections; the client made "
            f"{report.ops if report.ops is not None else '?'} calls, each with its NTSTATUS: "
            f"{'no' if report.broken else 'yes'}; failures: {len(report.failures)}")


def main(argv: list[str] | None = None) -> int:
    """Exit 1 unless the client survived every case and kept every rule."""
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    seconds = float(args[1]) if len(args) > 1 else 20.0
    seed = int(args[2]) if len(args) > 2 else int(time.time())
    report = fuzz(args[0], seconds, seed)
    print(summary(report, seed))
    for failure in report.failures:
        print(f"FAIL: {failure}", file=sys.stderr)
    return 1 if report.broken else 0


if __name__ == "__main__":
    raise SystemExit(main())
