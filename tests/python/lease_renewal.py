"""Checks shared by the leased adapters' tests: renewing a lease keeps the
record lock, for the holder that must not lose it (the node daemon); a
transaction keeps its lock while it works."""

from __future__ import annotations

import time

import pytest

from dbwrap_py.errors import Timeout
from dbwrap_py.leased import LeasedAdapter


def assert_renewal_keeps_the_lock(holder: LeasedAdapter, contender: LeasedAdapter, contend_for: float,
                                  leases: float = 3) -> None:
    """``holder`` locks a record and renews for ``leases`` of its leases;
    ``contender``, waiting ``contend_for`` seconds (under half a lease),
    cannot take it, the holder's write still lands, and once it lets go the
    contender gets it. Only the contender's lock wait is shortened: opened
    with a short op_timeout, its open failed on a loaded Cassandra (CI)."""
    assert contend_for < holder.lease_seconds / 2
    every = holder.lock_renewal_seconds()
    assert every is not None and every < holder.lease_seconds
    holder.lock(b"renewed")
    until = time.monotonic() + leases * holder.lease_seconds
    while time.monotonic() < until:
        time.sleep(every)
        holder.keep_locks_alive()
    patient, contender.op_timeout = contender.op_timeout, contend_for
    with pytest.raises(Timeout):
        contender.lock(b"renewed")
    contender.op_timeout = patient
    holder.keep_locks_alive()
    holder.put(b"renewed", b"holder")
    holder.unlock(b"renewed")
    contender.lock(b"renewed")
    assert contender.get(b"renewed") == b"holder"
    contender.unlock(b"renewed")


def assert_a_transaction_reading_past_its_lease_commits(db: LeasedAdapter, leases: float = 2.25) -> None:
    """``db`` (a persistent database on a short lease) starts a transaction,
    writes, then only reads for ``leases`` of its leases, and commits.
    smbd's registry start read for 14-16 s on a 10 s Cassandra lease and
    was fenced out (stop 53): without renew_transaction_lock the lock lapses
    and the commit is refused."""
    db.transaction_start()
    db.put(b"k", b"v")
    deadline = time.monotonic() + leases * db.lease_seconds
    while time.monotonic() < deadline:
        assert db.get(b"k") == b"v"
        time.sleep(0.3)
    db.transaction_commit()
    assert db.get(b"k") == b"v"
