"""The fdb adapter's operations on one database, each one FoundationDB
transaction (retried through ``on_error``), on the real ``fdb`` API.

Keys, under ``<prefix>\\0<db>\\0`` (``<db>`` is DatabaseSpec.cluster_name):

* ``d<bucket:1><enc(key)><chunk:4>``: the record, in chunks of at most
  100,000 bytes (FoundationDB's value limit). ``enc`` escapes NUL (as the
  tuple layer does), so one record's chunks are one key range and no
  record's range holds another's. The bucket (``nodecache.layout``) comes
  first, so the node cache reads a bucket's records and locks as one range. A write clears the range and sets the chunks in one
  transaction, so readers see all of a value or none of it.
* ``l<bucket:1><enc(key)>``: the record lock, ``token:8 expiry:8``. The expiry is a
  read version (they advance about 1,000,000 per second), so the cluster
  judges it, never a client's clock. Every locked write reads this key, so
  it is in the write's read-conflict range: a holder that lost the lock
  cannot commit (1020, then the retry sees the new token: refused).
* ``t``: a persistent database's transaction lock, the same format.
* ``s``: the sequence number, an 8-byte counter moved by atomic ADD (no
  read, so writers do not conflict on it).
* ``r<owner>``: this process's receipt, the id of its last write. A write
  that got 1021 commit_unknown_result reads it on the retry: if it holds
  this write's id, the write landed and is not repeated; if not, it did
  not, and the retry does it. No write is lost or done twice.
* ``o<owner>``: a volatile database's openers (TDB_CLEAR_IF_FIRST), each
  with an expiry read version that a thread of its process (or its opener
  keeper, ``keeper.py``) renews.
* ``w``: the read version of the last CLEAR_IF_FIRST wipe.
* ``n``, ``b``, ``x`` and the keys beside the databases (``<prefix>\0\0``):
  the node cache's, see ``ownership.py``. A record lock is refused while a
  node owns the record, and that node is asked to hand it back.
"""

from __future__ import annotations

import os
import secrets
import struct
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

from dbwrap_py.adapters.fdb import nodekeys
from dbwrap_py.adapters.fdb import ownership as nodes
from dbwrap_py.errors import (
    Corruption,
    DbwrapError,
    InvalidParameter,
    Timeout,
    Unavailable,
)
from dbwrap_py.nodecache.layout import bucket_of

CHUNK = 100_000
KEY_LIMIT = 10_000
#: FoundationDB's commit limit; what a transaction may write in all
TRANSACTION_LIMIT = 10_000_000
VERSIONS_PER_SECOND = 1_000_000
OPENER_TTL = 10.0
_LOCK = struct.Struct(">qq")  # token, expiry read version
_INDEX = struct.Struct(">I")
_ONE = (1).to_bytes(8, "little")

T = TypeVar("T")


def encode(key: bytes) -> bytes:
    """Prefix-free: NUL becomes NUL 0xff, and NUL NUL ends the key."""
    return key.replace(b"\0", b"\0\xff") + b"\0\0"


def decode(encoded: bytes) -> tuple[bytes, bytes]:
    """(key, the rest after its end marker)."""
    # an escaped NUL is NUL 0xff, the end marker NUL NUL
    i, out = 0, bytearray()
    while True:
        j = encoded.index(b"\0", i)
        out += encoded[i:j]
        if encoded[j + 1:j + 2] == b"\xff":
            out += b"\0"
            i = j + 2
        else:
            return bytes(out), encoded[j + 2:]


def bucket_byte(key: bytes) -> bytes:
    return bytes([bucket_of(key)])


def value_of(future: Any) -> bytes | None:
    """A ``tr.get`` result's bytes, or None for a missing key. (fdb's Value:
    ``wait()`` returns the Value itself, never None; ``present()`` tells.)"""
    value = future.wait()
    return bytes(value.value) if value.present() else None


def prefix_end(prefix: bytes) -> bytes:
    """The first key after every key starting with ``prefix``."""
    stripped = prefix.rstrip(b"\xff")
    return stripped[:-1] + bytes([stripped[-1] + 1])


def fdb_error_to_dbwrap(exc: Exception, what: str) -> DbwrapError:
    """FoundationDB's error codes as the typed errors smbd sees."""
    code = getattr(exc, "code", None)
    if code == 2101:
        return InvalidParameter(f"{what}: over FoundationDB's 10,000,000-byte transaction limit ({exc})")
    if code in (2102, 2103):
        return InvalidParameter(f"{what}: {exc} (FoundationDB: keys up to 10,000 bytes, values up to 100,000)")
    if code in (1031, 1020, 1007, 1037, 1213):
        return Timeout(f"{what}: {exc} (retries exhausted)")
    return Unavailable(f"{what}: FoundationDB error: {exc}")


class FdbStore:
    """One database in one process (see the module docstring)."""

    def __init__(self, fdb: ModuleType, database: Any, prefix: bytes, db_name: bytes,
                 volatile: bool, opener_ttl: float = OPENER_TTL) -> None:
        self.fdb = fdb
        self.db = database
        base = prefix + b"\0" + db_name + b"\0"
        self.base = base
        self.data = base + b"d"
        self.locks = base + b"l"
        self.txn_key = base + b"t"
        self.seq_key = base + b"s"
        self.openers = base + b"o"
        self.db_name = db_name
        self.nodes = nodekeys.NodeKeys(prefix, base)
        #: transactions run for callers (the node cache's tests count them);
        #: the opener key's renewals, from a thread of their own, are not
        self.round_trips = 0
        self.owner = secrets.token_bytes(16)  # this process's id for receipts and openers
        self.receipt = base + b"r" + self.owner
        self.wipe_key = base + b"w"
        self.volatile = volatile
        self.opener_ttl = opener_ttl
        self.wiped = False
        #: the read version of the last CLEAR_IF_FIRST wipe (the node cache voids tokens up to it)
        self.wipe_revision = 0
        self._joined = False
        #: record key (None: the transaction lock) -> (watches, seconds its holder has left)
        self._watches: dict[bytes | None, tuple[list[Any], float]] = {}
        self._renewer: threading.Thread | None = None
        self._closing = threading.Event()

    # -- the retry loop ----------------------------------------------------

    def run(self, what: str, body: Callable[[Any, bool], T], counted: bool = True) -> T:
        """``body(tr, after_unknown)`` in a transaction, committed, retried
        through ``on_error`` (which gives up per the retry limit and the
        timeout). ``after_unknown``: an earlier attempt got 1021, so it may
        have been applied. ``counted``: add it to round_trips."""
        self.round_trips += counted
        tr = self.db.create_transaction()
        after_unknown = False
        while True:
            try:
                result = body(tr, after_unknown)
                tr.commit().wait()
                return result
            except self.fdb.FDBError as exc:
                if exc.code == 1021:
                    after_unknown = True
                try:
                    tr.on_error(exc).wait()
                except self.fdb.FDBError as final:
                    raise fdb_error_to_dbwrap(final, what) from final

    # -- keys ---------------------------------------------------------------

    def record_range(self, key: bytes) -> tuple[bytes, bytes]:
        begin = self.data + bucket_byte(key) + encode(key)
        if len(begin) + _INDEX.size > KEY_LIMIT:
            raise InvalidParameter(f"key of {len(key)} bytes: FoundationDB keys are at most "
                                   f"{KEY_LIMIT} bytes with this adapter's {len(begin) - len(key)}-byte prefix")
        return begin, prefix_end(begin)

    def lock_key(self, key: bytes) -> bytes:
        return self.locks + bucket_byte(key) + encode(key)

    # -- records inside a transaction ---------------------------------------------

    def read_record(self, tr: Any, key: bytes, snapshot: bool = False) -> bytes | None:
        begin, end = self.record_range(key)
        reader = tr.snapshot if snapshot else tr
        chunks = [(bytes(kv.key), bytes(kv.value)) for kv in reader.get_range(begin, end)]
        if not chunks:
            return None
        for i, (k, _) in enumerate(chunks):
            if k[len(begin):] != _INDEX.pack(i):
                raise Corruption(f"record {key!r}: chunk {i} missing in FoundationDB")
        return b"".join(v for _, v in chunks)

    def write_record(self, tr: Any, key: bytes, value: bytes | None) -> None:
        begin, end = self.record_range(key)
        tr.clear_range(begin, end)
        if value is not None:
            for i, offset in enumerate(range(0, max(len(value), 1), CHUNK)):
                tr.set(begin + _INDEX.pack(i), value[offset:offset + CHUNK])
        tr.add(self.seq_key, _ONE)

    def _lock_state(self, tr: Any, key: bytes) -> tuple[int, int]:
        raw = value_of(tr.get(key))
        return _LOCK.unpack(raw) if raw is not None else (0, 0)

    def lock_expiry(self, tr: Any, key: bytes) -> int:
        """The read version at which ``key``'s record lock expires (0: none)."""
        return self._lock_state(tr, self.lock_key(key))[1]

    def bucket_locked(self, tr: Any, bucket: int, version: int) -> bool:
        """Does a process hold a record lock, live at ``version``, in ``bucket``?"""
        inside = self.locks + bytes([bucket])
        return any(_LOCK.unpack(bytes(kv.value))[1] > version
                   for kv in tr.get_range(inside, prefix_end(inside)))

    def landed(self, tr: Any, write_id: bytes) -> bool:
        """Did the write that ``sign``ed with ``write_id`` commit? (Asked after a 1021.)"""
        return value_of(tr.get(self.receipt)) == write_id

    def sign(self, tr: Any, write_id: bytes) -> None:
        """This process's receipt: ``write_id`` commits with the write, or not at all."""
        tr.set(self.receipt, write_id)

    # -- record locks (dbwrap_py.leased's primitives) ------------------------------

    def take_lease(self, key: bytes, token: int, seconds: float, read: bool) -> tuple[bool, bytes | None]:
        lock_key = self.lock_key(key)
        self.record_range(key)  # a too-long key fails here, before any lock

        def body(tr: Any, after_unknown: bool) -> tuple[bool, bytes | None]:
            version = tr.get_read_version().wait()
            holder, expiry = self._lock_state(tr, lock_key)
            blocker = None
            if holder != token and expiry > version:
                blocker = ([lock_key], expiry)
            elif not self.volatile:  # a transaction elsewhere excludes record lockers
                txn_holder, txn_expiry = self._lock_state(tr, self.txn_key)
                if txn_holder and txn_expiry > version:  # (our own transaction takes no record locks)
                    blocker = ([self.txn_key], txn_expiry)
            else:  # a node that owns the record (node cache) is asked to hand it back
                owner = nodekeys.holder(tr, self, key, version)
                if owner is not None:
                    nodekeys.ask(tr, self, key, owner.node, 0, version)
                    blocker = (owner.watch_keys, owner.expiry)
            if blocker is not None:
                # armed when this transaction commits: wakes the waiter on release
                self._watches[key] = ([tr.watch(k) for k in blocker[0]],
                                      (blocker[1] - version) / VERSIONS_PER_SECOND)
                return False, None
            if holder != token:  # a repeat after 1021 finds our token: taken already
                tr.set(lock_key, _LOCK.pack(token, version + int(seconds * VERSIONS_PER_SECOND)))
            return True, (self.read_record(tr, key) if read else None)

        self._drop_watch(key)
        return self.run("record lock", body)

    def renew_lease(self, key: bytes, token: int, seconds: float) -> bool:
        """Extend ``token``'s unexpired record lock to ``seconds`` from now."""
        lock_key = self.lock_key(key)

        def body(tr: Any, after_unknown: bool) -> bool:
            version = tr.get_read_version().wait()
            holder, expiry = self._lock_state(tr, lock_key)
            if holder != token or expiry <= version:
                return False
            tr.set(lock_key, _LOCK.pack(token, version + int(seconds * VERSIONS_PER_SECOND)))
            return True

        return self.run("record lock renewal", body)

    def wait_for_release(self, key: bytes | None, pause: float, deadline_left: float) -> None:
        """Wait on the watches set when the lock was refused: until the holder
        lets go, or its lease (in the cluster's versions) has run out."""
        entry = self._watches.pop(key, None)
        if entry is None:
            time.sleep(pause)
            return
        watches, holder_left = entry
        woken = threading.Event()
        for watch in watches:
            watch.on_ready(lambda _future: woken.set())
        woken.wait(max(0.0, min(holder_left + 0.005, deadline_left)))
        for watch in watches:
            if not watch.is_ready():
                watch.cancel()

    def _drop_watch(self, key: bytes | None) -> None:
        entry = self._watches.pop(key, None)
        if entry is not None:
            for watch in entry[0]:
                watch.cancel()

    def fenced_write(self, key: bytes, token: int, value: bytes | None, release: bool) -> bool:
        """Write (None: delete) while ``token`` holds the lock; ``release``
        also lets it go, in the same transaction."""
        lock_key = self.lock_key(key)
        write_id = secrets.token_bytes(16)

        def body(tr: Any, after_unknown: bool) -> bool:
            if after_unknown and self.landed(tr, write_id):
                return True  # the attempt that got 1021 landed
            version = tr.get_read_version().wait()
            holder, expiry = self._lock_state(tr, lock_key)  # read: a takeover conflicts with us
            if holder != token or expiry <= version:
                if release and holder == token:
                    tr.clear(lock_key)
                return False
            self.write_record(tr, key, value)
            self.sign(tr, write_id)
            if release:
                tr.clear(lock_key)
            return True

        return self.run("locked write", body)

    def release(self, key: bytes, token: int) -> bool:
        lock_key = self.lock_key(key)

        def body(tr: Any, after_unknown: bool) -> bool:
            holder, _ = self._lock_state(tr, lock_key)
            if holder == token:
                tr.clear(lock_key)
                return True
            return False  # taken over already, or our earlier attempt released it

        return self.run("record unlock", body)

    # -- unlocked reads -------------------------------------------------------------------

    def get(self, key: bytes) -> tuple[bytes | None, bool]:
        """The record, and whether a node owns it (then its copy is the newer)."""

        def body(tr: Any, _: bool) -> tuple[bytes | None, bool]:
            value = self.read_record(tr, key, snapshot=True)
            if not self.volatile:
                return value, False
            return value, nodekeys.holder(tr, self, key, tr.get_read_version().wait(), snapshot=True) is not None

        return self.run("read", body)

    def ownership(self, method: str, *args: Any) -> Any:
        """The node cache's operation ``method`` on this database (``ownership.NodeOps``)."""
        return getattr(nodes.NodeOps(self), method)(*args)

    def scan_page(self, after: bytes | None, limit: int) -> tuple[list[tuple[bytes, bytes]], bytes | None]:
        """Up to about ``limit`` records after the record ``after`` (None:
        from the start), whole, from one transaction; and where to go on
        from (None: done). Each page is a new transaction, so a long
        traverse never reaches the 5-second limit; like a tdb traverse it may
        then see writes made meanwhile, and still sees each record once."""
        start = self.data if after is None else prefix_end(self.data + bucket_byte(after) + encode(after))
        end = prefix_end(self.data)

        def body(tr: Any, _: bool) -> tuple[list[tuple[bytes, bytes]], bytes | None]:
            kvs = [(bytes(kv.key), bytes(kv.value))
                   for kv in tr.snapshot.get_range(start, end, limit=limit)]
            full = len(kvs) >= limit
            if full:  # the last record may go on past the limit: read the rest of it
                last_key, _ = decode(kvs[-1][0][len(self.data) + 1:])
                rest_begin = kvs[-1][0] + b"\0"
                kvs += [(bytes(kv.key), bytes(kv.value)) for kv in
                        tr.snapshot.get_range(rest_begin, self.record_range(last_key)[1])]
            records = self._assemble(kvs)
            return records, (records[-1][0] if full and records else None)

        return self.run("traverse", body)

    def _assemble(self, kvs: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """Records from their chunks' keys and values, in key order."""
        records: list[tuple[bytes, bytes]] = []
        parts: list[bytes] = []
        current: bytes | None = None
        for k, v in kvs:
            record, index = decode(k[len(self.data) + 1:])
            if record != current:
                if current is not None:
                    records.append((current, b"".join(parts)))
                current, parts = record, []
            if index != _INDEX.pack(len(parts)):
                raise Corruption(f"record {record!r}: chunk {len(parts)} missing in FoundationDB")
            parts.append(v)
        if current is not None:
            records.append((current, b"".join(parts)))
        return records

    def bucket_records(self, tr: Any, bucket: int) -> dict[bytes, bytes]:
        """Every record of a node-cache bucket (read: a write to one conflicts)."""
        begin = self.data + bytes([bucket])
        return dict(self._assemble([(bytes(kv.key), bytes(kv.value))
                                    for kv in tr.get_range(begin, prefix_end(begin))]))

    def seqnum(self) -> int:
        def body(tr: Any, _: bool) -> int:
            raw = value_of(tr.snapshot.get(self.seq_key))
            return int.from_bytes(raw, "little") if raw is not None else 0

        return self.run("seqnum", body)

    def wipe(self) -> None:
        def body(tr: Any, _: bool) -> None:
            tr.clear_range(self.data, prefix_end(self.data))
            tr.add(self.seq_key, _ONE)

        self.run("wipe", body)

    # -- persistent databases' transactions ----------------------------------------------

    def take_txn_lock(self, token: int, seconds: float, our_locks: set[int]) -> bool:
        """The transaction lock, if no other process holds it or a record lock."""

        def body(tr: Any, _: bool) -> bool:
            version = tr.get_read_version().wait()
            holder, expiry = self._lock_state(tr, self.txn_key)
            if holder not in (0, token) and expiry > version:
                self._watches[None] = ([tr.watch(self.txn_key)], (expiry - version) / VERSIONS_PER_SECOND)
                return False
            for kv in tr.get_range(self.locks, prefix_end(self.locks)):
                other, other_expiry = _LOCK.unpack(bytes(kv.value))
                if other not in our_locks and other_expiry > version:
                    left = (other_expiry - version) / VERSIONS_PER_SECOND
                    self._watches[None] = ([tr.watch(bytes(kv.key))], left)
                    return False
            tr.set(self.txn_key, _LOCK.pack(token, version + int(seconds * VERSIONS_PER_SECOND)))
            return True

        self._drop_watch(None)
        return self.run("transaction lock", body)

    def commit_txn(self, token: int, writes: dict[bytes, bytes | None]) -> bool:
        """Every buffered write and the release of the transaction lock, in
        one FoundationDB transaction, while ``token`` holds the lock."""
        size = sum(len(k) * 2 + len(v or b"") + 64 for k, v in writes.items())
        if size > TRANSACTION_LIMIT:
            self.release_txn_lock(token)
            raise InvalidParameter(
                f"the transaction writes about {size:,} bytes; FoundationDB commits at most "
                f"{TRANSACTION_LIMIT:,} bytes in one transaction: nothing was written")
        write_id = secrets.token_bytes(16)

        def body(tr: Any, after_unknown: bool) -> bool:
            if after_unknown and self.landed(tr, write_id):
                return True
            version = tr.get_read_version().wait()
            holder, expiry = self._lock_state(tr, self.txn_key)
            if holder != token or expiry <= version:
                return False
            for key, value in writes.items():
                self.write_record(tr, key, value)
            self.sign(tr, write_id)
            tr.clear(self.txn_key)
            return True

        try:
            return self.run("transaction commit", body)
        except DbwrapError:
            self.release_txn_lock(token)
            raise

    def release_txn_lock(self, token: int) -> None:
        def body(tr: Any, _: bool) -> None:
            holder, _expiry = self._lock_state(tr, self.txn_key)
            if holder == token:
                tr.clear(self.txn_key)

        self.run("transaction cancel", body)

    # -- TDB_CLEAR_IF_FIRST -----------------------------------------------------------------

    def join_openers(self) -> None:
        """Add this store's owner to the openers; wipe first if no live one is left.

        The openers are read as a snapshot: other processes join, renew and
        leave all the time (64 smbd children, each renewing its key every 3.3 s:
        a renewal every 50 ms per database), and a join that found a live opener
        has nothing to fear from them, so they must not void it. Far from the
        cluster (15 ms each way, four round trips) a join whose read conflicted
        with every one of them was retried until its 5 s timeout (1031). What it
        must lose to is a wipe committed meanwhile, and every wipe writes the
        wipe key, which it reads with a conflict (the revision it returns is
        then the current one). A wipe does conflict with every opener key: a
        join committed meanwhile voids it, and its retry sees that opener live."""

        def body(tr: Any, _: bool) -> tuple[bool, int]:
            version = tr.get_read_version().wait()
            everyone = (self.openers, prefix_end(self.openers))
            live = any(_LOCK.unpack(bytes(kv.value))[1] > version for kv in tr.snapshot.get_range(*everyone))
            if live:
                raw = value_of(tr.get(self.wipe_key))  # a wipe meanwhile conflicts with this join
                self._set_opener(tr, version)
                return False, int.from_bytes(raw, "big") if raw is not None else 0
            tr.add_read_conflict_range(*everyone)  # a join meanwhile conflicts with this wipe
            for sub in (self.data, self.locks, self.openers):
                tr.clear_range(sub, prefix_end(sub))
            nodekeys.wipe(tr, self)  # and the nodes' ownerships, which no opener holds
            self._set_opener(tr, version)
            tr.set(self.wipe_key, version.to_bytes(8, "big"))
            tr.add(self.seq_key, _ONE)
            return True, version

        self.wiped, self.wipe_revision = self.run("open (TDB_CLEAR_IF_FIRST)", body)
        self._joined = True

    def _set_opener(self, tr: Any, version: int) -> None:
        tr.set(self.openers + self.owner, _LOCK.pack(0, version + int(self.opener_ttl * VERSIONS_PER_SECOND)))

    def renew_opener(self) -> None:
        def body(tr: Any, _: bool) -> None:
            if value_of(tr.get(self.openers + self.owner)) is not None:  # not after close() cleared it
                self._set_opener(tr, tr.get_read_version().wait())

        self.run("opener renewal", body, counted=False)

    def keep_renewing(self) -> None:
        """Renew this process's opener key from a thread of its own while it lives."""
        self._renewer = threading.Thread(target=self._renew_opener, daemon=True, name="fdb-opener")
        self._renewer.start()

    def _renew_opener(self) -> None:
        pid = os.getpid()
        while not self._closing.wait(self.opener_ttl / 3) and os.getpid() == pid:
            try:
                self.renew_opener()
            except DbwrapError:
                pass  # tried again next time; the expiry has room for two misses

    def close(self) -> None:
        self._closing.set()
        for key in list(self._watches):
            self._drop_watch(key)

        def body(tr: Any, _: bool) -> None:
            tr.clear(self.receipt)  # no write of ours is in doubt any more
            if self._joined:
                tr.clear(self.openers + self.owner)

        try:
            self.run("close", body)
        except DbwrapError:
            pass  # the opener expires; a receipt of a dead process stays (16 bytes)
