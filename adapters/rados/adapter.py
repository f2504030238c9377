"""rados: Samba's databases as omaps of objects in a Ceph pool.

Layout, for database ``<db>`` = ``DatabaseSpec.cluster_name`` and option
``prefix`` (default ``dbwrap_py``):

    <prefix>/<db>        the database's meta object: its version is the
                         seqnum; openers of a volatile database watch it
    <prefix>/<db>/<i>    the records, spread over ``objects`` objects by
                         the key's bucket, a hash (the seed talk's omap
                         ratio; at most 256, the buckets); a persistent
                         database has one, so a transaction's commit is one
                         atomic write op

In a record object, omap key ``k<key>`` is a record and ``w<key>`` says
that a process waits for the record's lock (``<key>``: the Samba key,
percent-encoded, see client.py). The lock on a record is cls_lock
``r<bucket><digest of the key>`` on its object; ``t`` is a persistent
database's transaction lock. The meta object's xattrs: ``n``, the number of
objects (the first opener's choice stands), and ``e``, the epoch (wipes so far).

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

Node cache (``node_cache = yes``, volatile databases): ``ownership.py``
is this adapter's side of the protocol, with its entries in the record
objects. A record lock here is refused while a live node owns the record
(guards in the lock op), and that node is asked to hand it over.
"""

from __future__ import annotations

import errno
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator

import rados

from dbwrap_py.adapter import TDB_SEQNUM, Capabilities, DatabaseSpec
from dbwrap_py.adapters.rados import client as rc
from dbwrap_py.adapters.rados import nodestore
from dbwrap_py.adapters.rados import ownership as owning
from dbwrap_py.errors import ConfigError, Timeout
from dbwrap_py.leased import KEEP, LEASE_OPTIONS, PREFIX, Keep, LeaseSource
from dbwrap_py.nodecache.layout import BUCKETS
from dbwrap_py.options import Option, Options
from dbwrap_py.retry import Backoff, retry_until
from dbwrap_py.transactions import TransactionalLeasedAdapter, Writes

DEFAULT_OBJECTS = 8
DEFAULT_LEASE = 10.0
#: what one omap value may hold here (a 4 MiB value round-trips; the OSD's
#: osd_max_write_size is far above)
MAX_VALUE_SIZE = 4 * 1024 * 1024
#: the longest a waiter sleeps between tries without a notify
MAX_WAIT_POLL = 0.2
#: a persistent database's transaction lock (cls_lock on its one object)
TRANSACTION_LOCK = "t"
#: how long an opener waits for other openers' watches to answer
OPENER_PING_MS = 500


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


class RadosAdapter(TransactionalLeasedAdapter):
    capabilities = Capabilities(
        transactions=True, lock_release_seconds=DEFAULT_LEASE, max_value_size=MAX_VALUE_SIZE,
        notes=("a persistent database is one object: its transaction commits in one write op",
               "in a persistent database a record lock waits for another process's transaction; "
               "a transaction does not wait for record locks taken before it started"))
    options_schema = (*LEASE_OPTIONS, *rc.CLIENT_OPTIONS, PREFIX,
                      Option("objects", int, DEFAULT_OBJECTS, minimum=1,
                             help="objects a volatile database spreads over"))
    default_lease = DEFAULT_LEASE
    lease_source = LeaseSource.STORE_CLOCK
    #: a notify wakes a waiter; a dead holder sends none, so it polls
    lock_wait = Backoff(first=0.01, cap=MAX_WAIT_POLL)

    def __init__(self, spec: DatabaseSpec, options: Options) -> None:
        super().__init__(spec, options)
        self.config = rc.ClientConfig.from_options(options, self.op_timeout)
        prefix = options.value("prefix").strip("/")
        if not prefix:
            raise ConfigError("option prefix must not be empty")
        objects = options.value("objects")
        if objects > BUCKETS:
            raise ConfigError(f"objects = {objects}: at most {BUCKETS}, the buckets records are placed by")
        self.objects = 1 if spec.persistent else objects
        self.prefix = prefix
        self.meta_oid = f"{prefix}/{spec.cluster_name}"
        self.node_cache_id = spec.cluster_name.encode()
        self.epoch = 0  # CLEAR_IF_FIRST wipes so far: ownership tokens of earlier ones are void
        self.ops = rc.Ops(self.config)
        self._bump_seqnum = spec.persistent is False and bool(spec.tdb_flags & TDB_SEQNUM)
        self._waits = _Waits()
        self._flagged: set[bytes] = set()  # keys whose wait flag we set since the last wake
        self._opener_watch: object | None = None
        if not spec.persistent:
            self._open_volatile()

    # -- where things are ---------------------------------------------------------

    @property
    def io(self) -> rados.Ioctx:
        return self.ops.io

    def oid_of(self, key: bytes) -> str:
        return rc.record_oid(self.meta_oid, self.objects, key)

    def all_oids(self) -> list[str]:
        return [f"{self.meta_oid}/{i}" for i in range(self.objects)]

    @property
    def round_trips(self) -> int:
        return self.ops.round_trips

    # -- ops ------------------------------------------------------------------------

    def _write(self, oid: str, build: Callable[[rados.WriteOp], object], what: str,
               records: bool = False) -> int:
        """Send one write op; 0, or the negative errno the OSD refused it with.
        ``records``: it changes records, so the seqnum moves too."""
        bump = self._seqnum_bump() if records and self._bump_seqnum else None
        try:
            return self.ops.write(oid, build, what)
        finally:
            if bump is not None:
                bump.wait_for_complete()

    def _seqnum_bump(self) -> object:
        """An op on the meta object, sent beside a record write: its version moves."""
        self.ops.ops += 1
        with rados.WriteOpCtx() as op:
            op.set_xattr("s", b"")
            with rc.translated("seqnum"):
                return self.io.operate_aio_write_op(op, self.meta_oid)

    # -- the lease primitives (dbwrap_py.leased) -------------------------------------

    def take_lease(self, key: bytes, token: int, seconds: float, read: bool) -> tuple[bool, bytes | None]:
        names, oid = owning.Names.of(key), self.oid_of(key)
        found: dict[str, bytes] = {}
        for _ in range(3):  # else the caller waits, and tries again
            def build(op: rados.WriteOp) -> None:
                op.execute("lock", "lock", rc.lock_op(rc.lock_name(key), f"{token:x}", seconds))
                if self.spec.persistent:  # no transaction runs: its lock, taken and dropped in the op
                    op.execute("lock", "lock", rc.lock_op(TRANSACTION_LOCK, f"{token:x}", 1.0))
                    op.rm_xattr(rc.lock_xattr(TRANSACTION_LOCK))
                else:  # no node owns it (the node cache), nor its bucket
                    owning.guard_free(op, names, found)

            wanted = ([names.record] if read else []) if self.spec.persistent else names.all()
            result, found = self.ops.write_read(oid, build, wanted, "lock")
            if result in (-errno.EBUSY, -errno.EEXIST):
                return False, None
            if result == 0:
                self._flagged.discard(key)
                return True, (found.get(names.record) if read else None)
            held = owning.Holding.read(names, found)
            if held.entry:
                owner = self.ownership().settle(key, held)
                if owner is not None:  # a live node: ask it, and wait as for a lock
                    self.ownership().request_release(key, owner, 0)
                    return False, None
            # free (a dead node's hold removed, or the key detached from a
            # claim): again, guarded on what was read
        return False, None

    def renew_lease(self, key: bytes, token: int, seconds: float) -> bool:
        def build(op: rados.WriteOp) -> None:  # the OSD refuses it (ENOENT) once the lock is gone
            op.execute("lock", "lock", rc.lock_op(rc.lock_name(key), f"{token:x}", seconds,
                                                  rc.LOCK_MUST_RENEW))

        return self._write(self.oid_of(key), build, "lock renewal") == 0

    def fenced_write(self, key: bytes, token: int, value: bytes | None) -> bool:
        name = rc.encode_key(key)

        def build(op: rados.WriteOp) -> None:
            op.execute("lock", "assert_locked", rc.assert_op(rc.lock_name(key), f"{token:x}"))
            self._record_write(op, name, value)

        return self._write(self.oid_of(key), build, "locked write", records=True) == 0

    def end_lease(self, key: bytes, token: int, value: bytes | None | Keep = KEEP) -> bool:
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
        once flagged, sleep until a notify or for ``pause`` (``lock_wait``)."""
        oid = self.oid_of(key)
        self._watch(oid)
        if key not in self._flagged:
            name = rc.encode_key(key)
            self._waits.seen[key] = self._waits.generation.get(oid, 0)  # before the retry
            self._write(oid, lambda op: self.io.set_omap(op, ["w" + name], [b"1"]), "flag a waiter")
            self._flagged.add(key)
            return
        self._waits.wait(oid, self._waits.seen.get(key, 0), pause)
        self._flagged.discard(key)  # a wake-up cleared the flag; a timeout may have too

    def _watch(self, oid: str) -> None:
        if oid in self._waits.watches:
            return
        with rc.translated("watch"):
            self._waits.watches[oid] = self.io.watch(
                oid, lambda *args, oid=oid: self._waits.on_notify(oid), timeout=30)

    def _notify(self, oid: str, name: str) -> None:
        """Wake the object's watchers; nobody waits for their answers."""
        self.ops.notify(oid, name, "notify")

    # -- reads and the rest ---------------------------------------------------------------

    def read_record(self, key: bytes) -> bytes | None:
        names = owning.Names.of(key)
        found = self.ops.read(self.oid_of(key), names.all() if not self.spec.persistent else [names.record])
        if owning.Holding.read(names, found).entry:
            return self.read_from_its_node(key)
        return found.get(names.record)

    def scan_records(self) -> Iterator[tuple[bytes, bytes]]:
        """Every object's records, a page (the OSD's cap: 1024) at a time."""
        for oid in self.all_oids():
            after = ""
            while True:
                page, _ = self.ops.page(oid, after, "k", "traverse")
                for name, value in page:
                    yield rc.decode_key(name[1:]), value or b""
                if len(page) < rc.OMAP_PAGE:
                    break
                after = page[-1][0]

    def wipe_records(self) -> None:
        """Every record, and every node's ownership of one (the node cache:
        its copies are void by the epoch); a process's held lock stays held."""
        for oid in self.all_oids():
            self._write(oid, lambda op: (op.new(rados.LIBRADOS_CREATE_IDEMPOTENT),
                                         self.io.clear_omap(op)), "wipe", True)

    def seqnum(self) -> int:
        oid = self.all_oids()[0] if self.spec.persistent else self.meta_oid
        self.ops.ops += 1
        self.ops.round_trips += 1
        try:
            self.io.stat(oid)
        except rados.ObjectNotFound:
            return 0
        except rados.Error as exc:
            raise rc.mapped(exc, "seqnum") from exc
        return self.io.get_last_version()

    # -- transactions (persistent databases: one object) -------------------------------------

    def take_transaction_lock(self, token: int, seconds: float) -> bool:
        return self._write(self.all_oids()[0], lambda op: op.execute(
            "lock", "lock", rc.lock_op(TRANSACTION_LOCK, f"{token:x}", seconds)), "transaction lock") == 0

    def commit_transaction(self, token: int, writes: Writes) -> bool:
        puts = [(f"k{rc.encode_key(k)}", v) for k, v in writes.items() if v is not None]
        deletes = [f"k{rc.encode_key(k)}" for k, v in writes.items() if v is None]

        def build(op: rados.WriteOp) -> None:
            op.execute("lock", "assert_locked", rc.assert_op(TRANSACTION_LOCK, f"{token:x}"))
            if puts:
                self.io.set_omap(op, [k for k, _ in puts], [v for _, v in puts])
            if deletes:
                self.io.remove_omap_keys(op, deletes)
            op.rm_xattr(rc.lock_xattr(TRANSACTION_LOCK))

        return self._write(self.all_oids()[0], build, "commit") == 0

    def release_transaction_lock(self, token: int) -> None:
        self._write(self.all_oids()[0], lambda op: (
            op.execute("lock", "assert_locked", rc.assert_op(TRANSACTION_LOCK, f"{token:x}")),
            op.rm_xattr(rc.lock_xattr(TRANSACTION_LOCK))), "cancel")

    # -- opening a volatile database --------------------------------------------------------

    def _open_volatile(self) -> None:
        """Wipe if nobody else has it open (TDB_CLEAR_IF_FIRST), then join the openers."""
        cookie = f"{secrets.randbits(63):x}"
        self._take_open_lock(cookie)
        try:
            self._read_meta()
            if self.spec.tdb_flags & 1 and not self._others_have_it_open():  # TDB_CLEAR_IF_FIRST
                self.wipe()
                self.epoch += 1
                self._write(self.meta_oid, lambda op: op.set_xattr("e", b"%d" % self.epoch), "open")
            with rc.translated("watch"):
                self._opener_watch = self.io.watch(self.meta_oid, lambda *args: b"open", timeout=30)
        finally:
            self._write(self.meta_oid, lambda op: (
                op.execute("lock", "assert_locked", rc.assert_op("open", cookie)),
                op.rm_xattr(rc.lock_xattr("open"))), "open")

    def _take_open_lock(self, cookie: str) -> None:
        """cls_lock ``open`` on the meta object, tried again until op_timeout."""
        for _ in retry_until(time.monotonic() + self.op_timeout):
            if self._write(self.meta_oid, lambda op: op.execute(
                    "lock", "lock", rc.lock_op("open", cookie, self.op_timeout)), "open") == 0:
                return
        raise Timeout(f"{self.meta_oid}: another opener held the open lock past op_timeout")

    def _read_meta(self) -> None:
        """The number of objects the database has (the first opener's
        choice), and its epoch; a new database gets ours."""
        with rc.translated("open"):
            attrs = dict(self.io.get_xattrs(self.meta_oid))
        self.ops.round_trips += 1
        if "n" in attrs:
            self.objects = int(attrs["n"])
        else:
            self._write(self.meta_oid, lambda op: op.set_xattr("n", b"%d" % self.objects), "open")
        self.epoch = int(attrs.get("e") or b"0")

    @property
    def wipe_revision(self) -> int:
        """The node cache voids ownership tokens up to it."""
        return owning.wipe_revision(self.epoch)

    def _others_have_it_open(self) -> bool:
        """Notify the meta object: any answer, or a watcher that did not
        answer in time (it may be alive, or a dead opener's watch the OSD has
        not yet timed out), means another opener."""
        self.ops.round_trips += 1
        answers: list[tuple[int, list | None]] = []
        done = threading.Event()

        def finished(result: int, acks: list | None) -> None:
            answers.append((result, acks))
            done.set()

        self.ops.notify(self.meta_oid, "opener?", "find other openers", OPENER_PING_MS, finished)
        # Seen here: a notify whose completion never came, with other clients
        # busy on the object. No answer is taken as "maybe", which keeps the
        # records: a wipe is only for a database that is surely unused.
        if not done.wait(2 * OPENER_PING_MS / 1000):
            return True
        result, acks = answers[0]
        return result < 0 or bool(acks)

    # -- processes ---------------------------------------------------------------------------

    def after_fork(self) -> None:
        super().after_fork()
        # The parent's watches and notifies live in its client: dropping them
        # here would unwatch through it and hang, so they are kept, untouched.
        rc.CLIENTS.inherited.append((self._waits, self._opener_watch))
        self._waits = _Waits()
        self._flagged = set()
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

    # -- the node cache (dbwrap_py.nodecache.protocol) ----------------------------------------

    @classmethod
    def node_store(cls, options: Options) -> nodestore.RadosNodeStore:
        """The node agent's side (``dbwrap-py node-agent --adapter rados``)."""
        options = cls.options_of(options)
        op_timeout, prefix = options.value("op_timeout"), options.value("prefix").strip("/")
        return nodestore.RadosNodeStore(rc.ClientConfig.from_options(options, op_timeout), prefix, op_timeout)

    def ownership(self) -> owning.RadosOwnership:
        """This database's ownership operations, on this process's client."""
        return owning.RadosOwnership(self.ops, self.prefix, self.meta_oid, self.node_cache_id,
                                     self.objects, self.epoch, self.op_timeout)


ADAPTER = RadosAdapter
