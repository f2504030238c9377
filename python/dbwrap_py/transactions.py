"""Buffered transactions for leased adapters: the write buffer, and the
transaction lock's bookkeeping, in one place.

A persistent database's transaction here is a database-wide lock in the
store (the transaction lock, a lease as the store judges it) and writes
buffered in the process until the commit sends them in one atomic step,
fenced on that lock. An adapter subclasses TransactionalLeasedAdapter
instead of LeasedAdapter and supplies, besides LeasedAdapter's lease
primitives, only what its store does:

* ``read_record(key)`` and ``scan_records()``: what ``get`` and ``scan``
  were, the records as stored (the framework puts the buffer over them);
* ``take_transaction_lock(token, seconds) -> bool``: one try at the lock
  for ``seconds`` (record lockers in other processes must respect it);
* ``commit_transaction(token, writes) -> bool``: store ``writes`` ({key:
  value, or None to delete}) and release the lock, in one atomic step, only
  while ``token`` still holds it; False (nothing written) otherwise;
* ``release_transaction_lock(token)``: the cancel;
* optionally ``renew_transaction_lock(token, seconds) -> bool`` (the lock
  is renewed while the transaction reads, writes or commits, and by
  keep_locks_alive), ``wait_for_transaction_lock``
  (between tries; a sleep by default), ``wait_for_record_lockers`` (once
  the lock is ours, for record locks taken before it; nothing by default)
  and ``wipe_records()``.

The framework does the rest: the buffer, reads and scans through it, the
lease primitives bypassed while the transaction lock excludes every other
writer, the start's retries (``nonblock``, ``op_timeout``), nested-start,
commit and cancel errors, and FencedOut for a commit the store refused.
"""

from __future__ import annotations

import abc
import secrets
import time
from collections.abc import Iterable, Iterator
from typing import ClassVar

from dbwrap_py.adapter import Adapter, DatabaseSpec
from dbwrap_py.errors import FencedOut, LockConflict, NotSupported, Timeout
from dbwrap_py.leased import LeasedAdapter
from dbwrap_py.options import Options
from dbwrap_py.retry import DEFAULT, Backoff, retry_until

Writes = dict[bytes, bytes | None]


class Transaction:
    """One running transaction: its lock's token and its buffered writes
    (None: a delete)."""

    def __init__(self, token: int, asked: float) -> None:
        self.token = token
        self.writes: Writes = {}
        self.renewed = asked  # when its lock was asked for: its lease began no earlier

    def read(self, key: bytes) -> tuple[bool, bytes | None]:
        """(buffered, the buffered value): whether the buffer decides ``key``."""
        if key in self.writes:
            return True, self.writes[key]
        return False, None

    def merged(self, records: Iterable[tuple[bytes, bytes]]) -> Iterator[tuple[bytes, bytes]]:
        """The stored ``records`` as the buffered writes leave them."""
        pending = dict(self.writes)
        for key, value in records:
            if key not in pending:
                yield key, value
                continue
            newer = pending.pop(key)
            if newer is not None:
                yield key, newer
        for key, newer in pending.items():
            if newer is not None:
                yield key, newer


class TransactionalLeasedAdapter(LeasedAdapter):
    """A leased adapter whose transactions are a store-side lock plus writes
    buffered here (see the module docstring for what a subclass supplies)."""

    #: LockConflict's message when ``nonblock`` finds the lock taken
    transaction_lock_refused: ClassVar[str] = "another process holds the transaction lock"
    #: the pauses between tries for the transaction lock (dbwrap_py.retry)
    transaction_lock_wait: ClassVar[Backoff] = DEFAULT

    def __init__(self, spec: DatabaseSpec, options: Options) -> None:
        super().__init__(spec, options)
        self._transaction: Transaction | None = None

    # -- what the store supplies ----------------------------------------------

    @abc.abstractmethod
    def read_record(self, key: bytes) -> bytes | None:
        """The record as stored (``get`` without the transaction's writes)."""

    @abc.abstractmethod
    def scan_records(self) -> Iterable[tuple[bytes, bytes]]:
        """Every stored record (``scan`` without the transaction's writes)."""

    @abc.abstractmethod
    def take_transaction_lock(self, token: int, seconds: float) -> bool:
        """One try: the transaction lock for ``token``, for ``seconds``."""

    @abc.abstractmethod
    def commit_transaction(self, token: int, writes: Writes) -> bool:
        """Atomically, only while ``token`` holds the transaction lock: store
        ``writes`` and release the lock. False: refused, nothing written."""

    @abc.abstractmethod
    def release_transaction_lock(self, token: int) -> None:
        """Let the transaction lock go, writing nothing (a cancel)."""

    def renew_transaction_lock(self, token: int, seconds: float) -> bool | None:
        """Optional: make ``token``'s transaction lock last ``seconds`` more;
        False if it holds it no longer; None (not overridden): not renewed."""
        return None

    def wait_for_transaction_lock(self, pause: float, left: float) -> None:
        """Between two tries for the transaction lock: ``pause`` is
        ``transaction_lock_wait``'s backoff, never past ``left`` (seconds until
        op_timeout). A store that can wake the waiter overrides it."""
        time.sleep(pause)

    def wait_for_record_lockers(self, token: int, nonblock: bool, deadline: float) -> None:
        """Optional: once ``token`` holds the transaction lock, wait until
        no other process holds a record lock taken before it (LockConflict
        at once with ``nonblock``, Timeout at ``deadline``), as tdb's
        allrecord lock waits for chainlocks. By default nothing: a store
        whose record lockers could not have been in."""

    def wipe_records(self) -> None:
        """Delete every stored record (outside a transaction)."""
        Adapter.wipe(self)

    # -- reads and writes through the buffer ------------------------------------

    def get(self, key: bytes) -> bytes | None:
        if self._transaction is not None:
            self._renew(self._transaction)
            buffered, value = self._transaction.read(key)
            if buffered:
                return value
        return self.read_record(key)

    def scan(self) -> Iterable[tuple[bytes, bytes]]:
        if self._transaction is None:
            return self.scan_records()
        self._renew(self._transaction)
        return self._transaction.merged(self.scan_records())

    def lock(self, key: bytes) -> None:
        if self._transaction is None:  # else our transaction lock excludes every other writer
            super().lock(key)

    def lock_get(self, key: bytes) -> bytes | None:
        if self._transaction is None:
            return super().lock_get(key)
        return self.get(key)

    def unlock(self, key: bytes) -> None:
        if self._transaction is None:
            super().unlock(key)
        else:  # a lock from before the transaction is forgotten, as its writes are buffered
            self._tokens.pop(key, None)

    def put(self, key: bytes, value: bytes) -> None:
        if self._transaction is None:
            super().put(key, value)
        else:
            self._buffer(key, value)

    def remove(self, key: bytes) -> bool:
        if self._transaction is None:
            return super().remove(key)
        if self.get(key) is None:
            return False
        self._buffer(key, None)
        return True

    def put_unlock(self, key: bytes, value: bytes) -> None:
        if self._transaction is None:
            super().put_unlock(key, value)
        else:
            self._tokens.pop(key, None)
            self._buffer(key, value)

    def wipe(self) -> None:
        if self._transaction is None:
            self.wipe_records()
            return
        for key, _ in list(self.scan()):
            self._buffer(key, None)

    def keep_locks_alive(self) -> None:
        if self._transaction is None:
            super().keep_locks_alive()
        else:  # no record lock is taken under the transaction lock
            self._renew(self._transaction)

    def _buffer(self, key: bytes, value: bytes | None) -> None:
        transaction = self._running()
        self._renew(transaction)
        transaction.writes[key] = value

    def _renew(self, transaction: Transaction) -> None:
        """Keep the transaction lock's lease alive while the transaction
        works: a registry's start in smbd reads far more than it writes,
        and on a loaded machine its reads alone outlasted a 10 s lease."""
        asked = time.monotonic()
        if asked - transaction.renewed <= self.renewal_interval():
            return
        if self.renew_transaction_lock(transaction.token, self.lease_seconds) is False:
            raise FencedOut("lost the transaction lock (its lease ran out)")
        transaction.renewed = asked

    # -- the transaction's life ----------------------------------------------------

    def transaction_start(self, nonblock: bool = False) -> None:
        if self._transaction is not None:
            raise NotSupported("a transaction is already running")
        token = secrets.randbits(63)
        deadline = time.monotonic() + self.op_timeout
        asked = self._take_transaction_lock(token, nonblock, deadline)
        try:
            self.wait_for_record_lockers(token, nonblock, deadline)
        except BaseException:
            self.release_transaction_lock(token)
            raise
        self._transaction = Transaction(token, asked)

    def _take_transaction_lock(self, token: int, nonblock: bool, deadline: float) -> float:
        """Try until ``deadline``; with ``nonblock`` only once (LockConflict).
        Returns when the try that took it was sent."""
        def wait(pause: float) -> None:
            self.wait_for_transaction_lock(pause, deadline - time.monotonic())

        for _ in retry_until(deadline, self.transaction_lock_wait, wait=wait):
            asked = time.monotonic()
            if self.take_transaction_lock(token, self.lease_seconds):
                return asked
            if nonblock:
                raise LockConflict(self.transaction_lock_refused)
        raise Timeout(f"transaction lock not free within {self.op_timeout:g} s")

    def transaction_commit(self) -> None:
        transaction = self._end("transaction_commit")
        self._renew(transaction)  # a lost lock fences the commit out, the transaction over
        if not self.commit_transaction(transaction.token, transaction.writes):
            raise FencedOut("the transaction lock expired before the commit; nothing was written")

    def transaction_cancel(self) -> None:
        self.release_transaction_lock(self._end("transaction_cancel").token)

    def _running(self) -> Transaction:
        if self._transaction is None:
            raise NotSupported("no transaction is running")
        return self._transaction

    def _end(self, what: str) -> Transaction:
        if self._transaction is None:
            raise NotSupported(f"{what} without a transaction")
        transaction, self._transaction = self._transaction, None
        return transaction

    def after_fork(self) -> None:
        super().after_fork()
        self._transaction = None  # the parent's: its lock and its writes are the parent's
