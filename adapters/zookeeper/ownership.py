"""The zookeeper adapter's side of the node cache (dbwrap_py.nodecache.protocol).

Node leases: an agent's lease is its ZooKeeper session. It registers with two
ephemeral znodes under ``<prefix>/_nodes``: ``a/<node>`` (one live agent a
name) and ``l/<lease>`` (hex), the lease's fence: every take and claim checks
it in its multi, so nothing is taken on a lease whose session expired.

Ownership lives in the database's generation, beside a process's own locks,
as persistent znodes (a process, not the agent's session, makes them),
valued ``<node>:<lease>:<token>``: ``l/k<key>`` a record lock (a process's
own lock there is ephemeral and empty, so the two exclude each other) with
its fence ``f/k<key>.<token>``; ``l/b<bb>`` a bucket claim with its fence
``f/b<bb>.<token>``; ``f/x<key>.<token>`` the key detached from claim
``token``. A take creates the lock, the fence and, to prove the bucket
unclaimed, creates and deletes ``l/b<bb>`` in one multi (with the key
detached: checks its mark and the claim's fence instead). A claim creates
its znodes, then lists ``l/``: a record lock in the bucket undoes it. Every
write-back checks the fence of its token in its multi. An ownership whose
lease's ``l/<lease>`` is gone is dead; whoever finds one removes it, guarded
by its fence.

Release requests: ephemeral znodes ``r/<node>/<db>.<key>`` (hex) of the
requester's session, watched by the agent (kazoo watches, read again every
second). Tokens: the generation's number (``client.open_root``) above 32
random bits, so every token of a wiped generation is at most ``wipe_revision``.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from kazoo.exceptions import NodeExistsError

from dbwrap_py.adapters.zookeeper.client import Op, Session, ZkConfig, record_ops, until
from dbwrap_py.errors import FencedOut, LockConflict, Timeout, Unavailable
from dbwrap_py.nodecache.layout import bucket_of
from dbwrap_py.nodecache.protocol import Claim, NodeLease, NodeStore, OwnedElsewhere, Ownership, Taken
from dbwrap_py.options import Options

RANDOM_BITS = 32
#: records written back in one multi (under jute.maxbuffer for small records)
CHUNK = 50


def generation_of(root: str) -> int:
    """The number of the generation at ``root`` (``.../g<n>``; 0 for others)."""
    name = root.rsplit("/", 1)[-1]
    return int(name[1:]) if name[:1] == "g" and name[1:].isdigit() else 0


def wipe_revision(root: str) -> int:
    return (generation_of(root) << RANDOM_BITS) - 1 if generation_of(root) else 0


def nodes_dir(base: str) -> str:
    """Where node leases and requests live, beside the databases of ``base``."""
    return base.rsplit("/", 1)[0] + "/_nodes"


def lease_path(nodes: str, lease: int) -> str:
    return f"{nodes}/l/n{lease:x}"


@dataclass(frozen=True)
class Holder:
    """A node's ownership, as a lock's or claim's data."""

    node: bytes
    lease: int
    token: int

    def encode(self) -> bytes:
        return b"%s:%x:%d" % (self.node, self.lease, self.token)

    @classmethod
    def parse(cls, data: bytes | None) -> Holder | None:
        if not data:  # missing, or a process's own lock
            return None
        node, lease, token = data.rsplit(b":", 2)
        return cls(node, int(lease, 16), int(token))


class ZkOwnership(Ownership):
    """One database's ownership operations: on a process's session (``root``
    its generation), or the agent's (``root`` None: the token's generation,
    else the current one)."""

    def __init__(self, zk: Callable[[], Session], base: str, root: str | None, op_timeout: float) -> None:
        self.zk, self.base, self.fixed_root, self.op_timeout = zk, base, root, op_timeout
        self.nodes = nodes_dir(base)
        self.db = base.rsplit("/", 1)[-1].encode()

    def root(self, token: int = 0) -> str:
        if self.fixed_root is not None:
            return self.fixed_root
        if token:
            return f"{self.base}/g{token >> RANDOM_BITS}"
        return f"{self.base}/{(self.zk().get_many([self.base + '/o'])[0] or b'p').decode()}"

    def _lease(self, lease: int) -> str:
        return lease_path(self.nodes, lease)

    def _request(self, node: bytes, key: bytes) -> str:
        return f"{self.nodes}/r/{node.decode()}/{self.db.hex()}.{key.hex()}"

    def live(self, holder: Holder) -> bool:
        return self.zk().stat(self._lease(holder.lease)) is not None

    # -- record locks, a process's and a node's ----------------------------------

    def lock(self, key: bytes, token: int, holder: Holder | None) -> tuple[bool, Holder | None, bool]:
        """Take ``key``'s record lock for ``holder`` (None: this process,
        ephemeral); else (False, the node that holds it, whether by its
        bucket; None for a process). Dead holders met on the way are removed."""
        root, zk, bb = self.root(), self.zk(), f"b{bucket_of(key):02x}"
        lock, claim = f"{root}/l/k{key.hex()}", f"{root}/l/{bb}"
        pre: list[Op] = [] if holder is None else [("check", self._lease(holder.lease))]
        detached_from = 0
        for _ in range(8):
            unclaimed: list[Op] = ([("create", claim, b"", False), ("delete", claim)] if not detached_from else
                                   [("check", f"{root}/f/x{key.hex()}.{detached_from}"),
                                    ("check", f"{root}/f/{bb}.{detached_from}")])
            failed = zk.multi([*pre, ("create", lock, b"" if holder is None else holder.encode(), holder is None),
                               ("create", f"{root}/f/k{key.hex()}.{token}", b"", holder is None), *unclaimed])
            if failed is None:
                return True, None, False
            at, detached_from = failed[0] - len(pre), 0
            if at < 0:
                raise FencedOut(f"zookeeper: node lease {holder.lease:x} is gone" if holder else "")
            if at == 1 or (at == 0 and not isinstance(failed[1], NodeExistsError)):
                raise Unavailable(f"zookeeper: taking the lock of {key!r}: {failed[1]!r}")
            data = zk.get_many([lock if at == 0 else claim])[0]
            owner = Holder.parse(data)
            if data is None:
                continue  # gone meanwhile
            if owner is None:
                return False, None, False
            if not self.live(owner):
                kind = f"k{key.hex()}" if at == 0 else bb
                zk.multi([("delete", f"{root}/f/{kind}.{owner.token}"), ("delete", f"{root}/l/{kind}")])
                continue
            if at == 0 or zk.stat(f"{root}/f/x{key.hex()}.{owner.token}") is None:
                return False, owner, at != 0
            detached_from = owner.token  # from the claim: record by record
        raise Unavailable(f"zookeeper: the lock of {key!r} kept changing hands")

    def read(self, key: bytes) -> tuple[bytes | None, bool]:
        """A process's read of ``key``: its value, and whether a node may own it."""
        root = self.root()
        value, *held = self.zk().get_many([f"{root}/d/k{key.hex()}", f"{root}/l/k{key.hex()}",
                                           f"{root}/l/b{bucket_of(key):02x}"])
        return value, any(map(Holder.parse, held))

    def ask(self, key: bytes, owner: Holder) -> None:
        """Ask ``owner`` to hand ``key`` back (a process waiting for it)."""
        self.zk().multi([("create", self._request(owner.node, key), b"", True)])

    # -- the protocol ---------------------------------------------------------------

    def take(self, key: bytes, node: bytes, lease: int) -> Taken:
        token = (generation_of(self.root()) << RANDOM_BITS) | (secrets.randbits(RANDOM_BITS) or 1)
        taken, owner, via_bucket = self.lock(key, token, Holder(node, lease, token))
        if owner is not None and (owner.node, owner.lease) == (node, lease):
            token = owner.token  # our bucket's, or a taker of ours died before keeping it
        elif not taken:
            raise OwnedElsewhere(owner.node if owner else None, f"{key!r} is held")
        return Taken(self.zk().get_many([f"{self.root()}/d/k{key.hex()}"])[0], token, via_bucket)

    def claim(self, bucket: int, node: bytes, lease: int) -> Claim | None:
        root, zk = self.root(), self.zk()
        token = (generation_of(root) << RANDOM_BITS) | (secrets.randbits(RANDOM_BITS) or 1)
        path, fence = f"{root}/l/b{bucket:02x}", f"{root}/f/b{bucket:02x}.{token}"
        failed = zk.multi([("check", self._lease(lease)), ("create", path, Holder(node, lease, token).encode(), False),
                           ("create", fence, b"", False)])
        if failed is not None:
            if failed[0] == 0:
                raise FencedOut(f"zookeeper: node lease {lease:x} is gone")
            return None
        if any(name[0] == "k" and bucket_of(bytes.fromhex(name[1:])) == bucket for name in zk.children(f"{root}/l")):
            zk.multi([("delete", fence), ("delete", path)])  # a record lock in it: not now
            return None
        keys = [bytes.fromhex(name[1:]) for name in zk.children(f"{root}/d")]
        keys = [key for key in keys if bucket_of(key) == bucket]
        values = zk.get_many([f"{root}/d/k{key.hex()}" for key in keys])
        return Claim(token, {key: value for key, value in zip(keys, values) if value is not None})

    def request_release(self, key: bytes, owner: bytes, requester_lease: int) -> None:
        self.zk().multi([("create", self._request(owner, key), b"", True)])  # NodeExists: asked already

    def _fence(self, root: str, key: bytes, token: int, via_bucket: bool) -> str:
        return f"{root}/f/b{bucket_of(key):02x}.{token}" if via_bucket else f"{root}/f/k{key.hex()}.{token}"

    def write_back(self, key: bytes, value: bytes | None, token: int, via_bucket: bool,
                   node: bytes, lease: int) -> bool:
        root = self.root(token)
        fence = self._fence(root, key, token, via_bucket)
        end: list[Op] = ([("create", f"{root}/f/x{key.hex()}.{token}", b"", False)] if via_bucket else
                         [("delete", fence), ("delete", f"{root}/l/k{key.hex()}")])
        done = self.zk().write(f"{root}/d/k{key.hex()}", f"{root}/s", [("check", fence), *end], value)
        self.zk().forget(self._request(node, key))
        return done

    def write_through(self, key: bytes, value: bytes | None, token: int, via_bucket: bool) -> bool:
        root = self.root(token)
        fence: list[Op] = [("check", self._fence(root, key, token, via_bucket))]
        return self.zk().write(f"{root}/d/k{key.hex()}", f"{root}/s", fence, value, True)

    def let_go(self, key: bytes, node: bytes, lease: int) -> None:
        root = self.root()
        held = Holder.parse(self.zk().get_many([f"{root}/l/k{key.hex()}"])[0])
        if held is not None and (held.node, held.lease) == (node, lease):
            self.zk().multi([("delete", f"{root}/f/k{key.hex()}.{held.token}"), ("delete", f"{root}/l/k{key.hex()}")])
        self.zk().forget(self._request(node, key))

    def release_bucket(self, bucket: int, token: int, records: Mapping[bytes, bytes | None]) -> bool:
        root, zk = self.root(token), self.zk()
        fence = f"{root}/f/b{bucket:02x}.{token}"
        items = list(records.items())
        present = zk.get_many([f"{root}/d/k{key.hex()}" for key, _ in items])
        for start in range(0, len(items), CHUNK):  # the claim's fence keeps every other writer out
            ops: list[Op] = [("check", fence)]
            for (key, value), old in zip(items[start:start + CHUNK], present[start:start + CHUNK]):
                ops += record_ops(f"{root}/d/k{key.hex()}", value, old is not None)
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
        lock, claim = self.zk().get_many([f"{root}/l/k{key.hex()}", f"{root}/l/b{bucket_of(key):02x}"])
        held, claimed = Holder.parse(lock), Holder.parse(claim)
        if lock is not None:
            return held.node if held is not None and self.live(held) else None
        if claimed is not None and self.live(claimed):
            return None if self.zk().stat(f"{root}/f/x{key.hex()}.{claimed.token}") else claimed.node
        return None

    def owners(self) -> frozenset[bytes]:
        root, zk = self.root(), self.zk()
        names = zk.children(f"{root}/l", f"{self.nodes}/l")  # ours, then the live leases
        leases = {name for name in names if name[0] == "n"}
        holders = map(Holder.parse, zk.get_many([f"{root}/l/{name}" for name in names if name[0] in "kb"]))
        return frozenset(h.node for h in holders if h is not None and f"n{h.lease:x}" in leases)

    def request_waiting(self, key: bytes, owner: bytes, requester_lease: int) -> bool:
        return self.zk().stat(self._request(owner, key)) is not None


class ZkNodeStore(NodeStore):
    """The node agent's session: its lease, its requests, and the databases' ownership."""

    def __init__(self, options: Options) -> None:
        prefix = options.get_str("prefix", "/dbwrap_py").strip("/")
        self.top = f"/{prefix}" if prefix else ""
        self.nodes = f"{self.top}/_nodes"
        self.hosts = options.get_str("hosts", "")
        self.op_timeout = options.get_float("op_timeout", 10.0, minimum=0.1)
        self._zk: Session | None = None
        self._node = b""

    @property
    def zk(self) -> Session:
        if self._zk is None:
            raise Unavailable("zookeeper: the node agent has no session before its grant")
        return self._zk

    def grant(self, node: bytes, ttl: float) -> NodeLease:
        if self._zk is None:  # the session is the lease: its timeout, the TTL
            self._zk = Session(ZkConfig(self.hosts, ttl, self.op_timeout))
        self._node = node
        self.zk.ensure(f"{self.nodes}/a", f"{self.nodes}/l", f"{self.nodes}/r/{node.decode()}")
        lease = secrets.randbits(62) or 1
        register: list[Op] = [("create", f"{self.nodes}/a/{node.decode()}", b"%x" % lease, True),
                              ("create", lease_path(self.nodes, lease), node, True)]
        try:  # a dead predecessor's session may linger for its timeout
            until(lambda: self.zk.multi(register) is None, ttl + self.op_timeout, False, "the node name")
        except Timeout:
            raise LockConflict(f"node name {node.decode()!r} is registered by a live agent") from None
        return NodeLease(lease, ttl)

    def keepalive(self, lease: NodeLease, timeout: float) -> float:
        """A round trip renews the session; the lease lives while its fence does, in our session."""
        stat = self.zk._wait(self.zk.client.exists_async(lease_path(self.nodes, lease.id)), "keepalive", timeout)
        return lease.ttl if stat is not None and stat.ephemeralOwner == self.zk.client.client_id[0] else 0.0

    def revoke(self, lease: NodeLease) -> None:
        self.zk.multi([("delete", lease_path(self.nodes, lease.id)), ("delete", f"{self.nodes}/a/{self._node.decode()}")])

    def requests(self, node: bytes, stop: threading.Event) -> Iterator[tuple[bytes, bytes]]:
        woken = threading.Event()

        def watch(_event: object) -> None:  # one function: kazoo keeps one watcher
            woken.set()

        folder, seen = f"{self.nodes}/r/{node.decode()}", set()
        while not stop.is_set():
            woken.clear()
            names = set(self.zk._wait(self.zk.client.get_children_async(folder, watch=watch), "requests") or [])
            for name in sorted(names - seen):
                db, _, key = name.partition(".")
                yield bytes.fromhex(db), bytes.fromhex(key)
            seen = names
            woken.wait(1.0)

    def done(self, node: bytes, db_id: bytes, key: bytes) -> None:
        self.zk.multi([("delete", f"{self.nodes}/r/{node.decode()}/{db_id.hex()}.{key.hex()}")])

    def database(self, db_id: bytes) -> ZkOwnership:
        return ZkOwnership(lambda: self.zk, f"{self.top}/{db_id.decode()}", None, self.op_timeout)

    def close(self) -> None:
        if self._zk is not None:
            self._zk.stop()
