"""What an adapter implements to get the node cache: ``NodeStore`` and ``Ownership``.

An adapter class offers the node cache by defining ``node_store(options)``,
which returns a ``NodeStore`` on its backend. The node agent uses it for the
node's lease and release requests, and ``NodeStore.database(db_id)`` for the
records it hands back. An open adapter gives the processes of the node the
rest (``CachedAdapter`` in ``adapter.py`` reads them): ``ownership()``, the
database's ``Ownership`` on the process's own connection; ``node_cache_id``,
the ``db_id`` the agent is given (a file name in the cache directory, so no
``/``); and ``wipe_revision``, the last token of the database's last
CLEAR_IF_FIRST wipe. Six adapters do it: etcd, rados, cassandra, zookeeper,
fdb (run here on a model of FoundationDB only), and sqlite_leased (the small
example, in SQL).

Terms:

* a *node* is named (1-64 letters, digits, ``.``, ``_``, ``-``) and unique in
  the cluster; its agent holds one *node lease* at a time. Everything the node
  owns is held on that lease, so it goes when the lease does: the store, not
  a clock on the node, decides when that is.
* a *token* is a number the store gives with each ownership (etcd: the
  create_revision of the key that holds it; sqlite_leased: a counter in the
  database's file; rados: the wipe epoch above random bits; cassandra: the
  generation above random bits; zookeeper: the generation's number above
  random bits; fdb: the read version of the transaction that took it); every
  write-back is fenced on it, so a node that lost an ownership can never
  write through it. Tokens made after a CLEAR_IF_FIRST wipe are all above
  ``wipe_revision``, those made before it at most that: the node's copies
  with a token up to it are void.
* a database's keys fall into ``BUCKETS`` *buckets* by hash (``layout.bucket``).
  A node may claim a bucket while nobody holds a record lock in it and no key
  of it was detached; it then owns every record of the bucket, learns the
  bucket's records in the same round trip, and makes new records in it with no
  round trip at all. A record of a node's bucket that another node asks for is
  *detached*: written back and marked, and from then on owned record by record.
"""

from __future__ import annotations

import abc
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from dbwrap_py.errors import LockConflict, NotSupported
from dbwrap_py.retry import Backoff, retry_until

#: between two tries at a node name another agent's lease holds
GRANT_WAIT = Backoff(first=0.05, cap=0.2)


def grant_tries(ttl: float, op_timeout: float) -> Iterator[int]:
    """``NodeStore.grant``'s tries at a node name: a dead predecessor's
    lease may linger for ``ttl``, so until then and ``op_timeout`` more."""
    return retry_until(time.monotonic() + ttl + op_timeout, GRANT_WAIT)


@dataclass(frozen=True)
class NodeLease:
    id: int
    #: seconds the store granted
    ttl: float


@dataclass(frozen=True)
class Taken:
    """A record now owned by the node: its value (None: none) and token."""

    value: bytes | None
    token: int
    #: owned through the node's claim on its bucket, not a record lock
    via_bucket: bool = False


@dataclass(frozen=True)
class Claim:
    """A bucket the node now holds: its token and every record in it."""

    token: int
    records: Mapping[bytes, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class Served:
    """A release request that stood and is gone: a process of the node
    handed the record over (``Ownership.hand_over`` removes the request in
    its step), or its requester's lease ended. The agent stops waiting to
    serve it: a request it still counted as pending would mark the record
    wanted again, and every process of the node would hand the record back
    as it let go (seen: a write-back and a take again per open)."""

    db_id: bytes
    key: bytes


class OwnedElsewhere(LockConflict):
    """Another node owns the record (``node``), or a process holds its lock (None)."""

    def __init__(self, node: bytes | None, what: str) -> None:
        super().__init__(what)
        self.node = node


class Ownership(abc.ABC):
    """One database's records, moved between the store and the nodes."""

    #: how long a process waits for a record another node hands over
    op_timeout: float = 10.0

    @abc.abstractmethod
    def take(self, key: bytes, node: bytes, lease: int) -> Taken:
        """Make ``node`` the owner of ``key`` and read it, in one round trip
        where the store allows. Through the bucket when the node holds it and
        the key is not detached; else with a record lock on ``lease``.
        Raises OwnedElsewhere when another node or a process holds it."""

    @abc.abstractmethod
    def claim(self, bucket: int, node: bytes, lease: int) -> Claim | None:
        """Claim ``bucket`` for ``node`` if nobody holds a record lock in it
        and none of its keys is detached; None if that cannot be."""

    @abc.abstractmethod
    def request_release(self, key: bytes, owner: bytes, requester_lease: int, requester: bytes = b"") -> None:
        """Ask ``owner``'s agent to give ``key`` back; the request goes with
        the requester's lease if it dies first. ``requester``: the asking
        node, if a node asks (not a process): where ``hand_over`` is the
        store's own, the record goes straight to it."""

    @abc.abstractmethod
    def write_back(self, key: bytes, value: bytes | None, token: int, via_bucket: bool,
                   node: bytes, lease: int) -> bool:
        """Store ``value`` (None: delete) and end the node's ownership of
        ``key``, in one fenced step: a record lock is let go, a bucket's
        record is detached (the mark held on ``lease``), and a release
        request to ``node`` for it is removed. False if ``token`` no longer
        holds (the node lost the ownership): nothing was written."""

    def hand_over(self, key: bytes, value: bytes | None, token: int, via_bucket: bool,
                  node: bytes, lease: int) -> bool:
        """``write_back`` for a record another node asked for, and the record
        made the asking node's (a record lock on its lease, as its own take
        would make) where its release request stands: its waiter finds it
        its own at its next look. Without this the record is free between
        the two, and the holder's own waiters, queued on the node's
        chainlock, take it back before the asking node looks again (seen:
        a waiter starved for its whole op_timeout at 64 clients). The
        default is ``write_back``: a store that cannot name the requester
        leaves the record free."""
        return self.write_back(key, value, token, via_bucket, node, lease)

    @abc.abstractmethod
    def let_go(self, key: bytes, node: bytes, lease: int) -> None:
        """A record lock ``node`` holds on ``lease`` with no local copy behind
        it (its taker died before keeping one): let it go, the store's copy is
        current; and remove a release request to ``node`` for it."""

    @abc.abstractmethod
    def write_through(self, key: bytes, value: bytes | None, token: int, via_bucket: bool) -> bool:
        """Store ``value`` (None: delete) and keep the ownership; fenced as
        ``write_back``. For node_cache = write-through."""

    @abc.abstractmethod
    def release_bucket(self, bucket: int, token: int, records: Mapping[bytes, bytes | None]) -> bool:
        """Write ``records`` back (None: delete) and let ``bucket`` go, fenced
        on ``token``; a draining agent's last step for each bucket."""

    @abc.abstractmethod
    def owner(self, key: bytes) -> bytes | None:
        """The node that owns ``key`` (by record lock or bucket), else None."""

    # -- for a traverse that sees every node's records (sync.py); optional --------

    def owners(self) -> frozenset[bytes]:
        """Every node that owns a record of the database now, by record lock
        or bucket, on a live lease. NotSupported where the adapter cannot
        say: its traverses then see other nodes' records as last written back."""
        raise NotSupported(f"{type(self).__name__} does not list a database's owners")

    def request_waiting(self, key: bytes, owner: bytes, requester_lease: int) -> bool:
        """Whether the request to ``owner`` for ``key`` is there still (its
        agent removes it as it serves it). Where requests expire, this one
        is kept as long as ``requester_lease`` lives: gone must mean served."""
        raise NotSupported(f"{type(self).__name__} does not tell whether a request waits")


class NodeStore(abc.ABC):
    """The node's side of a store: its lease, and the release requests to it."""

    @abc.abstractmethod
    def grant(self, node: bytes, ttl: float) -> NodeLease:
        """A new lease for ``node``, and the node registered on it. Raises
        LockConflict if a live agent has the name."""

    @abc.abstractmethod
    def keepalive(self, lease: NodeLease, timeout: float) -> float:
        """Renew the lease: the seconds the store now grants, 0 if it is gone.
        Gives up (raises) after ``timeout`` seconds: the agent tries again
        soon, well before the lease it published would run out."""

    @abc.abstractmethod
    def revoke(self, lease: NodeLease) -> None:
        """End the lease: what the node holds on it goes."""

    @abc.abstractmethod
    def requests(self, node: bytes, stop: threading.Event) -> Iterator[tuple[bytes, bytes] | Served]:
        """(database id, key) of each release request to ``node``: the ones
        waiting, then each new one as it comes (watch where the store has one,
        polling where it has not), until ``stop`` is set; and ``Served`` for
        one that was there and is gone."""

    @abc.abstractmethod
    def done(self, node: bytes, db_id: bytes, key: bytes) -> None:
        """The request for ``key`` is served: remove it."""

    @abc.abstractmethod
    def database(self, db_id: bytes) -> Ownership:
        """The ownership operations of one database (``db_id`` as the adapter names it)."""

    def close(self) -> None:
        """Release connections."""
