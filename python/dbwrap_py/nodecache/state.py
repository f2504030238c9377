"""The node agent's state, shared with every process of the node through mmap.

The file ``<node_cache_dir>/node.state`` holds, at fixed offsets (the C
fast path reads the same layout, c_bridge/../nodecache_state.h):

* a header: magic, a sequence counter (odd while the agent writes), the
  agent's pid, the node lease, until when the lease is surely alive on
  CLOCK_MONOTONIC (one clock for every process of the host: the send time of
  the last answered keepalive plus the granted TTL, less a margin), whether
  the agent is draining (processes take no new records) or has stopped (the
  node owns nothing: processes go to the store directly), and the node name;
* the *wanted* table: ``WANTED_SLOTS`` 64-bit slots, open addressing with
  linear probing. A slot is free (0), dead (1: probing goes on past it), or
  a wanted record: its hash with the top bit set, for a record another node
  asked for while a process of this node held it. The process checks the
  table when it lets the record go, and hands the record over itself: the
  agent cannot take a lock that smbd's processes keep taking.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
import zlib
from pathlib import Path

STATE_FILE = "node.state"
MAGIC = b"DBWN"
#: magic, seq, pid, lease, valid_until, draining, name
HEADER = struct.Struct("<4sIIxxxxqdI4x64s")
WANTED_OFFSET = 128
WANTED_SLOTS = 1024
SIZE = WANTED_OFFSET + 8 * WANTED_SLOTS
_SEQ_OFFSET = 4
#: how often a process looks for a (re)started agent when none is live
RECHECK_SECONDS = 0.5
RUNNING, DRAINING, STOPPED = 0, 1, 2

FREE = 0
DEAD = 1
_WANTED_BIT = 1 << 63
PROBES = 16


def record_hash(db_id: bytes, key: bytes) -> int:
    """CRC-32 of ``db_id`` and of ``key`` (zlib's, in C here and in the fast
    path), with the top bit set: never FREE or DEAD. A collision only makes
    a holder hand a record over that nobody asked for."""
    return (zlib.crc32(db_id) << 32 | zlib.crc32(key)) | _WANTED_BIT


def _probe(h: int) -> list[int]:
    """The slots a hash may sit in."""
    start = h % WANTED_SLOTS
    return [(start + i) % WANTED_SLOTS for i in range(PROBES)]


class NodeState:
    """A process's view of the agent's state."""

    def __init__(self, cache_dir: str | Path) -> None:
        self.path = Path(cache_dir) / STATE_FILE
        self._map: mmap.mmap | None = None
        self._inode = -1
        self._next_check = 0.0
        # now, while smbd is still root: its client processes switch to the
        # user's uid, and a later first open could be refused
        self._reopen()

    def configured(self) -> bool:
        """Whether an agent serves this cache directory: running, restarting,
        or late with its lease. Not before the first one started, nor after
        one stopped (having handed everything back)."""
        if self._map is None and not self._reopen():
            return False
        status = self._header()[5]
        if status == STOPPED:
            self._reopen()  # a new agent may have replaced the file
            status = self._header()[5]
        return status != STOPPED

    def current(self) -> tuple[int, bytes]:
        """(lease id, node name) to take new records under, else (0, b"")."""
        lease_id, name, status = self._live()
        return (0, b"") if status != RUNNING else (lease_id, name)

    def lease(self) -> int:
        """The node lease while it is surely alive (draining or not), else 0."""
        return self._live()[0]

    def node_name(self) -> bytes:
        """The node's name, live lease or not."""
        if self._map is None and not self._reopen():
            return b""
        return self._header()[6].rstrip(b"\0")

    def agent_pid(self) -> int:
        self._reopen()
        return self._header()[2] if self._map is not None else 0

    def wanted(self, db_id: bytes, key: bytes) -> bool:
        """Whether another node waits for this record (one probe sequence, no lock)."""
        mapped = self._map
        if mapped is None:
            return False
        h = record_hash(db_id, key)
        for slot in _probe(h):
            value = struct.unpack_from("<Q", mapped, WANTED_OFFSET + 8 * slot)[0]
            if value == h:
                return True
            if value == FREE:
                return False
        return False

    def _header(self) -> tuple:
        """A consistent copy: retried while the agent is writing (odd counter)."""
        mapped = self._map
        for attempt in range(10000):
            fields = HEADER.unpack_from(mapped)
            if fields[1] & 1 == 0 and struct.unpack_from("<I", mapped, _SEQ_OFFSET)[0] == fields[1]:
                return fields
            if attempt > 8:
                time.sleep(0)  # the writer was descheduled mid-write: let it finish
        return fields

    def _live(self) -> tuple[int, bytes, int]:
        now = time.monotonic()
        live = self._read(now)
        if live[0] or now < self._next_check:
            return live
        self._next_check = now + RECHECK_SECONDS
        if self._reopen():
            return self._read(now)
        return live

    def _read(self, now: float) -> tuple[int, bytes, int]:
        if self._map is None:
            return 0, b"", 0
        magic, _seq, _pid, lease_id, valid_until, draining, name = self._header()
        if magic != MAGIC or now >= valid_until:
            return 0, b"", 0
        return lease_id, name.rstrip(b"\0"), draining

    def _reopen(self) -> bool:
        """Map the state file again if the agent replaced it (a restart)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return False
        try:
            st = os.fstat(fd)
            if st.st_ino == self._inode or st.st_size < SIZE:
                return False
            mapped = mmap.mmap(fd, SIZE, prot=mmap.PROT_READ)
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

    def __init__(self, cache_dir: str | Path, node: bytes) -> None:
        self.path = Path(cache_dir) / STATE_FILE
        self._name = node
        self._seq = 0
        self._mutex = threading.Lock()  # the keepalive thread publishes too
        self._lease_id = 0
        self._valid_until = 0.0
        self._status = RUNNING
        temp = self.path.with_suffix(f".new.{os.getpid()}")
        with open(temp, "wb") as f:
            f.write(bytes(SIZE))
        os.chmod(temp, 0o644)  # smbd's processes read it as the user
        fd = os.open(temp, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self._write()
        os.replace(temp, self.path)

    def publish(self, lease_id: int, valid_until: float) -> None:
        with self._mutex:
            self._lease_id, self._valid_until = lease_id, valid_until
            self._write()

    def drain(self) -> None:
        """Processes take no new records; held ones stay valid."""
        with self._mutex:
            self._status = DRAINING
            self._write()

    def withdraw(self) -> None:
        """Processes stop trusting the node lease at once."""
        self.publish(0, 0.0)

    def _slot_value(self, slot: int) -> int:
        return struct.unpack_from("<Q", self._map, WANTED_OFFSET + 8 * slot)[0]

    def _set_slot(self, slot: int, value: int) -> None:
        struct.pack_into("<Q", self._map, WANTED_OFFSET + 8 * slot, value)  # one aligned store

    def want(self, db_id: bytes, key: bytes) -> bool:
        """Mark a record as wanted; False if its probe sequence is full (the
        agent then keeps trying to take the record itself)."""
        h = record_hash(db_id, key)
        with self._mutex:
            slots = _probe(h)
            if any(self._slot_value(slot) == h for slot in slots):
                return True
            for slot in slots:
                if self._slot_value(slot) in (FREE, DEAD):
                    self._set_slot(slot, h)
                    return True
        return False

    def unwant(self, db_id: bytes, key: bytes) -> None:
        """The record is handed over: its slot becomes dead."""
        h = record_hash(db_id, key)
        with self._mutex:
            for slot in _probe(h):
                if self._slot_value(slot) == h:
                    self._set_slot(slot, DEAD)
                    return

    def clear_dead(self) -> None:
        """With nothing wanted, dead slots become free again (probing ends at
        a free slot, so this is safe only when no slot is wanted)."""
        with self._mutex:
            for slot in range(WANTED_SLOTS):
                if self._slot_value(slot) == DEAD:
                    self._set_slot(slot, FREE)

    def _write(self) -> None:
        self._seq += 1  # odd: readers retry
        struct.pack_into("<I", self._map, _SEQ_OFFSET, self._seq)
        HEADER.pack_into(self._map, 0, MAGIC, self._seq, os.getpid(), self._lease_id,
                         self._valid_until, self._status, self._name)
        self._seq += 1
        struct.pack_into("<I", self._map, _SEQ_OFFSET, self._seq)

    def remove(self) -> None:
        """The node owns nothing now: processes go to the store directly."""
        with self._mutex:
            self._lease_id, self._valid_until, self._status = 0, 0.0, STOPPED
            self._write()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        self._map.close()
