"""The generic half of an adapter's ownership module (``protocol.py``).

What every store's ``Ownership`` and ``NodeStore`` would otherwise write
again, each rule once: tokens drawn from a wipe count, a holder's
``node:lease`` mark, the retries of a node lease's grant and of a take whose
record keeps changing (and what a refused take does with the hold it met),
the live nodes among a database's holders, the agent's loop that finds new release requests, a
node store's open databases, and an ``Ownership`` reached through plain
calls (a relay after a fork), its answers turned into ``Taken``,
``OwnedElsewhere`` and ``Claim`` here.
"""

from __future__ import annotations

import abc
import secrets
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from dbwrap_py.errors import LockConflict, Timeout
from dbwrap_py.nodecache.protocol import Claim, OwnedElsewhere, Ownership, Served, Taken, grant_tries
from dbwrap_py.retry import retry_until

#: the random bits under a token's generation (the wipes of its database so far)
TOKEN_BITS = 40

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)
Request = tuple[bytes, bytes]  # (database id, key)


# -- tokens: a generation above random bits ------------------------------------------------

def new_token(generation: int, bits: int = TOKEN_BITS) -> int:
    """A token of ``generation``: above every token of the generations before."""
    return (generation << bits) | (secrets.randbits(bits) or 1)


def wipe_revision(generation: int, bits: int = TOKEN_BITS) -> int:
    """The last token a database could have had before its ``generation``-th wipe."""
    return (generation << bits) - 1 if generation else 0


def generation_of(token: int, bits: int = TOKEN_BITS) -> int:
    return token >> bits


# -- who holds an ownership -----------------------------------------------------------------

def holder_mark(node: bytes, lease: int) -> bytes:
    """How a store names the holder of an ownership: ``node:lease`` (hex)."""
    return b"%s:%x" % (node, lease)


def parse_holder_mark(value: bytes) -> tuple[bytes, int]:
    """(node, lease) of a ``holder_mark``; (b"", 0) for an empty one."""
    node, _, lease = value.rpartition(b":")
    return node, int(lease or b"0", 16)


# -- retries ---------------------------------------------------------------------------------

def attempts(seconds: float, what: str) -> Iterator[int]:
    """The tries of a step whose record keeps changing under it, one right
    after the other (each is guarded on what the one before read), for
    ``seconds``; then Timeout: ``what`` kept changing."""
    yield from retry_until(time.monotonic() + seconds, wait=lambda _: None)
    raise Timeout(f"{what} kept changing for {seconds:g} s")


def grant_retrying(node: bytes, attempt: Callable[[], T], ttl: float, op_timeout: float,
                   refused: str = "has a live agent") -> T:
    """``NodeStore.grant``: ``attempt`` (true: the node name is ours) at each
    of ``grant_tries``, its first true answer returned; else LockConflict:
    the node name ``refused``."""
    for _ in grant_tries(ttl, op_timeout):
        if answer := attempt():
            return answer
    raise LockConflict(f"node name {node.decode()!r} {refused}")


# -- a take that meets a hold ------------------------------------------------------------------

@dataclass(frozen=True)
class Held:
    """A node's hold on a record: by record lock, or by its bucket's claim."""

    node: bytes
    lease: int
    token: int
    via_bucket: bool = False


@dataclass(frozen=True)
class Refused:
    """A take that did not apply: the record's value as read, and the node
    hold it met (None: nobody's now, try again) or a process's lock."""

    value: bytes | None = None
    held: Held | None = None
    by_process: bool = False


def take_retrying(key: bytes, node: bytes, lease: int, seconds: float, what: str,
                  attempt: Callable[[], Taken | Refused], standing: Callable[[Held], bool]) -> Taken:
    """``Ownership.take`` for a store whose take is one guarded step:
    ``attempt`` at each of ``attempts`` (``what``: the record it guards on).
    A hold of the taker's own (a taker of its died before keeping it, or its
    bucket) is taken as found; another node's refuses the take if it is
    ``standing`` (its lease lives; else ``standing`` removed it, and the
    next attempt guards on that)."""
    for _ in attempts(seconds, f"take {key!r}: {what}"):
        found = attempt()
        if isinstance(found, Taken):
            return found
        if found.by_process:
            raise OwnedElsewhere(None, f"{key!r} is locked by a process")
        held = found.held
        if held is None:
            continue  # free now (a wrong guess, or detached): again, guarded on what was read
        if (held.node, held.lease) == (node, lease):
            return Taken(found.value, held.token, via_bucket=held.via_bucket)
        if standing(held):
            raise OwnedElsewhere(held.node, f"{key!r} is held by node {held.node.decode()}")
    raise AssertionError("attempts() ends by raising")


def live_owners(holders: Iterable[tuple[bytes, int]], live: Callable[[set[tuple[bytes, int]]], Iterable[bytes]]
                ) -> frozenset[bytes]:
    """``Ownership.owners`` from the (node, lease) of every hold found:
    ``live`` answers the nodes of those whose leases live (asked once, and
    not at all when nothing is held)."""
    found = set(holders)
    return frozenset(live(found)) if found else frozenset()


# -- the agent's release requests ---------------------------------------------------------------

def new_requests(read: Callable[[], Mapping[K, Request | None]], wait: Callable[[], None],
                 stop: threading.Event) -> Iterator[Request | Served]:
    """``NodeStore.requests`` for a store read in rounds: each round ``read``
    gives the requests standing, by an identity that changes when a request
    is made again (None: not a request); those not standing in the round
    before are yielded, each once while it stands, and ``Served`` for a
    record asked for in the round before and not in this one; then ``wait``
    (a poll's pause, or until the store says something changed), until ``stop``."""
    seen: set[K] = set()
    asked: set[Request] = set()
    while not stop.is_set():
        found = read()
        standing = {request for request in found.values() if request is not None}
        for request in sorted(asked - standing):
            yield Served(*request)
        for identity, request in found.items():
            if request is not None and identity not in seen:
                yield request
        seen, asked = set(found), standing
        wait()


# -- ending an ownership ------------------------------------------------------------------------

class ServedOwnership(Ownership):
    """An ``Ownership`` whose write-back and let-go are each a step on the
    record, then the release request to the node removed (``served``), as
    the protocol asks: the store supplies the steps."""

    @abc.abstractmethod
    def write_back_fenced(self, key: bytes, value: bytes | None, token: int, via_bucket: bool) -> bool:
        """``write_back``'s step: store ``value`` and end the ownership (a
        record lock goes, a bucket's key is detached), fenced on ``token``."""

    @abc.abstractmethod
    def drop_lock(self, key: bytes, node: bytes, lease: int) -> None:
        """``let_go``'s step: the record lock ``node`` holds on ``lease`` goes."""

    @abc.abstractmethod
    def served(self, node: bytes, key: bytes) -> None:
        """The release request to ``node`` for ``key`` goes (if there is one)."""

    def write_back(self, key: bytes, value: bytes | None, token: int, via_bucket: bool,
                   node: bytes, lease: int) -> bool:
        done = self.write_back_fenced(key, value, token, via_bucket)
        self.served(node, key)
        return done

    def let_go(self, key: bytes, node: bytes, lease: int) -> None:
        self.drop_lock(key, node, lease)
        self.served(node, key)


# -- a node store's databases -----------------------------------------------------------------

class PerDatabase(Generic[T]):
    """What a node store opens once per database id (thread-safe), and closes with it."""

    def __init__(self, open_one: Callable[[bytes], T]) -> None:
        self._open_one = open_one
        self._open: dict[bytes, T] = {}
        self._lock = threading.Lock()

    def __call__(self, db_id: bytes) -> T:
        with self._lock:
            found = self._open.get(db_id)
            if found is None:
                found = self._open[db_id] = self._open_one(db_id)
            return found

    def take_all(self) -> list[T]:
        """Everything open, forgotten here (for the caller to close)."""
        with self._lock:
            found, self._open = list(self._open.values()), {}
            return found


# -- an Ownership reached through plain calls ------------------------------------------------

def taken(value: bytes | None, token: int, via_bucket: bool = False) -> tuple[Any, ...]:
    """A take's answer as plain values (what ``CalledOwnership`` turns into Taken)."""
    return ("taken", value, token, via_bucket)


def elsewhere(node: bytes | None, why: str) -> tuple[Any, ...]:
    """A refused take's answer as plain values (OwnedElsewhere)."""
    return ("elsewhere", node, why)


class CalledOwnership(Ownership):
    """One database's ownership operations through ``call(method, *args)``,
    which runs the method of that name where the store is (the process's
    store, or its relay after a fork) and answers with plain values: take
    with ``taken``/``elsewhere``, claim with (token, records) or None."""

    def __init__(self, call: Callable[..., Any], op_timeout: float) -> None:
        self._call = call
        self.op_timeout = op_timeout

    def take(self, key: bytes, node: bytes, lease: int) -> Taken:
        result = self._call("take", key, node, lease)
        if result[0] == "elsewhere":
            raise OwnedElsewhere(result[1], result[2])
        return Taken(result[1], result[2], via_bucket=result[3])

    def claim(self, bucket: int, node: bytes, lease: int) -> Claim | None:
        result = self._call("claim", bucket, node, lease)
        return Claim(result[0], result[1]) if result is not None else None

    def request_release(self, key: bytes, owner: bytes, requester_lease: int, requester: bytes = b"") -> None:
        self._call("request_release", key, owner, requester_lease, requester)

    def write_back(self, key: bytes, value: bytes | None, token: int, via_bucket: bool,
                   node: bytes, lease: int) -> bool:
        return bool(self._call("write_back", key, value, token, via_bucket, node, lease))

    def let_go(self, key: bytes, node: bytes, lease: int) -> None:
        self._call("let_go", key, node, lease)

    def write_through(self, key: bytes, value: bytes | None, token: int, via_bucket: bool) -> bool:
        return bool(self._call("write_through", key, value, token, via_bucket))

    def release_bucket(self, bucket: int, token: int, records: Mapping[bytes, bytes | None]) -> bool:
        return bool(self._call("release_bucket", bucket, token, dict(records)))

    def owner(self, key: bytes) -> bytes | None:
        return self._call("owner", key)

    def owners(self) -> frozenset[bytes]:
        return frozenset(self._call("owners"))

    def request_waiting(self, key: bytes, owner: bytes, requester_lease: int) -> bool:
        return bool(self._call("request_waiting", key, owner, requester_lease))
