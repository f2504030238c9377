"""Bad input for a running proxy daemon: it must stay up and leak nothing.

Each case is one connection with random, truncated or mutated versions of
valid requests, or a valid start (HELLO, a LOCK, a transaction) followed by
garbage or a sudden close. A keeper connection holds the fuzzed database
open throughout, so a lock or transaction a broken connection left behind
would still be there at the end, where a fresh client must HELLO, OPEN and
LOCK every key the cases locked without waiting.
"""

from __future__ import annotations

import collections
import random
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dbwrap_py import ntstatus as nt
from dbwrap_py.proxy import wire
from dbwrap_py.proxy.client import ConnectionClosed, ProxyClient, ProxyError
from dbwrap_py.proxy.wire import Op, Txn

FUZZ_DB = "fuzz.tdb"
KEYS = [b"k%d" % i for i in range(8)]
#: how long a case waits for the daemon's answer to its bad input (its
#: setup, HELLO and OPEN, may take SETUP_TIMEOUT on a loaded machine)
CASE_TIMEOUT = 0.05
SETUP_TIMEOUT = 5.0
#: how long the final check lets a lock wait: a leaked one never comes
CHECK_WAIT_MS = 1000


@dataclass
class FuzzReport:
    cases: int = 0
    by_kind: collections.Counter[str] = field(default_factory=collections.Counter)
    closed_by_daemon: int = 0  # the daemon hung up on the case
    answered: int = 0          # the daemon replied (an error or not) and kept it open
    silent: int = 0            # nothing came back within CASE_TIMEOUT (waiting for more bytes)
    locked_keys: set[bytes] = field(default_factory=set)
    alive: bool = False
    leaked: list[bytes] = field(default_factory=list)


def _valid_bodies(rng: random.Random, db: int) -> list[bytes]:
    key = rng.choice(KEYS)
    return [w.body() for w in (
        wire.request(Op.FETCH, db).bytes(key),
        wire.request(Op.LOCK, db).bytes(key).u32(0),
        wire.request(Op.UNLOCK, db).bytes(key).opt(b"v"),
        wire.request(Op.STORE, db).bytes(key).i32(1).bytes(b"value"),
        wire.request(Op.DELETE, db).bytes(key),
        wire.request(Op.EXISTS, db).bytes(key),
        wire.request(Op.SEQNUM, db),
        wire.request(Op.TRAVERSE_START, db).u8(rng.randrange(2)),
        wire.request(Op.TRAVERSE_NEXT, db).u32(rng.randrange(3)),
        wire.request(Op.TRANSACTION, db).u8(rng.randrange(5)),
        wire.request(Op.DB_ID, db),
        wire.request(Op.NODE_CACHE, db),  # a memory database: NOT_SUPPORTED
        wire.request(Op.MOVE_IN, db).bytes(key),
        wire.request(Op.HAND_OVER, db).bytes(key),
        wire.request(Op.WRITE_THROUGH, db).bytes(key),
        wire.request(Op.OPEN).str(FUZZ_DB).i32(0).i32(0).i32(0o102).u32(0o600).i32(0).u64(0)
            .str("memory").u32(0),
    )]


def _framed(body: bytes) -> bytes:
    return wire.LENGTH.pack(len(body)) + body


def _mutate(rng: random.Random, body: bytes) -> bytes:
    data = bytearray(body)
    for _ in range(rng.randint(1, 4)):
        if data and rng.random() < 0.6:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif data:
            del data[rng.randrange(len(data)):]
        else:
            data += rng.randbytes(rng.randint(1, 8))
    return bytes(data)


class _Fuzzer:
    def __init__(self, socket_path: str, rng: random.Random, report: FuzzReport) -> None:
        self.socket_path = socket_path
        self.rng = rng
        self.report = report

    def _connect(self) -> ProxyClient:
        return ProxyClient(self.socket_path, SETUP_TIMEOUT)

    def _greeted(self) -> tuple[ProxyClient, int]:
        client = self._connect()
        client.hello()
        return client, client.open(FUZZ_DB, "memory")

    def _outcome(self, client: ProxyClient) -> None:
        """What the daemon made of the case: a reply, silence or a hang-up."""
        client.sock.settimeout(CASE_TIMEOUT)
        try:
            client.read_reply()
            self.report.answered += 1
        except ProxyError:
            self.report.answered += 1
        except (ConnectionClosed, ConnectionResetError, BrokenPipeError):
            self.report.closed_by_daemon += 1
        except (TimeoutError, socket.timeout):
            self.report.silent += 1
        except wire.Malformed:
            self.report.answered += 1

    def _send(self, client: ProxyClient, data: bytes) -> None:
        try:
            client.send_raw(data)
        except (BrokenPipeError, ConnectionResetError):
            pass

    # -- the cases ------------------------------------------------------------------

    def random_bytes(self) -> None:
        with self._connect() as client:
            self._send(client, self.rng.randbytes(self.rng.randint(0, 64)))
            self._outcome(client)

    def bad_length(self) -> None:
        with self._connect() as client:
            body = self.rng.choice(_valid_bodies(self.rng, 1))
            self._send(client, struct.pack("<I", max(0, len(body) + self.rng.randint(-8, 8))) + body)
            self._outcome(client)

    def huge_length(self) -> None:
        with self._connect() as client:
            claimed = self.rng.choice([wire.MAX_MESSAGE, wire.MAX_MESSAGE + 1, 0xFFFFFFFF])
            self._send(client, struct.pack("<I", claimed) + self.rng.randbytes(16))

    def truncated(self) -> None:
        client, db = self._greeted()
        with client:
            message = _framed(self.rng.choice(_valid_bodies(self.rng, db)))
            self._send(client, message[:self.rng.randrange(len(message))])

    def mutated(self) -> None:
        client, db = self._greeted()
        with client:
            self._send(client, _framed(_mutate(self.rng, self.rng.choice(_valid_bodies(self.rng, db)))))
            self._outcome(client)

    def wrong_op_or_handle(self) -> None:
        client, _ = self._greeted()
        with client:
            op = self.rng.choice([0, max(Op) + 1, 255, int(Op.HELLO), int(Op.FETCH)])
            header = struct.pack("<BBHI", op, 0, 0, self.rng.randrange(2, 1 << 32))
            body = header + wire.Writer().bytes(b"k").body()
            self._send(client, _framed(body))
            self._outcome(client)

    def garbage_before_hello(self) -> None:
        with self._connect() as client:
            self._send(client, _framed(self.rng.choice(_valid_bodies(self.rng, 0))))
            self._outcome(client)

    def hello_then_garbage(self) -> None:
        client, _ = self._greeted()
        with client:
            self._send(client, self.rng.randbytes(self.rng.randint(1, 40)))
            self._outcome(client)

    def lock_then_garbage(self) -> None:
        client, db = self._greeted()
        with client:
            key = self.rng.choice(KEYS)
            try:
                client.lock(db, key, wait_ms=CHECK_WAIT_MS)
            except ProxyError:
                return
            self.report.locked_keys.add(key)
            if self.rng.random() < 0.5:  # else: just close, as a killed process does
                self._send(client, self.rng.randbytes(self.rng.randint(1, 40)))
                self._outcome(client)

    def transaction_then_garbage(self) -> None:
        client, db = self._greeted()
        with client:
            try:
                client.transaction(db, Txn.START_NONBLOCK)
            except ProxyError:
                return
            self._send(client, _mutate(self.rng, _framed(wire.request(Op.SEQNUM, db).body())))
            self._outcome(client)

    def valid_sequence(self) -> None:
        """Well-formed requests in a random order, then a sudden close: the
        daemon's real paths, left in any state."""
        client, db = self._greeted()
        with client:
            for _ in range(self.rng.randint(1, 6)):
                body = self.rng.choice(_valid_bodies(self.rng, db))
                self._send(client, _framed(body))
                self._outcome(client)
                if body[0] == Op.LOCK:  # the key follows the 8-byte header
                    self.report.locked_keys.add(wire.Reader(body[wire.REQUEST_HEADER.size:]).bytes())

    def pipelined(self) -> None:
        client, db = self._greeted()
        with client:
            bodies = _valid_bodies(self.rng, db)
            self._send(client, _framed(bodies[0]) + _framed(bodies[5]))
            self._outcome(client)

    def cases(self) -> list[Callable[[], None]]:
        return [self.random_bytes, self.bad_length, self.huge_length, self.truncated, self.mutated,
                self.wrong_op_or_handle, self.garbage_before_hello, self.hello_then_garbage,
                self.lock_then_garbage, self.transaction_then_garbage, self.valid_sequence,
                self.pipelined]


def _check(socket_path: str, report: FuzzReport) -> None:
    """Alive, and every key a case locked can be locked again at once."""
    with ProxyClient(socket_path, CHECK_WAIT_MS / 1000 + 5) as client:
        client.hello()
        db = client.open(FUZZ_DB, "memory")
        report.alive = True
        for key in sorted(report.locked_keys | set(KEYS)):
            try:
                client.lock(db, key, wait_ms=CHECK_WAIT_MS)
                client.unlock(db, key)
            except ProxyError as exc:
                if exc.status != nt.NT_STATUS_IO_TIMEOUT:
                    raise
                report.leaked.append(key)
            except TimeoutError:  # parked at a dead connection's transaction: leaked too
                report.leaked.append(key)
                return


def fuzz(socket_path: str, seconds: float, seed: int) -> FuzzReport:
    """Throw cases at the daemon for ``seconds``; then check it."""
    rng = random.Random(seed)
    report = FuzzReport()
    fuzzer = _Fuzzer(socket_path, rng, report)
    cases = fuzzer.cases()
    keeper = ProxyClient(socket_path)  # keeps the database, and any leak, alive
    try:
        keeper.hello()
        keeper.open(FUZZ_DB, "memory")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            case = rng.choice(cases)
            try:
                case()
            except (ConnectionClosed, ProxyError, OSError):
                report.closed_by_daemon += 1  # HELLO or OPEN of a case refused: still a case
            report.cases += 1
            report.by_kind[case.__name__] += 1
        _check(socket_path, report)
    finally:
        keeper.close()
    return report


def main(argv: list[str] | None = None) -> int:
    """``python -m dbwrap_py.proxy.fuzz [SECONDS [SEED]]``: a throwaway
    daemon under fuzz; exit 1 unless it survived with nothing leaked."""
    import sys

    from dbwrap_py.proxy.process import ProxyDaemonProcess

    args = sys.argv[1:] if argv is None else argv
    seconds = float(args[0]) if args else 30.0
    seed = int(args[1]) if len(args) > 1 else int(time.time())
    with ProxyDaemonProcess() as daemon:
        report = fuzz(daemon.socket_path, seconds, seed)
        log = daemon.log_text()
    kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(report.by_kind.items()))
    print(f"proxy fuzz, seed {seed}: {report.cases} cases in {seconds:g} s ({kinds}); "
          f"the daemon hung up on {report.closed_by_daemon}, answered {report.answered}; "
          f"alive: {report.alive}; locks leaked: {len(report.leaked)}")
    broken = not report.alive or report.leaked or "internal error" in log
    if broken:
        print(f"daemon log:\n{log}", file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    raise SystemExit(main())
