"""One database's records on this node, for one process.

``NodeCache`` does an adapter's record operations for a volatile database
with ``node_cache`` on (``CachedAdapter`` in ``adapter.py`` routes them
here). A record lock is the local tdb's chainlock, as in native tdb; while
the node owns the record nothing else happens. A record the node does not
own is moved in under that chainlock: its bucket is claimed if it can be
(then a new key costs nothing), else the record alone is taken; a record
another node owns is asked for, and the call waits until that node's agent,
or the process of that node holding it, hands it over.

When this process lets a record go that another node is waiting for (the
agent's wanted table says so), it hands it over itself, still holding the
lock: written back and released in one round trip.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from dbwrap_py.errors import FencedOut, LockConflict, Timeout, Unavailable
from dbwrap_py.nodecache.layout import (
    DELETED,
    DETACHED,
    IN_STORE,
    VIA_BUCKET,
    Bucket,
    Local,
    bucket_key,
    bucket_of,
)
from dbwrap_py.nodecache.protocol import OwnedElsewhere, Ownership
from dbwrap_py.nodecache.state import NodeState

#: local tdb files: many chains, so unrelated keys rarely share a lock
HASH_SIZE = 10007
#: how long a bucket that could not be claimed is left alone
CLAIM_BACKOFF = 1.0
#: how often a process looks again while it waits for a released record
WAIT_POLL = 0.002
WRITE_BACK, WRITE_THROUGH = "write-back", "write-through"


def local_files(cache_dir: str | Path, db_id: bytes) -> tuple[Path, Path]:
    """The records' and the buckets' local tdb files of a database."""
    base = db_id.decode("utf-8", "surrogateescape")
    return Path(cache_dir) / f"{base}.tdb", Path(cache_dir) / f"{base}.buckets.tdb"


def open_local(path: Path, mode: int = 0o600, create: bool = True):
    """A local tdb through the tdb adapter (its chainlocks, its sharing rules)."""
    from dbwrap_py.adapter import TDB_SEQNUM, DatabaseSpec
    from dbwrap_py.adapters.tdb import TdbAdapter
    from dbwrap_py.options import Options

    spec = DatabaseSpec(name=str(path), hash_size=HASH_SIZE, tdb_flags=TDB_SEQNUM,
                        open_flags=os.O_RDWR | (os.O_CREAT if create else 0), mode=mode)
    return TdbAdapter(spec, Options({"native_records": "no"}))


class NodeCache:
    def __init__(self, cache_dir: str | Path, db_id: bytes, ownership: Ownership,
                 mode: str = WRITE_BACK, file_mode: int = 0o600, op_timeout: float = 10.0) -> None:
        self.db_id = db_id
        self.ownership = ownership
        self.write_through = mode == WRITE_THROUGH
        self.op_timeout = op_timeout
        self.state = NodeState(cache_dir)
        records, buckets = local_files(cache_dir, db_id)
        self.local = open_local(records, file_mode)
        self.buckets = open_local(buckets, file_mode)
        #: what each record lock this process holds stands on
        self.held: dict[bytes, Local] = {}
        #: tokens up to the database's last CLEAR_IF_FIRST wipe are void
        self.wipe_revision = 0
        self._claim_backoff: dict[int, float] = {}

    # -- the node lease ---------------------------------------------------------

    def agent_configured(self) -> bool:
        """An agent serves this cache directory (or did): never go around it."""
        return self.state.configured()

    def _live(self) -> tuple[int, bytes]:
        """The lease to take records under; waits, within op_timeout, for an
        agent that is restarting or renewing late. Never goes around it: a
        process taking record locks in the store while the node owns records
        would ask its own node for them."""
        deadline = time.monotonic() + self.op_timeout
        while True:
            lease, node = self.state.current()
            if lease:
                return lease, node
            if time.monotonic() >= deadline:
                raise Unavailable("the node agent's lease is not live (is dbwrap-py node-agent running?)")
            time.sleep(0.01)

    # -- what the node owns -----------------------------------------------------

    def _bucket(self, number: int, lease: int) -> Bucket | None:
        raw = self.buckets.get(bucket_key(number))
        if raw is None:
            return None
        bucket = Bucket.unpack(raw)
        return bucket if bucket.lease == lease and bucket.token > self.wipe_revision else None

    def _owned(self, key: bytes, lease: int) -> Local | None:
        """The record as the node owns it now, or None if it must be taken."""
        raw = self.local.get(key)
        local = Local.unpack(raw) if raw is not None else None
        if local is not None and local.lease == lease and local.token > self.wipe_revision:
            return None if local.flags & DETACHED else local
        bucket = self._bucket(bucket_of(key), lease)
        if bucket is None or key in bucket.stored:
            return None
        # the node's bucket, and the key was never in the store: it does not exist
        return Local(lease, bucket.token, VIA_BUCKET | DELETED, None)

    def _take(self, key: bytes, lease: int, node: bytes) -> Local:
        """Move the record in; waits while another node hands it over."""
        number = bucket_of(key)
        if self._claim_backoff.get(number, 0.0) <= time.monotonic():
            fresh = self._claim(key, number, lease, node)
            if fresh is not None:
                return fresh
        deadline = time.monotonic() + self.op_timeout
        asked: bytes | None = None
        while True:
            try:
                taken = self.ownership.take(key, node, lease)
            except OwnedElsewhere as exc:
                if exc.node is not None and exc.node != asked:
                    self.ownership.request_release(key, exc.node, lease)
                    asked = exc.node
                if time.monotonic() >= deadline:
                    raise Timeout(f"record {key!r} not handed over within {self.op_timeout:g} s"
                                  f" ({'node ' + exc.node.decode() if exc.node else 'a process'} holds it)") from None
                time.sleep(WAIT_POLL)
                continue
            flags = (VIA_BUCKET if taken.via_bucket else 0) | (IN_STORE if taken.value is not None else 0)
            return Local(lease, taken.token, flags, taken.value)

    def _claim(self, key: bytes, number: int, lease: int, node: bytes) -> Local | None:
        """Claim the key's bucket; the record if that answers it, else None."""
        self.buckets.lock(bucket_key(number))
        try:
            if self._bucket(number, lease) is None:
                claim = self.ownership.claim(number, node, lease)
                if claim is None:
                    self._claim_backoff[number] = time.monotonic() + CLAIM_BACKOFF
                    return None
                bucket = Bucket(lease, claim.token, frozenset(claim.records))
                self.buckets.put(bucket_key(number), bucket.pack())
        finally:
            self.buckets.unlock(bucket_key(number))
        return self._owned(key, lease)

    # -- the adapter's record operations ----------------------------------------------

    def lock_get(self, key: bytes) -> bytes | None:
        lease, node = self._live()
        self.local.lock(key)
        try:
            local = self._owned(key, lease)
            if local is None:
                local = self._take(key, lease, node)
                self.local.put(key, local.pack())
        except BaseException:
            self.local.unlock(key)
            raise
        self.held[key] = local
        return local.value

    def unlock(self, key: bytes) -> None:
        local = self.held.pop(key, None)
        try:
            if local is not None and self.state.wanted(self.db_id, key):
                self._hand_over(key, local)
        finally:
            self.local.unlock(key)

    def _fenced(self, key: bytes) -> Local:
        """The ownership a write stands on, once the lease it was taken under
        is proved live. A late keepalive only delays the write; a lease that
        ended (the agent has a new one, or none within op_timeout) fences it."""
        try:
            local = self.held[key]
        except KeyError:
            raise LockConflict(f"write to {key!r} without holding its record lock") from None
        deadline = time.monotonic() + self.op_timeout
        while True:
            lease = self.state.lease()
            if lease == local.lease:
                return local
            if lease != 0 or time.monotonic() >= deadline:
                raise FencedOut(f"the node lease {key!r} was taken under is gone")
            time.sleep(0.005)

    def _write(self, key: bytes, local: Local, value: bytes | None) -> None:
        flags = local.flags & ~DELETED | (DELETED if value is None else 0)
        if self.write_through:
            if not self.ownership.write_through(key, value, local.token, local.via_bucket):
                raise FencedOut(f"the store no longer holds {key!r} for this node")
            flags = flags | IN_STORE if value is not None else flags & ~IN_STORE
        new = Local(local.lease, local.token, flags, value)
        if value is None and local.via_bucket and not flags & IN_STORE:
            # a record of the node's bucket the store never had: gone for good
            # (absent from the bucket means absent), so no tombstone to hand back
            self.local.remove(key)
        else:
            self.local.put(key, new.pack())
        self.held[key] = new

    def put(self, key: bytes, value: bytes) -> None:
        self._write(key, self._fenced(key), value)

    def remove(self, key: bytes) -> bool:
        local = self._fenced(key)
        existed = local.value is not None
        self._write(key, local, None)
        return existed

    def get(self, key: bytes) -> bytes | None:
        if key in self.held:  # our lock: the local copy is the record
            return self.held[key].value
        lease = self.state.lease()
        if lease:
            local = self._owned(key, lease)
            if local is not None:
                return local.value
        value = self.lock_get(key)  # not ours: move it in, as ctdb does
        self.unlock(key)
        return value

    def _hand_over(self, key: bytes, local: Local) -> None:
        """Give a record another node waits for back to the store (lock held)."""
        if self.state.lease() != local.lease:
            return  # the lease is gone, and our ownership with it
        if self.ownership.write_back(key, local.value, local.token, local.via_bucket,
                                     self.state.node_name(), local.lease):
            self._forget(key, local.lease)

    def _forget(self, key: bytes, lease: int) -> None:
        """Drop the local copy of a record the node no longer owns. A key of
        the node's bucket keeps a marker: it is out of the bucket for good
        (the store marked it detached), and must not look new."""
        bucket = self._bucket(bucket_of(key), lease)
        if bucket is None:
            self.local.remove(key)
        else:
            self.local.put(key, Local(lease, bucket.token, DETACHED, None).pack())

    # -- for the node agent ----------------------------------------------------------

    def serve_request(self, key: bytes, node: bytes, lease: int) -> bool:
        """Another node asked for ``key``: hand it over if nobody here holds
        it; False if a process does (it hands it over when it lets go)."""
        if not self.local.try_lock(key):
            return False
        try:
            local = self._owned(key, lease)
            if local is None:
                self.ownership.let_go(key, node, lease)
            elif self.ownership.write_back(key, local.value, local.token, local.via_bucket,
                                           node, lease):
                self._forget(key, lease)
        finally:
            self.local.unlock(key)
        return True

    def hand_back(self, key: bytes, lease: int, node: bytes, wait: bool,
                  deleted_only: bool = False) -> bool:
        """Give one record the node owns back to the store (the vacuum: only
        deleted ones, skipping records in use; the drain: waiting for them).
        A live record of a bucket goes back with its bucket instead."""
        if wait:
            self.local.lock(key)
        elif not self.local.try_lock(key):
            return False
        try:
            raw = self.local.get(key)
            local = Local.unpack(raw) if raw is not None else None
            if local is None or local.lease != lease or local.token <= self.wipe_revision \
                    or local.flags & DETACHED or (deleted_only and local.value is not None):
                return False
            if not local.via_bucket:
                done = self.ownership.write_back(key, local.value, local.token, False, node, lease)
                if done:
                    self._forget(key, lease)
                return done
            if local.value is not None:
                return False
            if local.flags & IN_STORE:  # the store's copy goes; the bucket stays
                if not self.ownership.write_through(key, None, local.token, True):
                    return False
            self.local.remove(key)
            return True
        finally:
            self.local.unlock(key)

    def release_buckets(self, lease: int) -> int:
        """Give every bucket back with its records (the drain: no process
        takes new records now, and this waits for the ones still held)."""
        released = 0
        for number, bucket in self.buckets_held(lease).items():
            keys = [key for key, local in self.local_records(lease)
                    if local.via_bucket and bucket_of(key) == number]
            for key in keys:
                self.local.lock(key)
            try:
                records: dict[bytes, bytes | None] = {}
                for key in keys:
                    local = Local.unpack(self.local.get(key))
                    if local.value is not None or local.flags & IN_STORE:
                        records[key] = local.value
                if self.ownership.release_bucket(number, bucket.token, records):
                    released += 1
                for key in keys:
                    self.local.remove(key)
                self.buckets.remove(bucket_key(number))
            finally:
                for key in keys:
                    self.local.unlock(key)
        return released

    def buckets_held(self, lease: int) -> dict[int, Bucket]:
        found = {}
        for raw_key, raw in self.buckets.scan():
            bucket = Bucket.unpack(raw)
            if bucket.lease == lease and bucket.token > self.wipe_revision:
                found[int(raw_key)] = bucket
        return found

    def local_records(self, lease: int) -> list[tuple[bytes, Local]]:
        """Every record the node owns under ``lease``, as kept locally."""
        found = []
        for key, raw in self.local.scan():
            local = Local.unpack(raw)
            if local.lease == lease and local.token > self.wipe_revision \
                    and not local.flags & DETACHED:
                found.append((key, local))
        return found

    # -- the rest of the adapter's operations -------------------------------------

    def owned(self):
        """(key, value or None) of every record the node owns now."""
        lease = self.state.lease()
        for key, raw in self.local.scan():
            local = Local.unpack(raw)
            if local.lease == lease and local.token > self.wipe_revision and not local.flags & DETACHED:
                yield key, local.value

    def seqnum(self) -> int:
        return self.local.seqnum()

    def wipe(self) -> None:
        self.local.wipe()
        self.buckets.wipe()

    def after_fork(self) -> None:
        self.held.clear()
        self.local.after_fork()
        self.buckets.after_fork()

    def close(self) -> None:
        self.local.close()
        self.buckets.close()
        self.state.close()
