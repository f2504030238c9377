"""How the node keeps what it owns: local records, and its buckets.

Each database the node caches has two local tdb files in the node cache
directory, named by the adapter's database id:

* ``<db_id>.tdb``: the records. Each value starts with a header, then the
  record's value: the node lease it was taken under, its token, and flags.
  A record is the node's only while that lease is the live one and its
  token is newer than the database's last CLEAR_IF_FIRST wipe.
* ``<db_id>.buckets.tdb``: the buckets the node holds, keyed by number: the
  lease, the token, and the keys the store had in the bucket when the node
  claimed it (a key of the node's bucket that is neither there nor in the
  local records does not exist: a new record needs no round trip).

The C rules read the same layout (c_core/nodecache_layout.h, read by
c_core/nodecache_core.c).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

#: lease, token, flags
HEADER = struct.Struct("<qqB")
DELETED = 1      # a tombstone: deleted while the node owns it
VIA_BUCKET = 2   # owned through the node's bucket, not a record lock
IN_STORE = 4     # the store has a copy, so a delete must reach it
DETACHED = 8     # a key of the node's bucket handed to another node: no longer the bucket's
BUCKETS = 256
#: lease, token, count of keys that follow (each: 4-byte length, the key)
BUCKET_HEADER = struct.Struct("<qqI")
_LEN = struct.Struct("<I")


def bucket_of(key: bytes) -> int:
    """The key's bucket: zlib's CRC-32, as the C fast path computes it."""
    return zlib.crc32(key) % BUCKETS


@dataclass(frozen=True)
class Local:
    """A record as the local tdb keeps it."""

    lease: int
    token: int
    flags: int
    value: bytes | None  # None: deleted, or detached

    @property
    def via_bucket(self) -> bool:
        return bool(self.flags & VIA_BUCKET)

    def pack(self) -> bytes:
        """A value of None is kept as a tombstone (DELETED), never as b""."""
        flags = self.flags | DELETED if self.value is None and not self.flags & DETACHED else self.flags
        return HEADER.pack(self.lease, self.token, flags) + (self.value or b"")

    @classmethod
    def unpack(cls, raw: bytes) -> "Local":
        lease, token, flags = HEADER.unpack_from(raw)
        value = None if flags & (DELETED | DETACHED) else raw[HEADER.size:]
        return cls(lease, token, flags, value)


@dataclass(frozen=True)
class Bucket:
    lease: int
    token: int
    #: the keys the store held in the bucket when the node claimed it
    stored: frozenset[bytes]

    def pack(self) -> bytes:
        parts = [BUCKET_HEADER.pack(self.lease, self.token, len(self.stored))]
        for key in sorted(self.stored):
            parts += [_LEN.pack(len(key)), key]
        return b"".join(parts)

    @classmethod
    def unpack(cls, raw: bytes) -> "Bucket":
        lease, token, count = BUCKET_HEADER.unpack_from(raw)
        keys, offset = [], BUCKET_HEADER.size
        for _ in range(count):
            (size,) = _LEN.unpack_from(raw, offset)
            offset += _LEN.size
            keys.append(raw[offset:offset + size])
            offset += size
        return cls(lease, token, frozenset(keys))


def bucket_key(bucket: int) -> bytes:
    return b"%d" % bucket
