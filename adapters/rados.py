"""rados: Samba's databases as omaps of objects in a Ceph pool.

Layout, for database ``<db>`` = ``DatabaseSpec.cluster_name`` and option
``prefix`` (default ``dbwrap_py``):

    <prefix>/<db>        the database's meta object: its version is the
                         seqnum; openers of a volatile database watch it
    <prefix>/<db>/<i>    the records, spread over ``objects`` objects by a
                         hash of the key (the seed talk's omap ratio); a
                         persistent database has one, so a transaction's
                         commit is one atomic write op

In a record object, omap key ``k<key>`` is a record and ``w<key>`` says
that a process waits for the record's lock (``<key>``: the Samba key,
percent-encoded, see _rados_client). The lock on a record is cls_lock
``r<digest of the key>`` on its object; ``t`` is a persistent database's transaction lock.

Record locks (dbwrap_py.leased builds lock, put, unlock on these):

* take: cls_lock ``lock`` with a duration, a write op; with a read, the
  record's read op is sent at once behind it with ORDER_READS_WRITES, so the
  pair costs one round trip. The OSD judges the lock's expiry on its clock.
* every locked write is one op: cls_lock ``assert_locked`` first, so a holder
  whose lock expired, or was taken over, writes nothing;
* write+unlock is one op: assert, the write, and the lock's xattr removed;
  a guard (omap_cmp ``w<key>`` == "") fails it if somebody waits, and then it
  is sent again clearing the flag, and the object is notified.
* A waiter watches the object, sets ``w<key>``, tries once more, and then
  sleeps until a notify, or at most ``max_wait_poll`` seconds: a holder that
  died sends no notify, and its lock ends when the OSD says so.

TDB_CLEAR_IF_FIRST: an opener takes cls_lock ``open`` on the meta object,
notifies it, and wipes the database if no other opener's watch answers;
then it watches the meta object itself. A killed opener's watch lingers
until the OSD times it out (osd_client_watch_timeout, 30 s by default).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import secrets
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager

import rados

from dbwrap_py.adapter import TDB_SEQNUM, Capabilities, DatabaseSpec
from dbwrap_py.adapters import _rados_client as rc
from dbwrap_py.errors import ConfigError, FencedOut, LockConflict, Timeout
from dbwrap_py.leased import KEEP, LEASE_OPTIONS, Keep, LeasedAdapter, LeaseSource
from dbwrap_py.options import Options

DEFAULT_OBJECTS = 8
DEFAULT_LEASE = 10.0
#: what one omap value may hold here (a 4 MiB value round-trips; the OSD's
#: osd_max_write_size is far above)
MAX_VALUE_SIZE = 4 * 1024 * 1024
#: the longest a waiter sleeps between tries without a notify
MAX_WAIT_POLL = 0.2
#: how long an opener waits for other openers' watches to answer
OPENER_PING_MS = 500
_REFUSED = (errno.EBUSY, errno.ENOENT)


@dataclasses.dataclass
class _Counters:
    ops: int = 0  # write and read ops sent
    round_trips: int = 0  # waits for the cluster (pipelined ops count once)


def _value(found: dict[str, bytes | None], name: str) -> bytes | None:
    """The binding reads an empty omap value as None."""
    if name not in found:
        return None
    return found[name] or b""


class _Waits:
    """Watches on record objects, and the wake-ups their notifies bring."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.generation: dict[str, int] = {}  # oid -> notifies seen
        self.watches: dict[str, object] = {}
        self.seen: dict[bytes, int] = {}  # key -> the oid's generation when we flagged it

    def on_notify(self, oid: str) -> None:
        with self.cond:
            self.generation[oid] = self.generation.get(oid, 0) + 1
            self.cond.notify_all()

    def wait(self, oid: str, seen: int, seconds: float) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.generation.get(oid, 0) != seen, timeout=seconds)


class RadosAdapter(LeasedAdapter):
    capabilities = Capabilities(
        transactions=True, lock_release_seconds=DEFAULT_LEASE, max_value_size=MAX_VALUE_SIZE,
        notes=("a persistent database is one object: its transaction commits in one write op",
               "record locks in a persistent database do not wait for another process's transaction"))
    option_names = (*LEASE_OPTIONS, "conf", "mon_host", "pool", "objects", "prefix", "user", "keyring")
    default_lease = DEFAULT_LEASE
    lease_source = LeaseSource.STORE_CLOCK

    def __init__(self, spec: DatabaseSpec, options: Options) -> None:
        super().__init__(spec, options)
        self.config = rc.ClientConfig.from_options(options, self.op_timeout)
        prefix = options.get_str("prefix", "dbwrap_py").strip("/")
        if not prefix:
            raise ConfigError("option prefix must not be empty")
        objects = options.get_int("objects", DEFAULT_OBJECTS, minimum=1)
        self.objects = 1 if spec.persistent else objects
        self.meta_oid = f"{prefix}/{spec.cluster_name}"
        self.counters = _Counters()
        self._bump_seqnum = spec.persistent is False and bool(spec.tdb_flags & TDB_SEQNUM)
        self._waits = _Waits()
        self._flagged: set[bytes] = set()  # keys whose wait flag we set since the last wake
        self._pending: set[object] = set()  # notifies in flight
        self._txn: dict[bytes, bytes | None] | None = None
        self._txn_cookie = ""
        self._opener_watch: object | None = None
        if not spec.persistent:
            self._open_volatile()

    # -- where things are ---------------------------------------------------------

    @property
    def io(self) -> rados.Ioctx:
        return rc.CLIENTS.ioctx(self.config)

    def oid_of(self, key: bytes) -> str:
        shard = zlib.crc32(key) % self.objects if self.objects > 1 else 0
        return f"{self.meta_oid}/{shard}"

    def all_oids(self) -> list[str]:
        return [f"{self.meta_oid}/{i}" for i in range(self.objects)]

    @property
    def round_trips(self) -> int:
        return self.counters.round_trips

    # -- ops ------------------------------------------------------------------------

    def _write(self, oid: str, build: Callable[[rados.WriteOp], object], what: str,
               records: bool = False) -> int:
        """Send one write op; 0, or the negative errno the OSD refused it with.
        ``records``: it changes records, so the seqnum moves too."""
        with rados.WriteOpCtx() as op:
            build(op)
            return self._send(op, oid, what, records and self._bump_seqnum)

    def _send(self, op: rados.WriteOp, oid: str, what: str, bump_seqnum: bool) -> int:
        self.counters.ops += 1
        self.counters.round_trips += 1
        io = self.io  # connecting fails here, apart from the op's own refusals
        bump = self._seqnum_bump() if bump_seqnum else None
        try:
            io.operate_write_op(op, oid)
        except rados.Error as exc:
            code = getattr(exc, "errno", None)
            if code in (*_REFUSED, rc.ECANCELED):
                return -code
            raise rc.mapped(exc, what) from exc
        finally:
            if bump is not None:
                bump.wait_for_complete()
        return 0

    def _seqnum_bump(self) -> object:
        """An op on the meta object, sent beside a record write: its version moves."""
        self.counters.ops += 1
        with rados.WriteOpCtx() as op:
            op.set_xattr("s", b"")
            return self.io.operate_aio_write_op(op, self.meta_oid)

    def _read(self, oid: str, keys: list[str]) -> dict[str, bytes]:
        self.counters.ops += 1
        self.counters.round_trips += 1
        with rados.ReadOpCtx() as op:
            values, _ = self.io.get_omap_vals_by_keys(op, keys)
            try:
                self.io.operate_read_op(op, oid)
            except rados.ObjectNotFound:
                return {}
            except rados.Error as exc:
                raise rc.mapped(exc, "read") from exc
            return dict(values)

    # -- the lease primitives (dbwrap_py.leased) -------------------------------------

    def take_lease(self, key: bytes, token: int, seconds: float, read: bool) -> tuple[bool, bytes | None]:
        if self._txn is not None:
            return True, self._txn_get(key)
        oid, name = self.oid_of(key), rc.encode_key(key)
        with rados.WriteOpCtx() as lock, rados.ReadOpCtx() as reader:
            lock.execute("lock", "lock", rc.lock_op(rc.lock_name(key), f"{token:x}", seconds))
            values, _ = self.io.get_omap_vals_by_keys(reader, ["k" + name])
            self.counters.ops += 2 if read else 1
            self.counters.round_trips += 1
            with rc.translated("lock"):
                locked = self.io.operate_aio_write_op(lock, oid)
                fetched = self.io.operate_aio_read_op(
                    reader, oid, flag=rados.LIBRADOS_OPERATION_ORDER_READS_WRITES) if read else None
                locked.wait_for_complete()
                if fetched is not None:
                    fetched.wait_for_complete()
            result = locked.get_return_value()
            if result in (-errno.EBUSY, -errno.EEXIST):
                return False, None
            if result < 0:
                raise rc.failed(result, "lock")
            if fetched is not None and fetched.get_return_value() < 0:
                self.end_lease(key, token)
                raise rc.failed(fetched.get_return_value(), "lock and read")
            self._flagged.discard(key)
            return True, (_value(dict(values), "k" + name) if read else None)

    def fenced_write(self, key: bytes, token: int, value: bytes | None) -> bool:
        if self._txn is not None:
            self._txn[key] = value
            return True
        name = rc.encode_key(key)

        def build(op: rados.WriteOp) -> None:
            op.execute("lock", "assert_locked", rc.assert_op(rc.lock_name(key), f"{token:x}"))
            self._record_write(op, name, value)

        return self._write(self.oid_of(key), build, "locked write", records=True) == 0

    def end_lease(self, key: bytes, token: int, value: bytes | None | Keep = KEEP) -> bool:
        if self._txn is not None:
            if value is not KEEP:
                self._txn[key] = value
            return True
        oid, name = self.oid_of(key), rc.encode_key(key)

        def build(op: rados.WriteOp, waiters: bool) -> None:
            op.execute("lock", "assert_locked", rc.assert_op(rc.lock_name(key), f"{token:x}"))
            if waiters:
                self.io.remove_omap_keys(op, ["w" + name])
            else:
                op.omap_cmp("w" + name, "", rados.LIBRADOS_CMPXATTR_OP_EQ)
            if value is not KEEP:
                self._record_write(op, name, value)
            op.rm_xattr(rc.lock_xattr(rc.lock_name(key)))

        writes = value is not KEEP
        result = self._write(oid, lambda op: build(op, False), "write and unlock", writes)
        if result == -rc.ECANCELED:  # somebody waits: clear the flag, then wake them
            result = self._write(oid, lambda op: build(op, True), "write and unlock", writes)
            if result == 0:
                self._notify(oid, name)
        return result == 0

    def _record_write(self, op: rados.WriteOp, name: str, value: bytes | None) -> None:
        if value is None:
            self.io.remove_omap_keys(op, ["k" + name])
        else:
            self.io.set_omap(op, ["k" + name], [value])

    # -- waiting for a lock ------------------------------------------------------------

    def wait_for_release(self, key: bytes, pause: float) -> None:
        """Watch the record's object, flag that we wait and try again at once;
        once flagged, sleep until a notify (or MAX_WAIT_POLL)."""
        oid = self.oid_of(key)
        self._watch(oid)
        if key not in self._flagged:
            name = rc.encode_key(key)
            self._waits.seen[key] = self._waits.generation.get(oid, 0)  # before the retry
            self._write(oid, lambda op: self.io.set_omap(op, ["w" + name], [b"1"]), "flag a waiter")
            self._flagged.add(key)
            return
        self._waits.wait(oid, self._waits.seen.get(key, 0), min(max(pause, 0.01), MAX_WAIT_POLL))
        self._flagged.discard(key)  # a wake-up cleared the flag; a timeout may have too

    def _watch(self, oid: str) -> None:
        if oid in self._waits.watches:
            return
        with rc.translated("watch"):
            self._waits.watches[oid] = self.io.watch(
                oid, lambda *args, oid=oid: self._waits.on_notify(oid), timeout=30)

    def _notify(self, oid: str, name: str) -> None:
        """Wake the object's watchers; nobody waits for their answers."""
        self.counters.ops += 1

        def done(completion: object, *_: object) -> None:
            self._pending.discard(completion)

        with rc.translated("notify"):
            self._pending.add(self.io.aio_notify(oid, done, msg=name, timeout_ms=5000))

    # -- reads and the rest ---------------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        if self._txn is not None:
            return self._txn_get(key)
        name = "k" + rc.encode_key(key)
        return _value(self._read(self.oid_of(key), [name]), name)

    def scan(self) -> Iterator[tuple[bytes, bytes]]:
        if self._txn is not None:
            records = {k: v for k, v in self._scan_stored()}
            records.update(self._txn)
            return iter([(k, v) for k, v in records.items() if v is not None])
        return self._scan_stored()

    def _scan_stored(self) -> Iterator[tuple[bytes, bytes]]:
        """Every object's records, a page (the OSD's cap: 1024) at a time."""
        for oid in self.all_oids():
            after = ""
            while True:
                page = self._page(oid, after)
                for name, value in page:
                    yield rc.decode_key(name[1:]), value or b""
                if len(page) < rc.OMAP_PAGE:
                    break
                after = page[-1][0]

    def _page(self, oid: str, after: str) -> list[tuple[str, bytes]]:
        self.counters.ops += 1
        self.counters.round_trips += 1
        with rados.ReadOpCtx() as op:
            values, _ = self.io.get_omap_vals(op, after, "k", rc.OMAP_PAGE)
            try:
                self.io.operate_read_op(op, oid)
            except rados.ObjectNotFound:
                return []
            except rados.Error as exc:
                raise rc.mapped(exc, "traverse") from exc
            return list(values)

    def wipe(self) -> None:
        for oid in self.all_oids():  # records only: a held lock stays held
            self._write(oid, lambda op: (op.new(rados.LIBRADOS_CREATE_IDEMPOTENT),
                                         self.io.remove_omap_range2(op, "k", "l")), "wipe", True)

    def seqnum(self) -> int:
        oid = self.all_oids()[0] if self.spec.persistent else self.meta_oid
        self.counters.ops += 1
        self.counters.round_trips += 1
        try:
            self.io.stat(oid)
        except rados.ObjectNotFound:
            return 0
        except rados.Error as exc:
            raise rc.mapped(exc, "seqnum") from exc
        return self.io.get_last_version()

    # -- transactions (persistent databases: one object) -------------------------------------

    def transaction_start(self, nonblock: bool = False) -> None:
        oid = self.all_oids()[0]
        cookie = f"{secrets.randbits(63):x}"
        deadline = time.monotonic() + self.op_timeout
        while True:
            result = self._write(oid, lambda op: op.execute(
                "lock", "lock", rc.lock_op("t", cookie, self.lease_seconds)), "transaction lock")
            if result == 0:
                break
            if nonblock:
                raise LockConflict("another process holds the transaction lock")
            if time.monotonic() >= deadline:
                raise Timeout(f"transaction lock not free within {self.op_timeout:g} s")
            time.sleep(0.01)
        self._txn, self._txn_cookie = {}, cookie

    def _txn_get(self, key: bytes) -> bytes | None:
        assert self._txn is not None
        if key in self._txn:
            return self._txn[key]
        name = "k" + rc.encode_key(key)
        return _value(self._read(self.oid_of(key), [name]), name)

    def transaction_commit(self) -> None:
        writes, cookie = self._end_transaction()
        puts = [(f"k{rc.encode_key(k)}", v) for k, v in writes.items() if v is not None]
        deletes = [f"k{rc.encode_key(k)}" for k, v in writes.items() if v is None]

        def build(op: rados.WriteOp) -> None:
            op.execute("lock", "assert_locked", rc.assert_op("t", cookie))
            if puts:
                self.io.set_omap(op, [k for k, _ in puts], [v for _, v in puts])
            if deletes:
                self.io.remove_omap_keys(op, deletes)
            op.rm_xattr(rc.lock_xattr("t"))

        if self._write(self.all_oids()[0], build, "commit") != 0:
            raise FencedOut("the transaction lock expired before the commit; nothing was written")

    def transaction_cancel(self) -> None:
        _, cookie = self._end_transaction()
        self._write(self.all_oids()[0], lambda op: (
            op.execute("lock", "assert_locked", rc.assert_op("t", cookie)),
            op.rm_xattr(rc.lock_xattr("t"))), "cancel")

    def _end_transaction(self) -> tuple[dict[bytes, bytes | None], str]:
        if self._txn is None:
            raise LockConflict("no transaction")
        writes, self._txn = self._txn, None
        return writes, self._txn_cookie

    # -- opening a volatile database --------------------------------------------------------

    def _open_volatile(self) -> None:
        """Wipe if nobody else has it open (TDB_CLEAR_IF_FIRST), then join the openers."""
        cookie = f"{secrets.randbits(63):x}"
        deadline = time.monotonic() + self.op_timeout
        while self._write(self.meta_oid, lambda op: op.execute(
                "lock", "lock", rc.lock_op("open", cookie, self.op_timeout)), "open") != 0:
            if time.monotonic() >= deadline:
                raise Timeout(f"{self.meta_oid}: another opener held the open lock past op_timeout")
            time.sleep(0.02)
        try:
            if self.spec.tdb_flags & 1 and not self._others_have_it_open():  # TDB_CLEAR_IF_FIRST
                self.wipe()
            with rc.translated("watch"):
                self._opener_watch = self.io.watch(self.meta_oid, lambda *args: b"open", timeout=30)
        finally:
            self._write(self.meta_oid, lambda op: (
                op.execute("lock", "assert_locked", rc.assert_op("open", cookie)),
                op.rm_xattr(rc.lock_xattr("open"))), "open")

    def _others_have_it_open(self) -> bool:
        """Notify the meta object: any answer, or a watcher that did not
        answer in time (it may be alive, or a dead opener's watch the OSD has
        not yet timed out), means another opener."""
        self.counters.ops += 1
        self.counters.round_trips += 1
        answers: list[tuple[int, list | None]] = []
        done = threading.Event()

        def finished(completion: object, result: int, acks: list | None, timeouts: list | None) -> None:
            answers.append((result, acks))
            done.set()

        with rc.translated("find other openers"):
            completion = self.io.aio_notify(self.meta_oid, finished, msg="opener?", timeout_ms=OPENER_PING_MS)
        # Seen here: a notify whose completion never came, with other clients
        # busy on the object. No answer is taken as "maybe", which keeps the
        # records: a wipe is only for a database that is surely unused.
        if not done.wait(2 * OPENER_PING_MS / 1000):
            return True
        del completion  # kept until it completed
        result, acks = answers[0]
        return result < 0 or bool(acks)

    # -- processes ---------------------------------------------------------------------------

    def after_fork(self) -> None:
        super().after_fork()
        self._txn = None
        # The parent's watches and notifies live in its client: dropping them
        # here would unwatch through it and hang, so they are kept, untouched.
        rc.CLIENTS.inherited.append((self._waits, self._pending, self._opener_watch))
        self._waits = _Waits()
        self._flagged = set()
        self._pending = set()
        self._opener_watch = None

    def close(self) -> None:
        watches = [*self._waits.watches.values(), self._opener_watch]
        if rc.CLIENTS.pid != os.getpid():
            return  # an inherited client's watches are not ours to touch
        for watch in watches:
            if watch is not None:
                try:
                    watch.close()
                except rados.Error:
                    pass  # the cluster drops a dead watch itself
        self._waits.watches.clear()
        self._opener_watch = None

    @classmethod
    def store_counters(cls, options: Mapping[str, str]) -> dict[str, int]:
        """Ops the OSDs have served (their perf counters), summed over the OSDs:
        op_r reads, op_w writes, op_rw read-modify-writes (a cls call that writes)."""
        client = rc.ClientConfig.from_options(options, 10.0).connect()
        totals = {"osd_op_r": 0, "osd_op_w": 0, "osd_op_rw": 0}
        try:
            _, out, _ = client.mon_command(json.dumps({"prefix": "osd ls", "format": "json"}), b"")
            for osd in json.loads(out):
                _, out, _ = client.osd_command(osd, json.dumps({"prefix": "perf dump"}), b"")
                perf = json.loads(out)["osd"]
                for name in totals:
                    totals[name] += int(perf[name[4:]])
        finally:
            client.shutdown()
        return totals

    @classmethod
    def throwaway_server(cls, options: Mapping[str, str]) -> AbstractContextManager[dict[str, str]] | None:
        """A one-OSD memstore cluster, when the options name none."""
        if options.get("conf") or options.get("mon_host"):
            return None
        from dbwrap_py.adapters._rados_server import throwaway_cluster

        return throwaway_cluster()


ADAPTER = RadosAdapter
