"""The rados adapter's node-cache omap entries, and reading them (``ownership.py``, ``adapter.py``).

A bucket's records live in one object (``record_oid`` places keys by
bucket), and so does everything that says who owns them, as omap entries
beside the records (``<key>``: percent-encoded, ``<bb>``: the bucket in hex):

    o<key>  the token of a node's record lock       n<key>  its holder, "node:lease"
    B<bb>   the token of a node's bucket claim      N<bb>   its holder
    d<key>  the key was detached from the claim whose token it holds

Release requests: omap entries ``q<db>/<key>`` on the owner's node object
(``node_oid``), valued by a nonce (a request made again is a new one), then
``/node:lease`` if a node asked: whom ``hand_over`` gives the record to.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass

import rados

from dbwrap_py.adapters.rados import client as rc
from dbwrap_py.nodecache.layout import bucket_of
from dbwrap_py.nodecache.ownership_base import Held, holder_mark
from dbwrap_py.nodecache.ownership_base import parse_holder_mark as parse_holder

#: the node lease's cls_lock
LEASE_LOCK = "lease"


def node_oid(prefix: str, node: bytes) -> str:
    return f"{prefix}/_nodes/{node.decode()}"


@dataclass(frozen=True)
class Names:
    """The omap entries of one key (see the module docstring)."""

    record: str
    lock: str
    who: str
    claim: str
    claimer: str
    detached: str
    waiter: str

    @classmethod
    def of(cls, key: bytes) -> "Names":
        name, bucket = rc.encode_key(key), f"{bucket_of(key):02x}"
        return cls("k" + name, "o" + name, "n" + name, "B" + bucket, "N" + bucket, "d" + name, "w" + name)

    def all(self) -> list[str]:
        return [self.record, self.lock, self.who, self.claim, self.claimer, self.detached]


@dataclass(frozen=True)
class Holding:
    """Who holds a record, from its entries: a node's record lock, else a
    claim the key is not detached from, else nobody."""

    entry: str          # "" (nobody), Names.lock or Names.claim
    token: bytes = b""
    node: bytes = b""
    lease: int = 0

    @classmethod
    def read(cls, names: Names, found: Mapping[str, bytes]) -> "Holding":
        if names.lock in found:
            return cls(names.lock, found[names.lock], *parse_holder(found.get(names.who, b"")))
        claim = found.get(names.claim)
        if claim is not None and found.get(names.detached) != claim:
            return cls(names.claim, claim, *parse_holder(found.get(names.claimer, b"")))
        return cls("")

    def held_by(self, names: Names) -> Held | None:
        """The node's hold, for ``ownership_base.take_retrying``; None if nobody holds it."""
        return Held(self.node, self.lease, int(self.token, 16), self.entry == names.claim) if self.entry else None


def guard_free(op: rados.WriteOp, names: Names, found: Mapping[str, bytes]) -> None:
    """Fail the op unless the record is still as free as ``found`` says:
    no record lock, and no claim, or the same claim it was detached from."""
    eq = rados.LIBRADOS_CMPXATTR_OP_EQ
    op.omap_cmp(names.lock, "", eq)
    op.omap_cmp(names.claim, found.get(names.claim, b"").decode(), eq)
    op.omap_cmp(names.detached, found.get(names.detached, b"").decode(), eq)


class Leases:
    """Whether a node lease is live, as the OSD says (cls_lock get_info)."""

    def __init__(self, ops: rc.Ops, prefix: str) -> None:
        self.ops = ops
        self.prefix = prefix

    def live(self, node: bytes, lease: int) -> bool:
        return f"{lease:x}" in self.ops.lock_holders(node_oid(self.prefix, node), LEASE_LOCK, "node lease")


def request_entry(db_id: bytes, key: bytes) -> str:
    return f"q{rc.encode_key(db_id)}/{rc.encode_key(key)}"


def request_value(requester: bytes, lease: int) -> bytes:
    """A release request's value: a new nonce, so the agent hears a request
    made again as new; then the asking node's ``node:lease`` if a node asks."""
    nonce = b"%x" % secrets.randbits(63)
    return nonce + b"/" + holder_mark(requester, lease) if requester else nonce


def request_holder(value: bytes) -> tuple[bytes, int] | None:
    """The asking node and its lease, from a request's value; None if a process asked."""
    _, by_node, mark = value.partition(b"/")
    return parse_holder(mark) if by_node else None


def parse_request(entry: str) -> tuple[bytes, bytes] | None:
    db, slash, key = entry[1:].partition("/")
    return (rc.decode_key(db), rc.decode_key(key)) if entry.startswith("q") and slash else None


def all_entries(ops: rc.Ops, oid: str) -> tuple[dict[str, bytes], int]:
    """Every omap entry of ``oid`` and the version they are of (0: no object)."""
    entries: dict[str, bytes] = {}
    after, version = "", 0
    while True:
        page, seen = ops.page(oid, after, "", "claim")
        version = version or seen
        entries.update(page)
        if len(page) < rc.OMAP_PAGE:
            return entries, version
        after = page[-1][0]


def bucket_entries(entries: Mapping[str, bytes], bucket: int) -> tuple[dict[bytes, bytes], list[str]] | None:
    """From an object's ``entries``: ``bucket``'s records, and the entries of
    its (dead) claim to clear with a new one (its own, its detached marks);
    None if a node holds a record lock in it."""
    records: dict[bytes, bytes] = {}
    stale = [name for name in (f"B{bucket:02x}", f"N{bucket:02x}") if name in entries]
    for name, value in entries.items():
        kind, key = name[0], rc.decode_key(name[1:]) if name[0] in "kond" else b""
        if kind not in "kond" or bucket_of(key) != bucket:
            continue
        if kind == "k":
            records[key] = value
        elif kind == "o":
            return None
        elif kind == "d":
            stale.append(name)
    return records, stale
