"""Record locks derived from compare-and-set plus leases, with fencing.

Most distributed stores have an atomic compare-and-set but no lock that dies
with its holder. An adapter for one subclasses LeasedAdapter, declares its
``lease_source`` and implements three primitives besides ``get`` and
``scan``, each one atomic step in the store (one round trip):

* ``take_lease(key, token, seconds, read) -> (taken, value)``: if ``key``
  has no lease, or one that has expired, give it to ``token`` for
  ``seconds``; with ``read``, read the record in the same step;
* ``fenced_write(key, token, value) -> bool``: store ``value`` (None:
  delete) only while ``token`` holds the lease and it has not expired;
* ``end_lease(key, token, value=KEEP) -> bool``: the same write, then the
  lease released, in one step; ``KEEP`` only releases. False if ``token``
  no longer held it (nothing was written).

A store whose refusal says why (etcd reads who holds the lock now) may raise
FencedOut naming that cause instead of returning False.

From these the framework builds ``lock``, ``lock_get`` (one round trip),
``unlock``, ``put``, ``put_unlock`` (one round trip) and ``remove``:

* A lock is a lease with a fresh random 63-bit token, so a lock released
  and taken again never matches a stale holder's token. A killed holder's
  lock is free when its lease ends; the adapter declares
  ``lock_release_seconds`` from the ``lease`` option (``declared_capabilities``).
* Every write under the lock is fenced on the token. A holder paused past
  its lease, whose lock someone else then took, cannot write: it gets
  FencedOut (NT_STATUS_FILE_LOCK_CONFLICT). This is the fence Jepsen found
  etcd's own locks need.
* A waiter tries again with dbwrap_py.retry's backoff and gives up with
  Timeout after ``op_timeout``.
* A holder that must not lose a lock while it lives (the node daemon, for
  its live connections) calls ``keep_locks_alive`` every
  ``lock_renewal_seconds``. It needs a fourth primitive,
  ``renew_lease(key, token, seconds) -> bool``: give ``token``'s unexpired
  lease ``seconds`` more from now, as the store judges; False if ``token``
  holds it no longer. An adapter without it keeps plain expiring leases.

Who decides that a lease has expired is the store, never a client's clock:
two hosts whose clocks differ must not both believe they hold a lock. The
framework hands the primitives a lease *duration*, never an expiry time it
computed, and keeps no wall clock at all (``time.monotonic`` only measures
its own waits). ``lease_source`` says how the store judges:

* ``LeaseSource.STORE_CLOCK``: the store's own clock, read inside the
  statement that takes or checks the lease (SQL's ``julianday('now')``);
* ``LeaseSource.SERVER_TTL``: the store drops the lease itself after a TTL
  (etcd leases, Cassandra ``USING TTL``). Such TTLs are whole seconds, so
  the framework rounds the lease up; ``lease_slack`` is how late the server
  may drop it (etcd's lessor looks every 0.5 s).
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import math
import secrets
import time
from collections.abc import Mapping
from typing import ClassVar

from dbwrap_py.adapter import Adapter, Capabilities, DatabaseSpec
from dbwrap_py.errors import AdapterContractError, FencedOut, LockConflict, Timeout
from dbwrap_py.options import Option, Options
from dbwrap_py.retry import DEFAULT, Backoff, retry_until

#: seconds one store operation may take (shared: every adapter with a store
#: declares this one, with its own default if it needs one)
OP_TIMEOUT = Option("op_timeout", float, 30.0, minimum=0.0, help="seconds one store operation may take")
#: the key prefix of a shared store (one declaration; zookeeper's and the
#: others' are the same once stripped of "/")
PREFIX = Option("prefix", str, "dbwrap_py", help="the key prefix in the store")
#: options every leased adapter reads; subclasses add their own
LEASE_OPTIONS = (
    Option("lease", float, None, minimum=0.1,
           help="seconds a record lock's lease lasts (default: the adapter's default_lease; "
                "at least 1, in whole seconds, for a server-side TTL)"),
    OP_TIMEOUT,
)


def renewal_timeout(interval: float, lease_left: float) -> float:
    """How long one keepalive may wait for its answer: at least
    ``interval``, and as long as the store may still hold the lease
    (``lease_left``: a TTL after the last grant or renewal was answered,
    less the time since). A renewal answered late still keeps the lease;
    one given up sooner lets it lapse while the store is only slow (etcd
    renews once it has applied what it committed, so a slow disk delays
    every renewal; a client that hangs up cancels it)."""
    return max(interval, lease_left)


class LeaseSource(enum.Enum):
    """Who judges that a lease has expired: always the store."""

    STORE_CLOCK = "the store's clock"
    SERVER_TTL = "a server-side TTL"


class Keep:
    """The type of ``KEEP``."""

    def __repr__(self) -> str:
        return "KEEP"


#: ``end_lease``'s value when the record stays as it is
KEEP = Keep()


class LeasedAdapter(Adapter):
    """An adapter whose record locks are leases the store judges."""

    options_schema = LEASE_OPTIONS
    #: seconds, when the ``lease`` option is not given
    default_lease = 10.0
    #: every subclass declares how its store judges expiry
    lease_source: ClassVar[LeaseSource]
    #: seconds a server-side TTL may outlive its time (SERVER_TTL only)
    lease_slack: ClassVar[float] = 0.0
    #: the pauses between tries for a held lock (dbwrap_py.retry); a store
    #: that wakes its waiters (a watch) may wait longer
    lock_wait: ClassVar[Backoff] = DEFAULT

    def __init__(self, spec: DatabaseSpec, options: Options) -> None:
        super().__init__(spec, options)
        if not isinstance(getattr(self, "lease_source", None), LeaseSource):
            raise AdapterContractError(f"{type(self).__name__} declares no lease_source")
        self.lease_seconds = self.lease_for(options)
        self.op_timeout = options.value("op_timeout")
        self._tokens: dict[bytes, int] = {}  # key -> token of the lease we hold

    @classmethod
    def lease_for(cls, options: Mapping[str, str]) -> float:
        """The lease duration passed to the primitives: whole seconds for a
        server-side TTL (what etcd and Cassandra accept), rounded up."""
        minimum = 1.0 if cls.lease_source is LeaseSource.SERVER_TTL else 0.1
        seconds = cls.options_of(options).value("lease", minimum=minimum)
        seconds = cls.default_lease if seconds is None else seconds
        return float(math.ceil(seconds)) if cls.lease_source is LeaseSource.SERVER_TTL else seconds

    @classmethod
    def declared_capabilities(cls, options: Mapping[str, str]) -> Capabilities:
        """A killed holder's lock is free when the store ends its lease."""
        return dataclasses.replace(
            cls.capabilities, lock_release_seconds=cls.lease_for(options) + cls.lease_slack,
            notes=(*cls.capabilities.notes, f"record locks are leases judged by {cls.lease_source.value}"))

    # -- the primitives a subclass implements -----------------------------

    @abc.abstractmethod
    def take_lease(self, key: bytes, token: int, seconds: float, read: bool) -> tuple[bool, bytes | None]:
        """Atomically: if ``key`` has no lease or an expired one (as the
        store judges), give it to ``token`` for ``seconds``; with ``read``,
        also read the record. (taken, the record or None)."""

    @abc.abstractmethod
    def fenced_write(self, key: bytes, token: int, value: bytes | None) -> bool:
        """Store (None: delete) only while ``token`` holds an unexpired lease."""

    @abc.abstractmethod
    def end_lease(self, key: bytes, token: int, value: bytes | None | Keep = KEEP) -> bool:
        """Atomically: ``fenced_write`` unless ``value`` is KEEP, then release
        the lease if ``token`` has it. False if the write was refused."""

    def renew_lease(self, key: bytes, token: int, seconds: float) -> bool | None:
        """Optional: atomically, while ``token`` holds an unexpired lease on
        ``key``, make it last ``seconds`` from now. False if it does not;
        None (not overridden): this store's leases are not renewed."""
        return None

    # -- derived ------------------------------------------------------------

    def lock(self, key: bytes) -> None:
        self._take(key, read=False)

    def lock_get(self, key: bytes) -> bytes | None:
        return self._take(key, read=True)

    def _take(self, key: bytes, read: bool) -> bytes | None:
        token = secrets.randbits(63)
        deadline = time.monotonic() + self.op_timeout
        for _ in retry_until(deadline, self.lock_wait, wait=lambda pause: self.wait_for_release(key, pause)):
            taken, value = self.take_lease(key, token, self.lease_seconds, read)
            if taken:
                self._tokens[key] = token
                return value
        raise Timeout(f"record lock not free within {self.op_timeout:g} s")

    def wait_for_release(self, key: bytes, pause: float) -> None:
        """Between two tries for a held lock: sleep ``pause`` (``lock_wait``'s
        backoff, never past op_timeout). A store that can wake waiters when
        a lock goes (watches) overrides it; it must return within ``pause``,
        or within a short poll, since a dead holder's lock ends without a
        wake-up, unless its store wakes it then too (etcd deletes a lock key
        with its holder's lease)."""
        time.sleep(pause)

    def unlock(self, key: bytes) -> None:
        token = self._tokens.pop(key, None)
        if token is not None:
            # False means our lease ran out and someone took the lock: nothing to release
            self.end_lease(key, token)

    def put(self, key: bytes, value: bytes) -> None:
        if not self.fenced_write(key, self._token(key), value):
            raise FencedOut("the record lock's lease was lost to another holder; write refused")

    def remove(self, key: bytes) -> bool:
        if self.get(key) is None:
            return False
        if not self.fenced_write(key, self._token(key), None):
            raise FencedOut("the record lock's lease was lost to another holder; delete refused")
        return True

    def put_unlock(self, key: bytes, value: bytes) -> None:
        token = self._token(key)
        del self._tokens[key]  # released either way: end_lease lets go even when it refuses
        if not self.end_lease(key, token, value):
            raise FencedOut("the record lock's lease was lost to another holder; write refused")

    def _token(self, key: bytes) -> int:
        try:
            return self._tokens[key]
        except KeyError:
            raise LockConflict(f"write to {key!r} without holding its record lock") from None

    def lock_renewal_seconds(self) -> float | None:
        if type(self).renew_lease is LeasedAdapter.renew_lease:
            return None
        return self.renewal_interval()

    def renewal_interval(self) -> float:
        """How often a lease of ``lease_seconds`` is renewed (record locks,
        the transaction lock), counted from when the grant or the last
        renewal was *asked*: the store's lease began no earlier. A
        whole-second server TTL may end up to a second early (the server
        counts from the second it is in); three tries in what is left."""
        sure = self.lease_seconds - (1.0 if self.lease_source is LeaseSource.SERVER_TTL else 0.0)
        return max(0.1, sure / 3)

    def read_from_its_node(self, key: bytes) -> bytes | None:
        """An unlocked read of a record a node owns (the node cache): that
        node's copy is the newer, so the record lock is taken (the node
        hands the record back first) and let go at once; the value then."""
        value = self.lock_get(key)
        self.unlock(key)
        return value

    def keep_locks_alive(self) -> None:
        """Renew every lease held; one lost already stays lost (its writes are fenced out)."""
        for key, token in list(self._tokens.items()):
            self.renew_lease(key, token, self.lease_seconds)

    def after_fork(self) -> None:
        self._tokens.clear()  # the parent's leases are not ours
