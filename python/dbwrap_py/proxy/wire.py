"""The proxy protocol between smbd's processes and the node daemon, version 3.

c_bridge/proxy_wire.h is the C side of the same definitions; the two must
agree byte for byte (tests/python/test_proxy_wire.py compares them).

One connection per smbd process, made by the process itself (after fork
its child makes its own), carrying every database that process opened. The
process sends one request and waits for its reply; it never has two
requests outstanding. The daemon ties what the process holds (record locks,
a transaction, traverses) to the connection and lets go of all of it when
the connection closes, as the kernel closes it when the process dies.

Framing. Every message is a 4-byte little-endian body length, then the body.
A body longer than the negotiated maximum (``MAX_MESSAGE`` until HELLO's
reply says otherwise) is malformed. HELLO's max message is at least 64 and
at most ``MAX_MESSAGE``: a client refuses a daemon that advertises more. Integers are little-endian. ``bytes`` is
a u32 length then the data; ``str`` is ``bytes`` holding UTF-8 (file names
as the file system has them: surrogateescape); ``opt`` is a u8 (0 absent,
1 present) followed, when present, by ``bytes``.

Request body: u8 op, u8 0, u16 0, u32 db (the handle OPEN gave; 0 for HELLO
and OPEN), then the op's fields. Reply body: u32 NTSTATUS, then, when it is
0, the op's reply fields; otherwise one ``str``, the cause, for the caller's
log line.

    op                  request fields             reply fields
    HELLO           1   u32 MAGIC, u16 min version,  u16 version, u32 max message
                        u16 max version, u32 pid
    OPEN            2   str name, i32 hash_size,   u32 db
                        i32 tdb_flags, i32 open_flags, u32 mode,
                        i32 lock_order, u64 dbwrap_flags, str adapter,
                        u32 n, n x str "key=value"
    CLOSE           3   -                          -
    FETCH           4   bytes key                  opt value
    LOCK            5   bytes key, u32 wait_ms     opt value
    UNLOCK          6   bytes key, opt value       -
    STORE           7   bytes key, i32 flag,       -
                        bytes value
    DELETE          8   bytes key                  -
    EXISTS          9   bytes key                  u8 exists
    SEQNUM         10   -                          i32 seqnum
    TRAVERSE_START 11   u8 write                   u32 traverse
    TRAVERSE_NEXT  12   u32 traverse               u8 more, then when 1:
                                                   bytes key, bytes value
    TRAVERSE_END   13   u32 traverse               -
    TRANSACTION    14   u8 TXN_*                   -
    WIPE           15   -                          -
    CHECK          16   -                          -
    DB_ID          17   -                          bytes id
    NODE_CACHE     18   -                          str records_path,
                                                   str buckets_path,
                                                   str cache_dir, bytes cache_id,
                                                   u64 wipe_revision,
                                                   u32 op_timeout_ms
    MOVE_IN        19   bytes key                  u8 owned
    HAND_OVER      20   bytes key                  -
    WRITE_THROUGH  21   bytes key                  -

Ops 18-20 (smbd's fast path, for a database with ``node_cache = write-back``)
exist from version 2 on, and WRITE_THROUGH from version 3: on a connection
that agreed an earlier version they are malformed, as an unknown op.

Semantics, beyond the in-process contract (dbwrap_py.database.Database):

* LOCK takes the record for this connection: other connections wait, this
  one nests (a second LOCK of a held key succeeds, and needs its own
  UNLOCK). The wait is bounded by ``wait_ms``; past it the reply is
  NT_STATUS_IO_TIMEOUT and nothing is held. UNLOCK with a value stores it
  before the lock goes (put_unlock), and releases the lock even if the
  store fails.
* STORE, DELETE and WRITE_THROUGH need the record locked by this connection
  (by LOCK or a write traverse); otherwise NT_STATUS_FILE_LOCK_CONFLICT.
* WRITE_THROUGH: the record's value, or its absence, is in the backend when
  the reply comes (Database.write_through: a write-back node cache writes it
  through; every other adapter has already). Samba 4.25's persistent records
  ask for it (c_bridge/per_rec_persistent.c).
* TRAVERSE_NEXT of a write traverse locks the record it returns for this
  connection until the next TRAVERSE_NEXT or TRAVERSE_END; records deleted
  since the traverse started are skipped. ``more`` = 0 ends the traverse and
  frees its number.
* During one connection's transaction on a database, other connections'
  requests on that database wait for it to end (tdb keeps other writers out
  the same way); TRANSACTION with TXN_START_NONBLOCK does not wait and
  fails with NT_STATUS_FILE_LOCK_CONFLICT.
* CLOSE, or the end of the connection, releases the connection's locks,
  cancels its transaction and ends its traverses.
* NODE_CACHE, MOVE_IN and HAND_OVER are for smbd's fast path, on a database
  whose adapter is a node cache (dbwrap_py.nodecache) in write-back mode
  with a live cache (a node agent served the cache directory at open); on
  any other database they reply NT_STATUS_NOT_SUPPORTED, the reason as the
  cause. The process does a record the node owns itself, under the records
  tdb's chainlock, and asks the daemon only for these. The daemon never
  waits in them, neither for a chainlock nor for another node.
* NODE_CACHE: the node cache's two local tdb files (absolute paths), the
  node agent's directory (its state file, ``node.state``, is there), the
  database's name in it (``cache_id``: the state file's wanted table hashes
  it), ``wipe_revision`` (tokens up to it are void) and the store's op
  timeout, how long a process may keep asking.
* MOVE_IN makes the node the record's owner: ``owned`` = 1 when the node
  owns it now (the process then works on it locally), 0 for "not yet, ask
  again after a pause": a process holds the key's chainlock, another node
  owns the record (the daemon asked it to let go), or the node lease is not
  live. The process must not hold the key's chainlock while it asks.
* HAND_OVER: the process has just unlocked a record the state file's wanted
  table names; the daemon hands it over to the store, unless a process
  holds its chainlock again (that one hands it over as it lets go). OK
  unless the store fails.

A malformed request (short fields, trailing bytes, unknown op or db, a bad
length) is logged by the daemon and closes only that connection.
"""

from __future__ import annotations

import enum
import struct

MAGIC = 0x50574244  # b"DBWP" read as a little-endian u32
VERSION = 3
MIN_VERSION = 1
#: the first version with NODE_CACHE, MOVE_IN and HAND_OVER
FAST_PATH_VERSION = 2
#: the first version with WRITE_THROUGH
WRITE_THROUGH_VERSION = 3
#: the largest body either side accepts before HELLO agrees another
MAX_MESSAGE = 64 * 1024 * 1024
#: LOCK's wait_ms for "as long as it takes"
WAIT_FOREVER = 0xFFFFFFFF
LENGTH = struct.Struct("<I")
REQUEST_HEADER = struct.Struct("<BBHI")  # op, 0, 0, db


class Op(enum.IntEnum):
    HELLO = 1
    OPEN = 2
    CLOSE = 3
    FETCH = 4
    LOCK = 5
    UNLOCK = 6
    STORE = 7
    DELETE = 8
    EXISTS = 9
    SEQNUM = 10
    TRAVERSE_START = 11
    TRAVERSE_NEXT = 12
    TRAVERSE_END = 13
    TRANSACTION = 14
    WIPE = 15
    CHECK = 16
    DB_ID = 17
    NODE_CACHE = 18
    MOVE_IN = 19
    HAND_OVER = 20
    WRITE_THROUGH = 21


#: ops a connection may send only once it agreed FAST_PATH_VERSION
FAST_PATH_OPS = frozenset({Op.NODE_CACHE, Op.MOVE_IN, Op.HAND_OVER})
#: the version each op needs, where it is more than MIN_VERSION
OP_VERSION = {**{op: FAST_PATH_VERSION for op in FAST_PATH_OPS}, Op.WRITE_THROUGH: WRITE_THROUGH_VERSION}


class Txn(enum.IntEnum):
    START = 0
    START_NONBLOCK = 1
    COMMIT = 2
    CANCEL = 3


class Malformed(Exception):
    """A message that breaks the framing or its op's fields."""


class Reader:
    """The fields of one body, in order; any shortfall is Malformed."""

    def __init__(self, body: bytes | memoryview) -> None:
        self._view = memoryview(body)
        self._at = 0

    def _take(self, n: int) -> memoryview:
        if n < 0 or self._at + n > len(self._view):
            raise Malformed(f"a field of {n} bytes at offset {self._at} runs past the "
                            f"{len(self._view)}-byte body")
        part = self._view[self._at:self._at + n]
        self._at += n
        return part

    def _unpack(self, fmt: str) -> int:
        size = struct.calcsize(fmt)
        return struct.unpack(fmt, self._take(size))[0]

    def u8(self) -> int:
        return self._unpack("<B")

    def u16(self) -> int:
        return self._unpack("<H")

    def u32(self) -> int:
        return self._unpack("<I")

    def i32(self) -> int:
        return self._unpack("<i")

    def u64(self) -> int:
        return self._unpack("<Q")

    def bytes(self) -> bytes:
        return bytes(self._take(self.u32()))

    def str(self) -> str:
        return self.bytes().decode("utf-8", "surrogateescape")

    def opt(self) -> bytes | None:
        present = self.u8()
        if present > 1:
            raise Malformed(f"an optional field's flag is {present}, not 0 or 1")
        return self.bytes() if present else None

    def end(self) -> None:
        """The body must be used up: trailing bytes are malformed."""
        if self._at != len(self._view):
            raise Malformed(f"{len(self._view) - self._at} bytes left after the last field")


class Writer:
    """A body built field by field."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def u8(self, v: int) -> "Writer":
        self._parts.append(struct.pack("<B", v))
        return self

    def u16(self, v: int) -> "Writer":
        self._parts.append(struct.pack("<H", v))
        return self

    def u32(self, v: int) -> "Writer":
        self._parts.append(struct.pack("<I", v))
        return self

    def i32(self, v: int) -> "Writer":
        self._parts.append(struct.pack("<i", v))
        return self

    def u64(self, v: int) -> "Writer":
        self._parts.append(struct.pack("<Q", v))
        return self

    def bytes(self, v: bytes) -> "Writer":
        self._parts.append(LENGTH.pack(len(v)))
        self._parts.append(v)
        return self

    def str(self, v: str) -> "Writer":
        return self.bytes(v.encode("utf-8", "surrogateescape"))

    def opt(self, v: bytes | None) -> "Writer":
        self.u8(0 if v is None else 1)
        return self if v is None else self.bytes(v)

    def body(self) -> bytes:
        return b"".join(self._parts)

    def message(self) -> bytes:
        body = self.body()
        return LENGTH.pack(len(body)) + body


def request(op: Op, db: int = 0) -> Writer:
    """A request's body, its header written."""
    w = Writer()
    w._parts.append(REQUEST_HEADER.pack(int(op), 0, 0, db))
    return w


def reply_ok() -> Writer:
    return Writer().u32(0)


def reply_error(status: int, cause: str) -> bytes:
    return Writer().u32(status).str(cause).message()
