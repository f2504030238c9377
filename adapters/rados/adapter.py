"""rados: Samba's databases as omaps of objects in a Ceph pool.

A database ``<db>`` (``DatabaseSpec.cluster_name``) is the meta object
``<prefix>/<db>`` (its version is the seqnum; xattrs ``n``, the number of
objects, and ``e``, the epoch) and its records' objects ``<prefix>/<db>/<i>``,
spread over ``objects`` by the key's bucket (a persistent database has one,
so a transaction's commit is one atomic write op). Entries, locks and the
write ops: ``records.py``. Record locks (dbwrap_py.leased builds lock, put,
unlock on these) are cls_locks judged on the OSD's clock; every locked write
asserts its lock in the same op; waiters: ``waits.py``. TDB_CLEAR_IF_FIRST:
the openers service (``dbwrap_py.openers``) on ``openers.py``, an opener's
registration its watch on the meta object. Node cache (``node_cache =
yes``, volatile databases): ``ownership.py``; a record lock is refused while
a live node owns the record, and that node is asked to hand it over.
docs/adapters/rados.md tells why.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator

import rados

from dbwrap_py.adapter import TDB_CLEAR_IF_FIRST, TDB_SEQNUM, Capabilities, DatabaseSpec
from dbwrap_py.adapters.rados import client as rc
from dbwrap_py.adapters.rados import nodestore, records
from dbwrap_py.adapters.rados import ownership as owning
from dbwrap_py.adapters.rados.openers import RadosOpeners
from dbwrap_py.adapters.rados.records import DEFAULT_OBJECTS, MAX_VALUE_SIZE, TRANSACTION_LOCK
from dbwrap_py.adapters.rados.waits import MAX_WAIT_POLL, Waits
from dbwrap_py.errors import ConfigError
from dbwrap_py.leased import KEEP, LEASE_OPTIONS, PREFIX, Keep, LeaseSource
from dbwrap_py.nodecache.layout import BUCKETS
from dbwrap_py.openers import OPENERS, Registration
from dbwrap_py.options import Option, Options
from dbwrap_py.retry import Backoff
from dbwrap_py.transactions import TransactionalLeasedAdapter, Writes

DEFAULT_LEASE = 10.0


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
        self._waits = Waits(self.ops)
        self._registration: Registration | None = None  # this opener's, in dbwrap_py.openers
        if not spec.persistent:  # the first opener wipes it (TDB_CLEAR_IF_FIRST; openers.py)
            self._registration = OPENERS.open(RadosOpeners(self), bool(spec.tdb_flags & TDB_CLEAR_IF_FIRST))

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
               changes: bool = False) -> int:
        """Send one write op; 0, or the negative errno the OSD refused it with.
        ``changes``: it changes records, so the seqnum moves too."""
        bump = self._seqnum_bump() if changes and self._bump_seqnum else None
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

    # -- the lease primitives (dbwrap_py.leased; the ops: records.py) -------------------

    def take_lease(self, key: bytes, token: int, seconds: float, read: bool) -> tuple[bool, bytes | None]:
        names, oid = owning.Names.of(key), self.oid_of(key)
        found: dict[str, bytes] = {}
        for _ in range(3):  # else the caller waits, and tries again
            def build(op: rados.WriteOp) -> None:
                records.lock(op, rc.lock_name(key), token, seconds)
                if self.spec.persistent:  # no transaction runs: its lock, taken and dropped in the op
                    records.lock(op, TRANSACTION_LOCK, token, 1.0)
                    records.unlock(op, TRANSACTION_LOCK)
                else:  # no node owns it (the node cache), nor its bucket
                    owning.guard_free(op, names, found)

            wanted = ([names.record] if read else []) if self.spec.persistent else names.all()
            result, found = self.ops.write_read(oid, build, wanted, "lock")
            if result in (-errno.EBUSY, -errno.EEXIST):
                return False, None
            if result == 0:
                self._waits.flagged.discard(key)
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
        # the OSD refuses it (ENOENT) once the lock is gone
        return self._write(self.oid_of(key), lambda op: records.lock(
            op, rc.lock_name(key), token, seconds, rc.LOCK_MUST_RENEW), "lock renewal") == 0

    def fenced_write(self, key: bytes, token: int, value: bytes | None) -> bool:
        return self._write(self.oid_of(key), lambda op: (
            records.assert_locked(op, rc.lock_name(key), token),
            records.write_record(self.io, op, rc.encode_key(key), value)), "locked write", changes=True) == 0

    def end_lease(self, key: bytes, token: int, value: bytes | None | Keep = KEEP) -> bool:
        oid, name = self.oid_of(key), rc.encode_key(key)

        def build(op: rados.WriteOp, waiters: bool) -> None:
            records.assert_locked(op, rc.lock_name(key), token)
            if waiters:
                self.io.remove_omap_keys(op, [records.waiter_entry(name)])
            else:
                op.omap_cmp(records.waiter_entry(name), "", rados.LIBRADOS_CMPXATTR_OP_EQ)
            if value is not KEEP:
                records.write_record(self.io, op, name, value)
            records.unlock(op, rc.lock_name(key))

        writes = value is not KEEP
        result = self._write(oid, lambda op: build(op, False), "write and unlock", writes)
        if result == -rc.ECANCELED:  # somebody waits: clear the flag, then wake them
            result = self._write(oid, lambda op: build(op, True), "write and unlock", writes)
            if result == 0:
                self.ops.notify(oid, name, "notify")  # nobody waits for the answers
        return result == 0

    def wait_for_release(self, key: bytes, pause: float) -> None:
        """Watch the record's object, flag that we wait and try again at once;
        once flagged, sleep until a notify or for ``pause`` (``lock_wait``; waits.py)."""
        oid = self.oid_of(key)
        self._watch(oid)
        self._waits.wait_for_release(key, oid, pause)

    def _watch(self, oid: str) -> None:
        """Watch a record object, woken through this adapter (waits.py: why that matters)."""
        self._waits.watch(oid, lambda *args: self._waits.on_notify(oid))

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
        return self._write(self.all_oids()[0], lambda op: records.lock(
            op, TRANSACTION_LOCK, token, seconds), "transaction lock") == 0

    def renew_transaction_lock(self, token: int, seconds: float) -> bool:
        return self._write(self.all_oids()[0], lambda op: records.lock(
            op, TRANSACTION_LOCK, token, seconds, rc.LOCK_MUST_RENEW), "transaction lock renewal") == 0

    def commit_transaction(self, token: int, writes: Writes) -> bool:
        return self._write(self.all_oids()[0], lambda op: records.commit(self.io, op, token, writes), "commit") == 0

    def release_transaction_lock(self, token: int) -> None:
        self._write(self.all_oids()[0], lambda op: (records.assert_locked(op, TRANSACTION_LOCK, token),
                                                    records.unlock(op, TRANSACTION_LOCK)), "cancel")

    # -- TDB_CLEAR_IF_FIRST's wipes (openers.py) --------------------------------------------

    @property
    def wipe_revision(self) -> int:
        """The node cache voids ownership tokens up to it."""
        return owning.wipe_revision(self.epoch)

    # -- processes ---------------------------------------------------------------------------

    def after_fork(self) -> None:
        super().after_fork()
        # The parent's watches and notifies live in its client: dropping them
        # here would unwatch through it and hang, so they are kept, untouched.
        rc.CLIENTS.inherited.append((self._waits, self._registration))
        self._waits = Waits(self.ops)
        self._registration = None  # the parent's (dbwrap_py.openers leaves it to the parent)

    def close(self) -> None:
        if rc.CLIENTS.pid != os.getpid():
            return  # an inherited client's watches are not ours to touch
        self._waits.close()
        if self._registration is not None:
            OPENERS.leave(self._registration)  # closes the opener's watch
            self._registration = None

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
