"""A small blocking client of the proxy protocol, for tests and the fuzzer.

smbd's processes use the C side (c_bridge/); this one speaks the same bytes
through wire.py, one request at a time, each bounded by the socket timeout.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import NamedTuple

from dbwrap_py import ntstatus as nt
from dbwrap_py.proxy import wire
from dbwrap_py.proxy.wire import WAIT_FOREVER, Op, Reader, Txn, Writer

DEFAULT_TIMEOUT = 10.0
TDB_REPLACE = 1


class ProxyError(Exception):
    """An error reply: the NTSTATUS and the daemon's cause."""

    def __init__(self, status: int, cause: str) -> None:
        super().__init__(f"{nt.NAMES.get(status, f'0x{status:08x}')}: {cause}")
        self.status = status
        self.cause = cause


class NodeCacheFiles(NamedTuple):
    """NODE_CACHE's reply."""

    records_path: str
    buckets_path: str
    cache_dir: str
    cache_id: bytes
    wipe_revision: int
    op_timeout_ms: int


class ConnectionClosed(ConnectionError):
    """The daemon closed the connection (or died)."""


class ProxyClient:
    """One connection to the daemon: ``hello()``, ``open()``, then the ops."""

    def __init__(self, socket_path: str, timeout: float = DEFAULT_TIMEOUT,
                 version: int = wire.VERSION) -> None:
        #: the highest version HELLO offers (1: a client without the fast path's ops)
        self.version = version
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(socket_path)
        except BaseException:
            self.sock.close()
            raise

    def __enter__(self) -> "ProxyClient":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    # -- framing ------------------------------------------------------------------

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _exactly(self, n: int) -> bytes:
        chunks, left = [], n
        while left:
            try:
                chunk = self.sock.recv(left)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                raise ConnectionClosed("the daemon closed the connection")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def read_reply(self) -> Reader:
        """The next reply's fields after an OK status; ProxyError otherwise."""
        (length,) = wire.LENGTH.unpack(self._exactly(4))
        reader = Reader(self._exactly(length))
        status = reader.u32()
        if status:
            cause = reader.str()
            raise ProxyError(status, cause)
        return reader

    def call(self, request: Writer) -> Reader:
        self.send_raw(request.message())
        return self.read_reply()

    def _done(self, request: Writer) -> None:
        self.call(request).end()

    # -- ops ------------------------------------------------------------------------

    def hello(self, min_version: int = wire.MIN_VERSION, max_version: int | None = None,
              pid: int | None = None, magic: int = wire.MAGIC) -> tuple[int, int]:
        """(version, max message) the daemon agreed."""
        high = self.version if max_version is None else max_version
        r = self.call(wire.request(Op.HELLO).u32(magic).u16(min_version).u16(high)
                      .u32(os.getpid() if pid is None else pid))
        version, max_message = r.u16(), r.u32()
        r.end()
        return version, max_message

    def open(self, name: str, adapter: str, options: Sequence[str] = (), tdb_flags: int = 0,
             hash_size: int = 0, open_flags: int = os.O_RDWR | os.O_CREAT, mode: int = 0o600,
             lock_order: int = 0, dbwrap_flags: int = 0) -> int:
        request = (wire.request(Op.OPEN).str(name).i32(hash_size).i32(tdb_flags).i32(open_flags)
                   .u32(mode).i32(lock_order).u64(dbwrap_flags).str(adapter).u32(len(options)))
        for option in options:
            request.str(option)
        r = self.call(request)
        handle = r.u32()
        r.end()
        return handle

    def close_db(self, db: int) -> None:
        self._done(wire.request(Op.CLOSE, db))

    def fetch(self, db: int, key: bytes) -> bytes | None:
        r = self.call(wire.request(Op.FETCH, db).bytes(key))
        value = r.opt()
        r.end()
        return value

    def lock(self, db: int, key: bytes, wait_ms: int = WAIT_FOREVER) -> bytes | None:
        r = self.call(wire.request(Op.LOCK, db).bytes(key).u32(wait_ms))
        value = r.opt()
        r.end()
        return value

    def unlock(self, db: int, key: bytes, value: bytes | None = None) -> None:
        self._done(wire.request(Op.UNLOCK, db).bytes(key).opt(value))

    def store(self, db: int, key: bytes, value: bytes, flag: int = TDB_REPLACE) -> None:
        self._done(wire.request(Op.STORE, db).bytes(key).i32(flag).bytes(value))

    def delete(self, db: int, key: bytes) -> None:
        self._done(wire.request(Op.DELETE, db).bytes(key))

    def write_through(self, db: int, key: bytes) -> None:
        self._done(wire.request(Op.WRITE_THROUGH, db).bytes(key))

    def exists(self, db: int, key: bytes) -> bool:
        r = self.call(wire.request(Op.EXISTS, db).bytes(key))
        found = r.u8()
        r.end()
        return bool(found)

    def seqnum(self, db: int) -> int:
        r = self.call(wire.request(Op.SEQNUM, db))
        number = r.i32()
        r.end()
        return number

    def traverse_start(self, db: int, write: bool) -> int:
        r = self.call(wire.request(Op.TRAVERSE_START, db).u8(int(write)))
        number = r.u32()
        r.end()
        return number

    def traverse_next(self, db: int, traverse: int) -> tuple[bytes, bytes] | None:
        r = self.call(wire.request(Op.TRAVERSE_NEXT, db).u32(traverse))
        if not r.u8():
            r.end()
            return None
        key, value = r.bytes(), r.bytes()
        r.end()
        return key, value

    def traverse_end(self, db: int, traverse: int) -> None:
        self._done(wire.request(Op.TRAVERSE_END, db).u32(traverse))

    def traverse(self, db: int, write: bool = False) -> Iterator[tuple[bytes, bytes]]:
        """Every record; leaving the loop early ends the traverse."""
        number = self.traverse_start(db, write)
        finished = False
        try:
            while (record := self.traverse_next(db, number)) is not None:
                yield record
            finished = True
        finally:
            if not finished:
                self.traverse_end(db, number)

    def transaction(self, db: int, what: Txn) -> None:
        self._done(wire.request(Op.TRANSACTION, db).u8(int(what)))

    def wipe(self, db: int) -> None:
        self._done(wire.request(Op.WIPE, db))

    def check(self, db: int) -> None:
        self._done(wire.request(Op.CHECK, db))

    def db_id(self, db: int) -> bytes:
        r = self.call(wire.request(Op.DB_ID, db))
        value = r.bytes()
        r.end()
        return value

    # -- smbd's fast path (version 2) ------------------------------------------------

    def node_cache(self, db: int) -> NodeCacheFiles:
        r = self.call(wire.request(Op.NODE_CACHE, db))
        files = NodeCacheFiles(r.str(), r.str(), r.str(), r.bytes(), r.u64(), r.u32())
        r.end()
        return files

    def move_in(self, db: int, key: bytes) -> bool:
        """True when the node owns the record now; False: ask again after a pause."""
        r = self.call(wire.request(Op.MOVE_IN, db).bytes(key))
        owned = r.u8()
        r.end()
        return bool(owned)

    def hand_over(self, db: int, key: bytes) -> None:
        self._done(wire.request(Op.HAND_OVER, db).bytes(key))
