"""Record locks derived from compare-and-set plus leases, with fencing.

Most distributed stores have an atomic compare-and-set but no lock that dies
with its holder. An adapter for one subclasses LeasedAdapter and implements
three primitives besides ``get`` and ``scan``:

* ``read_lock(key)``: the lease on ``key``, or None;
* ``swap_lock(key, expected, new)``: atomically replace the lease whose token
  is ``expected`` (None: no lease) with ``new`` (None: delete it);
* ``fenced_write(key, token, value)``: atomically store ``value`` (None:
  delete) only if the lease on ``key`` still carries ``token``.

From these the framework builds ``lock``, ``unlock``, ``put`` and ``remove``:

* Taking a lock swaps an absent or expired lease for a fresh one. A killed
  holder's lock is free when its lease ends, so the adapter declares
  ``lock_release_seconds`` = the lease.
* Every write under the lock is fenced on the lease's token. A holder that
  was paused past its lease, and whose lock someone else then took, cannot
  write: it gets FencedOut (NT_STATUS_FILE_LOCK_CONFLICT). This is the fence
  Jepsen found etcd's own locks need.
* Tokens are random 63-bit numbers, so a lock released and taken again never
  matches a stale holder's token.
* A waiter polls with backoff and gives up with Timeout after ``op_timeout``.

Leases expire by ``time.time()``, so every client must share a clock (one
host, or clocks much closer than the lease). A backend with server-side
leases (etcd) should use those instead: that is a native override.
"""

from __future__ import annotations

import abc
import secrets
import time
from dataclasses import dataclass

from dbwrap_py.adapter import Adapter, DatabaseSpec
from dbwrap_py.errors import FencedOut, Timeout
from dbwrap_py.options import Options

#: options every leased adapter reads; subclasses add their own
LEASE_OPTIONS = ("lease", "op_timeout")


@dataclass(frozen=True)
class Lease:
    token: int
    expires: float  # time.time() seconds

    @property
    def expired(self) -> bool:
        return self.expires <= time.time()


class LeasedAdapter(Adapter):
    """An adapter whose record locks are leases taken by compare-and-set."""

    option_names = LEASE_OPTIONS
    #: seconds, when the ``lease`` option is not given
    default_lease = 10.0

    def __init__(self, spec: DatabaseSpec, options: Options) -> None:
        super().__init__(spec, options)
        self.lease_seconds = options.get_float("lease", self.default_lease, minimum=0.1)
        self.op_timeout = options.get_float("op_timeout", 30.0, minimum=0.0)
        self._tokens: dict[bytes, int] = {}  # key -> token of the lease we hold

    # -- the primitives a subclass implements -----------------------------

    @abc.abstractmethod
    def read_lock(self, key: bytes) -> Lease | None:
        """The lease on ``key``, expired or not, or None."""

    @abc.abstractmethod
    def swap_lock(self, key: bytes, expected: int | None, new: Lease | None) -> bool:
        """Replace the lease with token ``expected`` by ``new``, atomically."""

    @abc.abstractmethod
    def fenced_write(self, key: bytes, token: int, value: bytes | None) -> bool:
        """Store (or, for None, delete) only while ``token`` holds the lock."""

    # -- derived ------------------------------------------------------------

    def lock(self, key: bytes) -> None:
        deadline = time.monotonic() + self.op_timeout
        pause = 0.001
        while True:
            current = self.read_lock(key)
            if current is None or current.expired:
                lease = Lease(secrets.randbits(63), time.time() + self.lease_seconds)
                if self.swap_lock(key, current.token if current else None, lease):
                    self._tokens[key] = lease.token
                    return
                continue  # another process won the race: look again
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout(f"record lock not free within {self.op_timeout:g} s")
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.05)

    def unlock(self, key: bytes) -> None:
        token = self._tokens.pop(key, None)
        if token is not None:
            # False means our lease ran out and someone took the lock: nothing to release
            self.swap_lock(key, token, None)

    def put(self, key: bytes, value: bytes) -> None:
        self._write(key, value)

    def remove(self, key: bytes) -> bool:
        if self.get(key) is None:
            return False
        self._write(key, None)
        return True

    def _write(self, key: bytes, value: bytes | None) -> None:
        token = self._tokens.get(key)
        if token is None or not self.fenced_write(key, token, value):
            raise FencedOut("the record lock's lease was lost to another holder; write refused")

    def after_fork(self) -> None:
        self._tokens.clear()  # the parent's leases are not ours
