"""The zookeeper adapter's side of the node cache (dbwrap_py.nodecache.protocol).

A node lease is the agent's session: ephemeral ``<prefix>/_nodes/a/<node>``
(one live agent a name) and ``l/n<lease>``, the lease's fence, which every
take and claim checks. Ownership is persistent znodes (processes make them)
valued ``<node>:<lease>:<token>``: ``l/k<key>`` a record lock (a process's
own is ephemeral and empty: the two exclude each other), ``l/b<bb>`` a
bucket claim, each with a fence ``f/k<key>.<token>`` / ``f/b<bb>.<token>``
that every write-back checks; ``f/x<key>.<token>`` marks a key detached
from claim ``token``. Whoever meets an ownership whose lease fence is gone
removes it. Release requests: ephemeral ``_nodes/r/<node>/<db>.<key>`` (hex)
of the asker's session, valued ``<node>:<lease>`` when a node asks (empty
for a process), watched by the agent; a hand-over puts the record lock on
that lease in its write-back's multi. docs/adapters/zookeeper.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

from kazoo.exceptions import NodeExistsError

from dbwrap_py.adapters.zookeeper.client import Op, Session, record_ops
from dbwrap_py.errors import FencedOut, Unavailable
from dbwrap_py.nodecache.layout import bucket_of
from dbwrap_py.nodecache.ownership_base import (
    ServedOwnership,
    holder_mark,
    new_token,
    parse_holder_mark,
    wipe_revision as _wipe_revision,
)
from dbwrap_py.nodecache.protocol import Claim, OwnedElsewhere, Taken

RANDOM_BITS = 32
#: records written back in one multi (under jute.maxbuffer for small records)
CHUNK = 50


def generation_of(root: str) -> int:
    """The number of the generation at ``root`` (``.../g<n>``; 0 for others)."""
    name = root.rsplit("/", 1)[-1]
    return int(name[1:]) if name[:1] == "g" and name[1:].isdigit() and len(name) < 10 else 0


def wipe_revision(root: str) -> int:
    return _wipe_revision(generation_of(root), RANDOM_BITS)


def znode(root: str, kind: str, key: bytes, token: int | None = None) -> str:
    """``key``'s znode: ``d`` its record, ``l`` its lock, ``b`` its bucket's
    claim; with ``token``, the fence of that lock (``l``) or claim (``b``),
    or the key's mark detached from claim ``token`` (``x``)."""
    name = f"b{bucket_of(key):02x}" if kind == "b" else f"{'x' if kind == 'x' else 'k'}{key.hex()}"
    folder = "d" if kind == "d" else "l" if token is None else "f"
    return f"{root}/{folder}/{name}" + ("" if token is None else f".{token}")


def lease_path(nodes: str, lease: int) -> str:
    return f"{nodes}/l/n{lease:x}"


class Holder(NamedTuple):
    """A node's ownership, as a lock's or claim's data."""

    node: bytes
    lease: int
    token: int

    def encode(self) -> bytes:
        return b"%s:%x:%d" % self

    @classmethod
    def parse(cls, data: bytes | None) -> Holder | None:
        if not data:  # missing, or a process's own lock
            return None
        node, lease, token = data.rsplit(b":", 2)
        return cls(node, int(lease, 16), int(token))


class ZkOwnership(ServedOwnership):
    """One database's ownership operations: on a process's session (``root``
    its generation), or the agent's (``root`` None: the token's generation,
    else the current one)."""

    def __init__(self, zk: Callable[[], Session], base: str, root: str | None, op_timeout: float,
                 marks: dict[str, tuple[bytes, int]] | None = None) -> None:
        self.zk, self.base, self.fixed_root, self.op_timeout = zk, base, root, op_timeout
        #: the agent's: each standing request's data and version as its listing read them (each used once)
        self.marks = marks if marks is not None else {}
        self.nodes = base.rsplit("/", 1)[0] + "/_nodes"
        self.db = base.rsplit("/", 1)[-1].encode()
        #: bucket -> the other node's claim last met on it: a take in it looks at that
        #: holder's lease fence and the key's detached mark in its first round trip
        self._claims: dict[int, Holder] = {}
        #: key -> the hold that last refused this process's take (and whether by
        #: its bucket): a request for it is made only while that hold stands
        self._refusals: dict[bytes, tuple[Holder, bool]] = {}

    def root(self, token: int = 0) -> str:
        if self.fixed_root is not None:
            return self.fixed_root
        if token >> RANDOM_BITS:
            return f"{self.base}/g{token >> RANDOM_BITS}"
        return f"{self.base}/{(self.zk().get_many([self.base + '/o'])[0] or b'p').decode()}"

    def _request(self, node: bytes, key: bytes) -> str:
        return f"{self.nodes}/r/{node.decode()}/{self.db.hex()}.{key.hex()}"

    def new_token(self) -> int:
        return new_token(generation_of(self.root()), RANDOM_BITS)

    def live(self, holder: Holder) -> bool:
        return self.zk().stat(lease_path(self.nodes, holder.lease)) is not None

    def lock(self, key: bytes, token: int, holder: Holder | None) -> tuple[bool, Holder | None, bool]:
        """Take ``key``'s record lock for ``holder`` (None: this process,
        ephemeral); else (False, the node that holds it, whether by its
        bucket; None for a process), and a process asks that node to hand it
        back. Dead holders met on the way are removed."""
        return self._lock(key, token, holder)[:3]

    def _lock(self, key: bytes, token: int, holder: Holder | None) -> tuple[bool, Holder | None, bool, bytes | None]:
        """``lock``'s answer and the record's value, read in the take's
        round trip (right after its multi: the session's order). A refusal
        looks at the holder's lease fence and the key's detached mark (no
        lease for our own hold: the multi checked it): in the same round
        trip for the claim this ownership last met on the bucket (a refused
        claim's, a waiter's tries), else in one more."""
        root, zk, bucket = self.root(), self.zk(), bucket_of(key)
        pre: list[Op] = [] if holder is None else [("check", lease_path(self.nodes, holder.lease))]
        claim, detached_from = znode(root, "b", key), 0
        reads = [znode(root, "l", key), claim, znode(root, "d", key)]
        mine = (holder.node, holder.lease) if holder is not None else None
        for _ in range(8):
            unclaimed: list[Op] = ([("create", claim, b"", False), ("delete", claim)] if not detached_from else
                                   [("check", znode(root, "x", key, detached_from)),
                                    ("check", znode(root, "b", key, detached_from))])
            guess = self._claims.get(bucket) if not detached_from else None
            failed, (locked, claimed, value), _, early = zk.multi_reading(
                [*pre, ("create", znode(root, "l", key), holder.encode() if holder else b"", not holder),
                 ("create", znode(root, "l", key, token), b"", not holder), *unclaimed], reads,
                stats=self._looks(root, key, guess) if guess is not None else ())
            if failed is None:
                return True, None, False, value
            at, detached_from = failed[0] - len(pre), 0
            kind = "l" if at == 0 else "b"
            if at < 0:
                raise FencedOut(f"zookeeper: node lease {holder.lease:x} is gone" if holder else "")
            if at == 1 or (at == 0 and not isinstance(failed[1], NodeExistsError)):
                raise Unavailable(f"zookeeper: taking the lock of {key!r}: {failed[1]!r}")
            owner = Holder.parse(locked if at == 0 else claimed)
            handed = Holder.parse(locked)
            if handed is not None and (handed.node, handed.lease) == mine:
                return False, handed, False, value  # a hand-over to us landed after the multi, before the reads
            if owner is None:
                return False, None, False, value  # a process's lock, or gone meanwhile: the caller tries again
            ours = (owner.node, owner.lease) == mine
            if at != 0 and not ours:
                self._met(bucket, owner)
            looks = ([] if ours else [lease_path(self.nodes, owner.lease)]) + \
                ([] if at == 0 else [znode(root, "x", key, owner.token)])
            if at != 0 and owner == guess and early:
                found = early  # looked at in the take's own round trip
            else:
                found = zk.stat_many(looks) if looks else []
            if not ours and found[0] is None:  # its lease is gone: so is the hold
                self._claims.pop(bucket, None)
                zk.multi([("delete", znode(root, kind, key, owner.token)), ("delete", znode(root, kind, key))])
            elif at == 0 or found[-1] is None:
                if holder is None:
                    self.request_release(key, owner.node, 0)
                else:
                    self._refused(key, owner, at != 0)
                return False, owner, at != 0, value
            else:
                detached_from = owner.token  # from the claim: record by record
        raise Unavailable(f"zookeeper: the lock of {key!r} kept changing hands")

    def _looks(self, root: str, key: bytes, claim: Holder) -> list[str]:
        """What a take refused by ``claim`` looks at: its lease fence, and the key's detached mark."""
        return [lease_path(self.nodes, claim.lease), znode(root, "x", key, claim.token)]

    def _met(self, bucket: int, claim: Holder) -> None:
        if len(self._claims) >= 1024:  # buckets of claims long gone: forget them
            self._claims.clear()
        self._claims[bucket] = claim

    def read(self, key: bytes) -> tuple[bytes | None, bool]:
        """A process's read of ``key``: its value, and whether a node may own it."""
        value, *held = self.zk().get_many([znode(self.root(), kind, key) for kind in "dlb"])
        return value, any(map(Holder.parse, held))

    def take(self, key: bytes, node: bytes, lease: int) -> Taken:
        """One round trip (the record read with the take's multi), two if
        refused by a hold not met before (``_lock``)."""
        token = self.new_token()
        taken, owner, via_bucket, value = self._lock(key, token, Holder(node, lease, token))
        if owner is not None and (owner.node, owner.lease) == (node, lease):
            token = owner.token  # our bucket's, a hand-over's to us, or a taker of ours died before keeping it
        elif not taken:
            raise OwnedElsewhere(owner.node if owner else None, f"{key!r} is held")
        self._refusals.pop(key, None)
        return Taken(value, token, via_bucket)

    def claim(self, bucket: int, node: bytes, lease: int) -> Claim | None:
        """One round trip: the multi, then the claim read and ``l/`` and
        ``d/`` listed behind it (the listings left out where another node's
        claim was met on the bucket: the multi will most likely fail); one
        more to read the bucket's records, if the store has any."""
        root, zk, token = self.root(), self.zk(), self.new_token()
        path, fence = f"{root}/l/b{bucket:02x}", f"{root}/f/b{bucket:02x}.{token}"
        listed = [f"{root}/l", f"{root}/d"] if bucket not in self._claims else []
        failed, (claimed,), names, _ = zk.multi_reading(
            [("check", lease_path(self.nodes, lease)), ("create", fence, b"", False),
             ("create", path, Holder(node, lease, token).encode(), False)], [path], listed)
        if failed is not None and failed[0] == 0:
            raise FencedOut(f"zookeeper: node lease {lease:x} is gone")
        if failed is not None:
            other = Holder.parse(claimed)
            if other is not None and (other.node, other.lease) != (node, lease):
                self._met(bucket, other)  # the take that follows looks at it at once
            return None
        self._claims.pop(bucket, None)
        held, stored = names if names else (zk.children(f"{root}/l"), zk.children(f"{root}/d"))
        if any(n[0] == "k" and bucket_of(bytes.fromhex(n[1:])) == bucket for n in held):
            zk.multi([("delete", fence), ("delete", path)])  # a record lock in it: not now
            return None
        keys = [k for k in map(bytes.fromhex, (n[1:] for n in stored)) if bucket_of(k) == bucket]
        values = zk.get_many([znode(root, "d", key) for key in keys]) if keys else []
        return Claim(token, {key: value for key, value in zip(keys, values) if value is not None})

    def request_release(self, key: bytes, owner: bytes, requester_lease: int, requester: bytes = b"") -> None:
        """The request names the asking node, for ``hand_over``. NodeExists:
        asked already, and the request standing keeps its asker."""
        if not requester:
            self.zk().multi([("create", self._request(owner, key), b"", True)])
        else:  # a node's waiter asks again after ASK_AGAIN and reads no answer: sent unwaited, its next take after it
            self.zk().send([*self._still_held(key),
                            ("create", self._request(owner, key), holder_mark(requester, requester_lease), True)])

    def _refused(self, key: bytes, owner: Holder, by_bucket: bool) -> None:
        if len(self._refusals) >= 1024:  # keys whose waiters gave up
            self._refusals.clear()
        self._refusals[key] = (owner, by_bucket)

    def _still_held(self, key: bytes) -> list[Op]:
        """What fails a node's request unless the hold that last refused its
        take still stands: a request sent again after a hand-over to the
        asker landed would stand for nothing, and the holder's agent would
        spend a round trip on it (``let_go``) while real requests wait."""
        refusal = self._refusals.get(key)
        if refusal is None:
            return []
        (owner, by_bucket), root = refusal, self.root()
        if not by_bucket:
            return [("check", znode(root, "l", key, owner.token))]
        detached = znode(root, "x", key, owner.token)  # the claim stands and the key is not detached from it
        return [("check", znode(root, "b", key, owner.token)), ("create", detached, b"", False), ("delete", detached)]

    def write_back_fenced(self, key: bytes, value: bytes | None, token: int, via_bucket: bool,
                          to: Holder | None = None, asked: tuple[str, int] = ("", -1)) -> bool:
        """With ``to``, the same multi makes the record that holder's (its
        lock and fence, its lease fence checked) and deletes the release
        request ``asked`` (path, version): False as well if any of that fails."""
        root = self.root(token)
        fence = znode(root, "b" if via_bucket else "l", key, token)
        end: list[Op] = ([("create", znode(root, "x", key, token), b"", False)] if via_bucket else
                         [("delete", fence), ("delete", znode(root, "l", key))])
        if to is not None:
            end += [("create", znode(root, "l", key), to.encode(), False),
                    ("create", znode(root, "l", key, to.token), b"", False),
                    ("check", lease_path(self.nodes, to.lease)), ("delete", *asked)]
        return self.zk().write(znode(root, "d", key), f"{root}/s", [("check", fence), *end], value, together=True)

    def hand_over(self, key: bytes, value: bytes | None, token: int, via_bucket: bool,
                  node: bytes, lease: int) -> bool:
        """The request read (unless the agent's listing read it as it
        came), then one multi: the write-back, the requester's lock put on
        its lease with a new token of the generation, as its own take
        would, and the request deleted at the version read. The old lock goes in the same multi, so the
        holder's own waiters never find the record free. Refused (the
        token lost, the requester's lease gone, the request changed), and
        for a process's request (no node named), a plain write-back: the
        record free, the request deleted if unchanged."""
        asked = self._request(node, key)
        mark, version = self.marks.pop(asked, None) or self.zk().get_versioned(asked)
        requester, requester_lease = parse_holder_mark(mark or b"")
        if requester:
            handed = token
            while handed == token:
                handed = new_token(token >> RANDOM_BITS, RANDOM_BITS)
            to = Holder(requester, requester_lease, handed)
            if self.write_back_fenced(key, value, token, via_bucket, to, (asked, version)):
                return True
        done = self.write_back_fenced(key, value, token, via_bucket)
        if mark is not None:
            self.zk().forget(asked, version)
        return done

    def served(self, node: bytes, key: bytes) -> None:
        self.marks.pop(self._request(node, key), None)
        self.zk().forget(self._request(node, key))

    def write_through(self, key: bytes, value: bytes | None, token: int, via_bucket: bool) -> bool:
        root = self.root(token)
        fence: list[Op] = [("check", znode(root, "b" if via_bucket else "l", key, token))]
        return self.zk().write(znode(root, "d", key), f"{root}/s", fence, value, True)

    def drop_lock(self, key: bytes, node: bytes, lease: int) -> None:
        root = self.root()
        held = Holder.parse(self.zk().get_many([znode(root, "l", key)])[0])
        if held is not None and (held.node, held.lease) == (node, lease):
            self.zk().multi([("delete", znode(root, "l", key, held.token)), ("delete", znode(root, "l", key))])

    def release_bucket(self, bucket: int, token: int, records: Mapping[bytes, bytes | None]) -> bool:
        root, zk = self.root(token), self.zk()
        fence = f"{root}/f/b{bucket:02x}.{token}"
        items = list(records.items())
        present = zk.get_many([znode(root, "d", key) for key, _ in items])
        for start in range(0, len(items), CHUNK):  # the claim's fence keeps every other writer out
            ops: list[Op] = [("check", fence)]
            for (key, value), old in zip(items[start:start + CHUNK], present[start:start + CHUNK]):
                ops += record_ops(znode(root, "d", key), value, old is not None)
            if zk.multi([*ops, ("set", f"{root}/s", b"")]) is not None:
                return False
        if zk.multi([("delete", fence), ("delete", f"{root}/l/b{bucket:02x}")]) is not None:
            return False
        for name in zk.children(f"{root}/f"):  # its detached marks, void now
            if name[0] == "x" and name.endswith(f".{token}"):
                zk.forget(f"{root}/f/{name}")
        return True

    def owner(self, key: bytes) -> bytes | None:
        root = self.root()
        held, claimed = map(Holder.parse, self.zk().get_many([znode(root, "l", key), znode(root, "b", key)]))
        holder = held or claimed
        if holder is None or not self.live(holder) or (held is None and self.zk().stat(znode(root, "l", key))):
            return None  # nobody, a dead lease, or a process's lock
        return holder.node if held or not self.zk().stat(znode(root, "x", key, holder.token)) else None

    def owners(self) -> frozenset[bytes]:
        root, zk = self.root(), self.zk()
        names = zk.children(f"{root}/l", f"{self.nodes}/l")  # ours, then the live leases
        leases = {name for name in names if name[0] == "n"}
        holders = map(Holder.parse, zk.get_many([f"{root}/l/{name}" for name in names if name[0] in "kb"]))
        return frozenset(h.node for h in holders if h is not None and f"n{h.lease:x}" in leases)

    def request_waiting(self, key: bytes, owner: bytes, requester_lease: int) -> bool:
        return self.zk().stat(self._request(owner, key)) is not None
