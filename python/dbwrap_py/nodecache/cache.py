"""One database's records on this node, for one process.

``NodeCache`` does an adapter's record operations for a volatile database
with ``node_cache`` on (``CachedAdapter`` routes them here, and the bridge
calls the same rules in C as native records). A record lock is the local
tdb's chainlock, as in native tdb; while the node owns the record nothing
else happens. A record the node does not own is moved in under that
chainlock: its bucket is claimed if it can be (then a new key costs
nothing), else the record alone is taken; a record another node owns is
asked for, and the call waits until that node's agent, or the process of
that node holding it, hands it over.

When this process lets a record go that another node is waiting for (the
agent's wanted table says so), it hands it over itself, still holding the
lock: written back and, where the store can (``Ownership.hand_over``), made
the asking node's in the same step, so that this node's own waiters queued
on the chainlock cannot take it back before that node looks.

In proxy mode smbd's processes hold the chainlocks and the proxy daemon
moves records in and out for them: ``move_in`` and ``hand_over_if_free``
never wait (the daemon is one thread serving every process), they answer
"not yet" and the process asks again.

Which local records the node owns, which keys of its buckets are new, and
how a write under a lock is fenced are the C type ``LocalRecords``'s rules
(_fastpath.c); this module moves records in and out.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

from dbwrap_py.errors import FencedOut, Timeout, Unavailable
from dbwrap_py.nodecache._fastpath import LocalRecords
from dbwrap_py.nodecache.layout import IN_STORE, VIA_BUCKET, Bucket, Local, bucket_key, bucket_of
from dbwrap_py.nodecache.protocol import OwnedElsewhere, Ownership
from dbwrap_py.retry import Backoff, retry_until
from dbwrap_py.nodecache.state import NodeState
from dbwrap_py.safe_files import check_directory

#: local tdb files: many chains, so unrelated keys rarely share a lock
HASH_SIZE = 10007
#: how long a bucket that could not be claimed is left alone
CLAIM_BACKOFF = 1.0
#: how often a process looks again while it waits for released records of its own node
WAIT_POLL = 0.002
#: how a process waits for a record another node holds (retry.py's policy):
#: 2 ms doubling to 32 ms. Each look is a round trip to the store; at a
#: fixed 2 ms, the waiters of a hot record looked some 40 times per open
#: over a 2 ms network (bench cluster --network region, 16 clients),
#: loading the store the owner hands the record over through
TAKE_WAIT = Backoff(0.002, 0.032)
#: how often it asks the same owner again: the owner may have handed the
#: record over and taken it back before this process looked, and a served
#: request is gone (seen: a waiter on rados starved for 20 s)
ASK_AGAIN = 0.25
#: keys with a recent request to their owner, before stale ones are dropped
ASKED_KEPT = 1024
#: keys whose MOVE_IN is held back (below), before stale ones are dropped
HELD_BACK_KEPT = 1024
WRITE_BACK, WRITE_THROUGH = "write-back", "write-through"


def check_cache_dir(cache_dir: str | Path) -> None:
    """UnsafePath unless the directory is root's (or this process's
    effective user's) and writable by its owner only: root keeps the node's
    records, its state file and its lock there, by name."""
    check_directory(cache_dir, "node cache directory")


def local_files(cache_dir: str | Path, db_id: bytes) -> tuple[Path, Path]:
    """The records' and the buckets' local tdb files of a database."""
    base = db_id.decode("utf-8", "surrogateescape")
    return Path(cache_dir) / f"{base}.tdb", Path(cache_dir) / f"{base}.buckets.tdb"


def open_local(path: Path, mode: int = 0o600):
    """A local tdb through the tdb adapter (its chainlocks, its sharing rules).

    Chainlocks are robust mutexes where the system has them, as smbd's own
    volatile tdbs: an fcntl lock costs two system calls per record lock,
    which is most of an owned record's cost. The files outlive their
    openers (the node owns what they hold), so no TDB_CLEAR_IF_FIRST."""
    from dbwrap_py.adapter import TDB_INCOMPATIBLE_HASH, TDB_MUTEX_LOCKING, TDB_SEQNUM, DatabaseSpec
    from dbwrap_py.adapters.tdb.adapter import TdbAdapter, mutexes_supported
    from dbwrap_py.options import Options

    flags = TDB_SEQNUM | TDB_INCOMPATIBLE_HASH | (TDB_MUTEX_LOCKING if mutexes_supported() else 0)
    spec = DatabaseSpec(name=str(path), hash_size=HASH_SIZE, tdb_flags=flags,
                        open_flags=os.O_RDWR | os.O_CREAT, mode=mode)
    return TdbAdapter(spec, Options({"native_records": "no"}))


def _local(owned: tuple) -> Local:
    lease, token, flags, value = owned
    return Local(lease, token, flags, value)


class NodeCache:
    def __init__(self, cache_dir: str | Path, db_id: bytes, ownership: Ownership,
                 mode: str = WRITE_BACK, file_mode: int = 0o600, op_timeout: float = 10.0) -> None:
        self.db_id = db_id
        self.ownership = ownership
        self.write_through = mode == WRITE_THROUGH
        self.op_timeout = op_timeout
        self.cache_dir = Path(cache_dir)
        self.state = NodeState(str(cache_dir))
        records, buckets = local_files(cache_dir, db_id)
        self.local = open_local(records, file_mode)
        self.buckets = open_local(buckets, file_mode)
        self.records = LocalRecords(self.local, self.buckets, self.state, db_id, op_timeout)
        self.records.set_callbacks(self._miss, self._hand_over)
        self._claim_backoff: dict[int, float] = {}
        self._asked: dict[bytes, tuple[bytes, float]] = {}  # key: (owner asked, when)
        #: move_in: key -> (no take before this time, takes in a row that met a holder)
        self._held_back: dict[bytes, tuple[float, int]] = {}
        self._written_through_at = -1  # local seqnum when the store last had every owned record
        #: what this cache took from the store for its node: records taken
        #: one by one (a record lock on the node lease) and buckets claimed.
        #: Counted here, where every take is made (the C fast path sends its
        #: misses here), for the proxy daemon's metrics (DatabaseTable.takes).
        self.takes: dict[str, int] = {"record": 0, "bucket": 0}

    @property
    def wipe_revision(self) -> int:
        """Tokens up to the database's last CLEAR_IF_FIRST wipe are void."""
        return self.records.wipe_revision

    @wipe_revision.setter
    def wipe_revision(self, revision: int) -> None:
        self.records.wipe_revision = revision

    # -- the node lease ---------------------------------------------------------

    def agent_configured(self) -> bool:
        """An agent serves this cache directory."""
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
                raise Unavailable(f"the node agent's lease is not live (agent pid {self.state.agent_pid()}; "
                                  f"its log: {self.cache_dir / 'agent.log'})")
            time.sleep(0.01)

    # -- moving records in ---------------------------------------------------------

    def _take(self, key: bytes, lease: int, node: bytes) -> Local:
        """Move the record in (chainlock held); waits while another node hands it over."""
        claimed = self._via_bucket(key, lease, node)
        if claimed is not None:
            return claimed
        holder = "a process"
        for _ in retry_until(time.monotonic() + self.op_timeout, TAKE_WAIT):
            try:
                return self._take_once(key, lease, node)
            except OwnedElsewhere as exc:
                holder = f"node {exc.node.decode()}" if exc.node else "a process"
        raise Timeout(f"record {key!r} not handed over within {self.op_timeout:g} s ({holder} holds it)")

    def _via_bucket(self, key: bytes, lease: int, node: bytes) -> Local | None:
        """The record, owned through its bucket, claimed now if it can be
        (chainlock held); None when the bucket is not the node's."""
        number = bucket_of(key)
        if self._claim_backoff.get(number, 0.0) <= time.monotonic() and self._claim(key, number, lease, node):
            owned = self.records.stand(key, lease)
            if owned is not None:
                return _local(owned)
        return None

    def _take_once(self, key: bytes, lease: int, node: bytes) -> Local:
        """One attempt at taking the record from the store and keeping it
        (chainlock held). OwnedElsewhere when a node or a process holds it;
        its node has been asked to let go (again after ASK_AGAIN: a request
        it served may have been followed by taking the record back)."""
        try:
            taken = self.ownership.take(key, node, lease)
        except OwnedElsewhere as exc:
            if exc.node is not None:
                self._ask(key, exc.node, lease, node)
            raise
        self._asked.pop(key, None)
        self.takes["record"] += 1
        flags = (VIA_BUCKET if taken.via_bucket else 0) | (IN_STORE if taken.value is not None else 0)
        local = Local(lease, taken.token, flags, taken.value)
        self.records.keep(key, local.lease, local.token, local.flags, local.value)
        return local

    def _ask(self, key: bytes, owner: bytes, lease: int, node: bytes) -> None:
        """Ask ``owner`` to let ``key`` go to ``node``, unless it was asked within ASK_AGAIN."""
        now = time.monotonic()
        asked = self._asked.get(key)
        if asked is not None and asked[0] == owner and now - asked[1] < ASK_AGAIN:
            return
        if len(self._asked) >= ASKED_KEPT:  # keys whose askers gave up: forget the stale ones
            self._asked = {k: a for k, a in self._asked.items() if now - a[1] < ASK_AGAIN}
        self.ownership.request_release(key, owner, lease, requester=node)
        self._asked[key] = (owner, now)

    def move_in(self, key: bytes) -> bool:
        """Make the node the owner of ``key`` without waiting for anyone: the
        proxy daemon's MOVE_IN, for a process that does owned records itself.
        False for "not yet": the node lease is not live, a process holds the
        key's chainlock, or another node or a process holds the record (its
        node asked to let go). The caller asks again after a pause.

        Every waiting process of the node asks on its own, with the
        chainlock let go, so after a take that met a holder the next one
        waits as long as a waiter in process waits between two (TAKE_WAIT):
        the store sees one waiter per node and key, whatever the number of
        processes waiting (at 512 clients, each of a node's ~170 waiters
        tried a take of the one hot record every few milliseconds)."""
        lease, node = self.state.current()
        if not lease:
            return False
        held_back = self._held_back.get(key)
        if held_back is not None and time.monotonic() < held_back[0]:
            return False
        if not self.local.try_lock(key):
            return False
        try:
            if self.records.stand(key, lease) is None and self._via_bucket(key, lease, node) is None:
                self._take_once(key, lease, node)
            self._held_back.pop(key, None)
            return True
        except OwnedElsewhere:
            self._hold_back(key, held_back[1] + 1 if held_back is not None else 1)
            return False
        finally:
            self.local.unlock(key)

    def _hold_back(self, key: bytes, tries: int) -> None:
        """No take of ``key`` by move_in before TAKE_WAIT's pause after ``tries`` tries."""
        now = time.monotonic()
        if len(self._held_back) >= HELD_BACK_KEPT:  # keys whose waiters gave up
            self._held_back = {k: h for k, h in self._held_back.items() if h[0] > now}
        self._held_back[key] = (now + TAKE_WAIT.pause(tries, random.random()), tries)

    def _claim(self, key: bytes, number: int, lease: int, node: bytes) -> bool:
        """Claim key's bucket for the node, unless it holds it already; True if it holds it now."""
        self.buckets.lock(bucket_key(number))
        try:
            if self.records.holds_bucket(key, lease) is not None:
                return True
            claim = self.ownership.claim(number, node, lease)
            if claim is None:
                self._claim_backoff[number] = time.monotonic() + CLAIM_BACKOFF
                return False
            self.buckets.put(bucket_key(number), Bucket(lease, claim.token, frozenset(claim.records)).pack())
            self.takes["bucket"] += 1
            return True
        finally:
            self.buckets.unlock(bucket_key(number))

    def _miss(self, key: bytes, locked: bool) -> bytes | None:
        """The fast path's way here: a record to move in (locked: under its chainlock)."""
        if not locked:
            return self.get(key)
        lease, node = self._live()
        owned = self.records.stand(key, lease)
        return owned[3] if owned is not None else self._take(key, lease, node).value

    # -- the adapter's record operations ----------------------------------------------

    def lock_get(self, key: bytes) -> bytes | None:
        lease, node = self._live()
        self.local.lock(key)
        try:
            owned = self.records.stand(key, lease)
            return owned[3] if owned is not None else self._take(key, lease, node).value
        except BaseException:
            self.local.unlock(key)
            raise

    def unlock(self, key: bytes) -> None:
        try:
            self._hand_over_if_wanted(key)
        finally:
            self.local.unlock(key)

    def _write(self, key: bytes, value: bytes | None) -> bool:
        """A fenced write under the lock; whether the record existed."""
        in_store = None
        if self.write_through:
            standing = self.records.standing(key)
            if standing is None or not self.ownership.write_through(
                    key, value, standing[1], bool(standing[2] & VIA_BUCKET)):
                raise FencedOut(f"the store no longer holds {key!r} for this node")
            in_store = value is not None
        return self.records.write(key, value, in_store)

    def put(self, key: bytes, value: bytes) -> None:
        self._write(key, value)

    def remove(self, key: bytes) -> bool:
        return self._write(key, None)

    def get(self, key: bytes) -> bytes | None:
        lease = self.state.lease()
        if lease:
            owned = self.records.owned(key, lease)
            if owned is not None:
                return owned[3]
        value = self.lock_get(key)  # not ours: move it in, as ctdb does
        self.unlock(key)
        return value

    def _hand_over_if_wanted(self, key: bytes) -> None:
        """Hand the record over if another node waits for it (lock held)."""
        if self.state.lease() and self.state.wanted(self.db_id, key):
            self._hand_over(key)

    def hand_over_if_free(self, key: bytes) -> bool:
        """A process let go of a record another node waits for: the proxy
        daemon's HAND_OVER. False if a process holds it again (it hands it
        over as it lets go, and the agent keeps serving the request)."""
        if not self.local.try_lock(key):
            return False
        try:
            self._hand_over_if_wanted(key)
        finally:
            self.local.unlock(key)
        return True

    def _hand_over(self, key: bytes) -> None:
        """Give a record another node waits for back to the store (lock held)."""
        lease = self.state.lease()
        owned = self.records.owned(key, lease) if lease else None
        if owned is None:
            return  # not ours (any more)
        local = _local(owned)
        if self.ownership.hand_over(key, local.value, local.token, local.via_bucket,
                                    self.state.node_name(), lease):
            self.records.forget(key, lease)

    # -- for the node agent ----------------------------------------------------------

    def serve_request(self, key: bytes, node: bytes, lease: int) -> bool:
        """Another node asked for ``key``: hand it over if nobody here holds
        it; False if a process does (it hands it over when it lets go)."""
        if not self.local.try_lock(key):
            return False
        try:
            owned = self.records.owned(key, lease)
            if owned is None:
                self.ownership.let_go(key, node, lease)
            else:
                local = _local(owned)
                if self.ownership.hand_over(key, local.value, local.token, local.via_bucket, node, lease):
                    self.records.forget(key, lease)
        finally:
            self.local.unlock(key)
        return True

    def look(self, key: bytes, lease: int) -> tuple | None:
        """The record as the node has it (its token, flags and value; empty
        if the node does not own it), None while a process holds its lock:
        the agent compares two looks to tell whether the node still uses it."""
        if not self.local.try_lock(key):
            return None
        try:
            owned = self.records.owned(key, lease)
            return owned[1:] if owned is not None else ()
        finally:
            self.local.unlock(key)

    def local_records(self, lease: int) -> list[tuple[bytes, Local]]:
        """Every record the node owns under ``lease``, as kept locally;
        waits for the hash chains processes hold (the drain)."""
        return [(key, Local(l, t, f, v)) for key, l, t, f, v in self.records.scan_owned(lease)]

    def free_local_records(self, lease: int) -> tuple[list[tuple[bytes, Local]], int]:
        """The records ``local_records`` gives, from the hash chains no
        process holds now, and how many chains it passed; never waits (the
        agent's work: it serves release requests meanwhile)."""
        found, held = self.records.scan_owned_free(lease)
        return [(key, Local(l, t, f, v)) for key, l, t, f, v in found], held

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
            standing = self.records.standing(key)
            owned = self.records.owned(key, lease) if standing is not None else None
            if owned is None:
                return False
            local = _local(owned)
            if deleted_only and local.value is not None:
                return False
            if not local.via_bucket:
                done = self.ownership.write_back(key, local.value, local.token, False, node, lease)
                if done:
                    self.records.forget(key, lease)
                return done
            if local.value is not None:
                return False
            if local.flags & IN_STORE:  # the store's copy goes; the bucket stays
                if not self.ownership.write_through(key, None, local.token, True):
                    return False
            self.local.remove(key)  # a deleted record of the node's bucket: nothing to keep
            return True
        finally:
            self.local.unlock(key)

    def release_buckets(self, lease: int) -> int:
        """Give every bucket back with its records (the drain: no process
        takes new records now, and this waits for the ones still held)."""
        released = 0
        records = self.local_records(lease)
        for number, token in self.records.scan_buckets(lease):
            keys = [key for key, local in records if local.via_bucket and bucket_of(key) == number]
            for key in keys:
                self.local.lock(key)
            try:
                values: dict[bytes, bytes | None] = {}
                for key in keys:
                    standing = self.records.standing(key)
                    if standing is not None and (standing[3] is not None or standing[2] & IN_STORE):
                        values[key] = standing[3]
                if self.ownership.release_bucket(number, token, values):
                    released += 1
                for key in keys:
                    self.local.remove(key)
                self.buckets.remove(bucket_key(number))
            finally:
                for key in keys:
                    self.local.unlock(key)
        return released

    def write_through_owned(self, lease: int, deadline: float) -> int:
        """Write every record the node owns through to the store and keep
        them (a traverse on another node asked: sync.py); the number written.
        Each under its lock, so its value and IN_STORE flag stay one; a record
        a process holds is tried again until ``deadline``, then Timeout. Free
        when no local record changed since the last call that found none did."""
        before = self.local.seqnum()
        if before == self._written_through_at:
            return 0
        written = 0
        done: set[bytes] = set()
        while True:
            found, held_chains = self.free_local_records(lease)
            held = []
            for key, local in found:
                if key in done or (local.value is None and not local.flags & IN_STORE):
                    continue
                if not self.local.try_lock(key):
                    held.append(key)
                    continue
                try:
                    written += self._write_through_locked(key, lease)
                    done.add(key)
                finally:
                    self.local.unlock(key)
            if not held and not held_chains:
                break
            if time.monotonic() >= deadline:
                raise Timeout(f"{len(held)} record(s) and {held_chains} hash chain(s) held by"
                              f" a process here past the deadline")
            time.sleep(WAIT_POLL)
        if self.local.seqnum() == before:  # nothing changed meanwhile, this call's flags included
            self._written_through_at = before
        return written

    def write_through_held(self, key: bytes) -> None:
        """The record this process holds is in the store as it is here, its
        deletion included, before this returns; the node keeps owning it.
        A write-back cache's answer to a persistent record (Samba 4.25's
        DBWRAP_STORE_PERSISTENT): it must never exist only on this node.
        FencedOut when the node no longer owns it."""
        if self.write_through:
            return  # every write went through already
        lease = self.state.lease()
        owned = self.records.owned(key, lease) if lease else None
        if owned is None or self._write_through_local(key, _local(owned)) is False:
            raise FencedOut(f"the store no longer holds {key!r} for this node: not written through")

    def _write_through_locked(self, key: bytes, lease: int) -> bool:
        owned = self.records.owned(key, lease)
        return owned is not None and bool(self._write_through_local(key, _local(owned)))

    def _write_through_local(self, key: bytes, local: Local) -> bool | None:
        """Write one owned record through (lock held): True when written,
        None when there is nothing to write (deleted, and the store never had
        it), False when the store holds it for another owner now."""
        if local.value is None and not local.flags & IN_STORE:
            return None
        if not self.ownership.write_through(key, local.value, local.token, local.via_bucket):
            return False
        if bool(local.flags & IN_STORE) != (local.value is not None):
            self.records.write(key, local.value, local.value is not None)  # whether a delete must reach it
        return True

    # -- the rest of the adapter's operations -------------------------------------

    def owned(self):
        """(key, value or None) of every record the node owns now."""
        lease = self.state.lease()
        return [(key, value) for key, _, _, _, value in self.records.scan_owned(lease)] if lease else []

    def seqnum(self) -> int:
        return self.local.seqnum()

    def wipe(self) -> None:
        self.local.wipe()
        self.buckets.wipe()

    def after_fork(self) -> None:
        self.local.after_fork()
        self.buckets.after_fork()

    def close(self) -> None:
        self.local.close()
        self.buckets.close()
        self.state.close()

