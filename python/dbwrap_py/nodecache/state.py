"""The node agent's state, shared with every process of the node through mmap.

The file ``<node_cache_dir>/node.state`` holds, at fixed offsets (the C
reader, ``_fastpath.State``, has the same layout in
``c_core/nodecache_layout.h``; this module writes it):

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
from dataclasses import dataclass
from pathlib import Path

from dbwrap_py.nodecache import _fastpath
from dbwrap_py.safe_files import temp_file

STATE_FILE = "node.state"
MAGIC = b"DBWN"
#: magic, seq, pid, lease, valid_until, draining, name
HEADER = struct.Struct("<4sIIxxxxqdI4x64s")
WANTED_OFFSET = 128
WANTED_SLOTS = 1024
SIZE = WANTED_OFFSET + 8 * WANTED_SLOTS
_SEQ_OFFSET = 4
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


#: a process's view of the agent's state: the C reader
#: (c_core/nodecache_core.c), which the fast path uses too. current() ->
#: (lease, node name) to take new records under, else (0, b""); lease() ->
#: the node lease while surely alive;
#: configured(); node_name(); agent_pid(); wanted(db_id, key); close().
NodeState = _fastpath.State


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
        # written whole under a name nobody can foresee, then renamed over
        # the path (a link planted at either is never followed); 0644:
        # smbd's processes read it as the user
        fd, temp = temp_file(self.path.parent, f".{STATE_FILE}.", 0o644)
        try:
            if os.write(fd, bytes(SIZE)) != SIZE:  # blocks allocated now, not at a store through the map
                raise OSError(f"{temp}: short write")
            self._map = mmap.mmap(fd, SIZE)
        except BaseException:
            os.unlink(temp)
            raise
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


_STATUS_NAMES = {RUNNING: "running", DRAINING: "draining", STOPPED: "stopped"}


@dataclass(frozen=True)
class StateHeader:
    """The state file's header as ``dbwrap-py status`` shows it."""

    agent_pid: int
    lease_id: int
    valid_until: float  # CLOCK_MONOTONIC; 0: no live lease published
    status: str
    node: str


def read_header(cache_dir: str | Path, tries: int = 100) -> StateHeader:
    """The header of ``cache_dir``'s state file, read whole between two of
    the agent's writes (FileNotFoundError: no agent serves the directory;
    ValueError: not a state file)."""
    path = Path(cache_dir) / STATE_FILE
    for _ in range(tries):
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            data = os.pread(fd, HEADER.size, 0)
        finally:
            os.close(fd)
        if len(data) < HEADER.size:
            raise ValueError(f"{path}: {len(data)} bytes, not a node agent's state file")
        magic, seq, pid, lease, valid_until, status, name = HEADER.unpack(data)
        if magic != MAGIC:
            raise ValueError(f"{path}: not a node agent's state file (magic {magic!r})")
        if seq % 2 == 0:
            return StateHeader(pid, lease, valid_until, _STATUS_NAMES.get(status, f"status {status}"),
                               name.rstrip(b"\0").decode("utf-8", "replace"))
        time.sleep(0.001)  # the agent is writing it
    raise ValueError(f"{path}: the agent kept writing it; try again")
