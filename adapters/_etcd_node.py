"""The node cache of the etcd adapter: records live on the node that uses them.

Why: with every record operation a round trip to etcd, an SMB2 open+close
costs about 27 round trips, and an open of a busy path holds the share-mode
record's lock across several of them: ~20 opens/s at 4 connections whatever
the client does. ctdb's answer, copied here in spirit, is record migration:
a record's data stays on the node whose processes last used it (its
"dmaster"), and moves only when another node asks for it.

How, with ``node_cache = yes`` on a volatile (CLEAR_IF_FIRST) database:

* A node agent (``dbwrap-py etcd-agent``, one per node, like ctdbd) holds a
  node lease and writes its state to ``<node_cache_dir>/node.state``: lease
  id, node name, and until when the lease is surely alive (the send time of
  its last answered keepalive plus the TTL, less a margin; CLOCK_MONOTONIC is
  one clock for every process of the host).
* A node owns a record while it holds the record's lock key in etcd, with
  the value ``node:<name>:<lease>``, on the node lease. That is the key a
  process's record lock uses, so ownership and locks exclude each other.
* The owned record lives in a local tdb (``<node_cache_dir>/<db>.tdb``). Its
  value is prefixed by a header: node lease, the lock key's create_revision,
  and whether the record is deleted. Record locks are the local tdb's
  chainlocks, as in native tdb: no round trip while the node owns the record.
* A record the node does not own is migrated in under the local chainlock:
  one etcd transaction takes the lock key for the node and reads the data.
  If another node owns it, a release request goes under that node's request
  prefix; its agent writes the record back to etcd and deletes the lock key in
  one transaction fenced on the lock key's create_revision, then drops its
  copy.
* A write checks that the node lease it migrated the record under is still
  the live one (FencedOut otherwise), so a node that lost its lease never
  writes through a stale ownership; its agent's write-back fails the fence.
* Without a live agent the adapter works as without the cache (a round trip
  per operation), and a lock key a dead node left behind goes with its lease.

What it costs: a node agent crash loses the records it owned that were
written since they were migrated in (volatile data, lost as ctdb loses a dead
node's records); a traverse sees another node's owned records as of their
last write-back; ``wipe`` does not reach records another node owns.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from dbwrap_py.errors import ConfigError, FencedOut, LockConflict

#: the agent's state file: a sequence counter (odd while the agent writes),
#: pid, lease id, valid-until on CLOCK_MONOTONIC, draining (a stopping agent:
#: finish held locks, take no new ones), node name
STATE_FORMAT = struct.Struct("<4sIqqdI64s")
STATE_MAGIC = b"DBWN"
STATE_FILE = "node.state"
#: a cached record: node lease, create_revision of the node's lock key, flags
HEADER = struct.Struct("<qqB")
FLAG_DELETED = 1
#: the lock key value of a node owning the record
NODE_MARK = b"node:"
#: a local cache tdb: many chains, so unrelated keys rarely share a lock
CACHE_HASH_SIZE = 10007
NODE_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
#: how often a process looks for a (re)started agent when none is live
_RECHECK_SECONDS = 0.5


class NotLive(FencedOut):
    """The agent's lease stopped being live before the cache took a lock:
    nothing was done, and the adapter does the call without the cache."""


def node_marker(name: bytes, lease_id: int) -> bytes:
    return NODE_MARK + name + b":%x" % lease_id


def marker_node(marker: bytes) -> bytes | None:
    """The node name in a lock key's value, or None if a process holds it."""
    if not marker.startswith(NODE_MARK):
        return None
    return marker[len(NODE_MARK):].rpartition(b":")[0] or None


def check_node_name(name: str) -> str:
    if not NODE_NAME.fullmatch(name):
        raise ConfigError(f"node name {name!r}: use 1-64 letters, digits, '.', '_' or '-'")
    return name


def nodes_prefix(prefix: bytes) -> bytes:
    """``<prefix>/_nodes/``: agents' registrations and release requests."""
    return prefix + b"/_nodes/"


def request_prefix(prefix: bytes, node: bytes) -> bytes:
    """Release requests for ``node``: the requested lock key follows."""
    return nodes_prefix(prefix) + node + b"/r/"


def cache_file(cache_dir: str | Path, db_base: bytes) -> Path:
    """The local tdb for the database whose etcd prefix ends in ``db_base``."""
    return Path(cache_dir) / (db_base.decode("utf-8", "surrogateescape") + ".tdb")


def pack_record(lease_id: int, revision: int, value: bytes | None) -> bytes:
    if value is None:
        return HEADER.pack(lease_id, revision, FLAG_DELETED)
    return HEADER.pack(lease_id, revision, 0) + value


def unpack_record(record: bytes) -> tuple[int, int, bytes | None]:
    """(lease, revision, value or None) of a cached record."""
    lease_id, revision, flags = HEADER.unpack_from(record)
    return lease_id, revision, None if flags & FLAG_DELETED else record[HEADER.size:]


class NodeState:
    """The agent's state, read by every process of the node through mmap."""

    def __init__(self, cache_dir: str | Path) -> None:
        self.path = Path(cache_dir) / STATE_FILE
        self._map: mmap.mmap | None = None
        self._inode = -1
        self._next_check = 0.0
        # now, while smbd is still root: its client processes switch to the
        # user's uid, and a later first open could be refused
        self._reopen()

    def current(self) -> tuple[int, bytes]:
        """(lease id, node name) to take new locks under, else (0, b"")."""
        lease_id, name, draining = self._live()
        return (0, b"") if draining else (lease_id, name)

    def lease(self) -> int:
        """The node lease while it is surely alive (draining or not), else 0."""
        return self._live()[0]

    def agent_pid(self) -> int:
        """The pid of the agent that wrote the state (0: none yet)."""
        self._reopen()
        return STATE_FORMAT.unpack_from(self._map)[2] if self._map is not None else 0

    def _live(self) -> tuple[int, bytes, int]:
        now = time.monotonic()
        live = self._read(now)
        if live[0] or now < self._next_check:
            return live
        self._next_check = now + _RECHECK_SECONDS
        if self._reopen():
            return self._read(now)
        return live

    def _read(self, now: float) -> tuple[int, bytes, int]:
        mapped = self._map
        if mapped is None:
            return 0, b"", 0
        for _ in range(4):  # a torn read sees an odd or changed counter
            magic, seq, _pid, lease_id, valid_until, draining, name = STATE_FORMAT.unpack_from(mapped)
            if magic != STATE_MAGIC or seq & 1:
                continue
            if struct.unpack_from("<I", mapped, 4)[0] != seq:
                continue
            if now < valid_until:
                return lease_id, name.rstrip(b"\0"), draining
            return 0, b"", 0
        return 0, b"", 0

    def _reopen(self) -> bool:
        """Map the state file again if the agent replaced it (a restart)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return False
        try:
            st = os.fstat(fd)
            if st.st_ino == self._inode or st.st_size < STATE_FORMAT.size:
                return False
            mapped = mmap.mmap(fd, STATE_FORMAT.size, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        if self._map is not None:
            self._map.close()
        self._map, self._inode = mapped, st.st_ino
        return True

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
            self._inode = -1


class StateWriter:
    """The agent's side of the state file."""

    def __init__(self, cache_dir: str | Path, node: str) -> None:
        self.path = Path(cache_dir) / STATE_FILE
        self._name = node.encode()
        self._seq = 0
        self._mutex = threading.Lock()  # the keepalive thread publishes too
        self._lease_id = 0
        self._valid_until = 0.0
        self._draining = False
        temp = self.path.with_suffix(f".new.{os.getpid()}")
        with open(temp, "wb") as f:
            f.write(STATE_FORMAT.pack(STATE_MAGIC, 0, os.getpid(), 0, 0.0, 0, self._name))
        fd = os.open(temp, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, STATE_FORMAT.size)
        finally:
            os.close(fd)
        os.replace(temp, self.path)

    def publish(self, lease_id: int, valid_until: float) -> None:
        with self._mutex:
            self._lease_id, self._valid_until = lease_id, valid_until
            self._write()

    def drain(self) -> None:
        """Processes take no new locks through the cache; held ones stay valid."""
        with self._mutex:
            self._draining = True
            self._write()

    def withdraw(self) -> None:
        """Processes stop trusting the node lease at once."""
        self.publish(0, 0.0)

    def _write(self) -> None:
        self._seq += 1  # odd: readers retry
        struct.pack_into("<I", self._map, 4, self._seq)
        STATE_FORMAT.pack_into(self._map, 0, STATE_MAGIC, self._seq, os.getpid(), self._lease_id,
                               self._valid_until, int(self._draining), self._name)
        self._seq += 1
        struct.pack_into("<I", self._map, 4, self._seq)

    def remove(self) -> None:
        self.withdraw()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        self._map.close()


class NodeCache:
    """The record operations of one volatile database on the node cache.

    ``migrate_in(key, lease, marker)`` is the adapter's: it takes the record's
    lock key for the node and returns (value, create_revision). Every public
    lock or read raises NotLive, having done nothing, when the agent's lease
    is not live; the adapter then does the operation without the cache.
    """

    def __init__(self, cache_dir: str | Path, db_base: bytes, migrate_in, mode: int = 0o600) -> None:
        # here, not at the top: a process without the cache never loads the tdb adapter
        from dbwrap_py.adapter import TDB_SEQNUM, DatabaseSpec
        from dbwrap_py.adapters.tdb import TdbAdapter
        from dbwrap_py.options import Options

        self.state = NodeState(cache_dir)
        spec = DatabaseSpec(name=str(cache_file(cache_dir, db_base)), hash_size=CACHE_HASH_SIZE,
                            tdb_flags=TDB_SEQNUM, open_flags=os.O_RDWR | os.O_CREAT, mode=mode)
        self.local = TdbAdapter(spec, Options({"native_records": "no"}))
        self._migrate_in = migrate_in
        #: lease id (and create_revision) our locks were taken under, per key
        self.held: dict[bytes, tuple[int, int]] = {}
        #: revision of the last CLEAR_IF_FIRST wipe: older ownerships are void
        self.wipe_revision = 0

    def live(self) -> int:
        """The node lease while it can be trusted, else 0."""
        return self.state.current()[0]

    def _valid(self, record: bytes | None, lease_id: int) -> bool:
        if record is None:
            return False
        owner, revision, _ = unpack_record(record)
        return owner == lease_id and revision > self.wipe_revision

    def lock_get(self, key: bytes) -> bytes | None:
        lease_id, name = self.state.current()
        if not lease_id:
            raise NotLive("the node agent's lease is not live")
        self.local.lock(key)
        try:
            record = self.local.get(key)
            if self._valid(record, lease_id):
                _, revision, value = unpack_record(record)
            else:
                value, revision = self._migrate_in(key, lease_id, node_marker(name, lease_id))
                self.local.put(key, pack_record(lease_id, revision, value))
        except BaseException:
            self.local.unlock(key)
            raise
        self.held[key] = (lease_id, revision)
        return value

    def unlock(self, key: bytes) -> None:
        self.held.pop(key, None)
        self.local.unlock(key)

    def _fenced(self, key: bytes) -> tuple[int, int]:
        try:
            lease_id, revision = self.held[key]
        except KeyError:
            raise LockConflict(f"write to {key!r} without holding its record lock") from None
        if self.state.lease() != lease_id:
            raise FencedOut(f"the node lease {key!r} was migrated in under is gone")
        return lease_id, revision

    def put(self, key: bytes, value: bytes) -> None:
        lease_id, revision = self._fenced(key)
        self.local.put(key, pack_record(lease_id, revision, value))

    def remove(self, key: bytes) -> bool:
        lease_id, revision = self._fenced(key)
        record = self.local.get(key)
        existed = record is not None and unpack_record(record)[2] is not None
        self.local.put(key, pack_record(lease_id, revision, None))
        return existed

    def get(self, key: bytes) -> bytes | None:
        if key in self.held:  # our lock: the local copy is the record
            record = self.local.get(key)
            return unpack_record(record)[2] if record is not None else None
        lease_id = self.live()
        if not lease_id:
            raise NotLive("the node agent's lease is not live")
        record = self.local.get(key)
        if self._valid(record, lease_id):
            return unpack_record(record)[2]
        value = self.lock_get(key)  # not ours: migrate it in, as ctdb does
        self.unlock(key)
        return value

    def owned(self) -> Iterator[tuple[bytes, bytes | None]]:
        """The records this node owns now, None for deleted ones."""
        lease_id = self.live()
        for key, record in self.local.scan():
            if self._valid(record, lease_id):
                yield key, unpack_record(record)[2]

    def seqnum(self) -> int:
        return self.local.seqnum()

    def wipe(self) -> None:
        self.local.wipe()

    def after_fork(self) -> None:
        self.held.clear()
        self.local.after_fork()

    def close(self) -> None:
        self.local.close()
        self.state.close()
