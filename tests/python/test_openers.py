"""The openers service (dbwrap_py.openers): its own logic, on an in-memory
store that plays by the OpenerStore rules. The real stores' primitives are
the adapters' and the conformance suite's (TDB_CLEAR_IF_FIRST there)."""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import pytest

from dbwrap_py.openers import RENEW_FRACTION, Openers
from dbwrap_py.testing.forked import in_forked_child

TTL = 0.3


class Table:
    """A store's openers of every database: opener -> expiry, per database."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[int, float]] = {}
        self.lock = threading.Lock()


class FakeStore:
    """One database's openers in a ``Table``; registrations expire after ``ttl``."""

    def __init__(self, table: Table, db: str = "t.tdb", ttl: float | None = TTL) -> None:
        self.table, self.db, self.ttl = table, db, ttl
        self.wipes = 0
        self.renewals = 0
        self.fail_next = 0  # so many register calls raise
        self.fail_unregister = False

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self.table.lock:
            yield

    def _live(self) -> dict[int, float]:
        now = time.monotonic()
        rows = self.table.rows.setdefault(self.db, {})
        for opener in [o for o, expiry in rows.items() if self.ttl is not None and expiry <= now]:
            del rows[opener]
        return rows

    def others_open(self) -> bool:
        return bool(self._live())

    def opened(self, first: bool) -> None:
        self.wipes += first

    def register(self, opener: int) -> None:
        if self.fail_next:
            self.fail_next -= 1
            raise ConnectionError("store down")
        self.renewals += 1
        self._live()[opener] = time.monotonic() + (self.ttl or 0)

    def unregister(self, opener: int) -> None:
        if self.fail_unregister:
            raise ConnectionError("store down")
        self._live().pop(opener, None)

    def __repr__(self) -> str:
        return f"FakeStore({self.db})"


@pytest.fixture
def openers() -> Iterator[Openers]:
    service = Openers(name="test openers")
    yield service
    thread = service.renewal_thread()
    for registration in service.registrations():
        service.leave(registration)
    # it ends once it wakes to no registrations: the next test counts threads by this name
    if thread is not None:
        thread.join(5)
        assert not thread.is_alive(), "the renewal thread outlived its last registration"


def wait_for(condition, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_the_first_opener_wipes_with_clear_if_first_and_later_ones_do_not(openers):
    table = Table()
    first, second = FakeStore(table), FakeStore(table)
    one = openers.open(first, clear_if_first=True)
    two = openers.open(second, clear_if_first=True)
    assert (one.first, two.first) == (True, False)
    assert (first.wipes, second.wipes) == (1, 0)
    openers.leave(one)
    openers.leave(two)
    assert not table.rows["t.tdb"]
    third = FakeStore(table)
    assert openers.open(third, clear_if_first=True).first and third.wipes == 1


def test_without_clear_if_first_nothing_is_wiped_nor_asked(openers):
    store = FakeStore(Table())
    store.others_open = None  # type: ignore[assignment]  # asking would raise
    assert not openers.open(store, clear_if_first=False).first
    assert store.wipes == 0


def test_registrations_are_renewed_and_outlive_their_ttl(openers):
    table = Table()
    store = FakeStore(table)
    registration = openers.open(store, clear_if_first=True)
    time.sleep(4 * TTL)
    assert store.renewals >= 4  # the join and a renewal every RENEW_FRACTION of the TTL
    assert registration.opener in store._live()
    assert FakeStore(table).others_open()


def test_one_thread_renews_every_registration_and_ends_with_the_last(openers):
    stores = [FakeStore(Table(), f"db{i}") for i in range(3)]
    registrations = [openers.open(store, clear_if_first=True) for store in stores]
    thread = openers.renewal_thread()
    assert thread is not None and thread.is_alive()
    assert [t for t in threading.enumerate() if t.name == "test openers"] == [thread]
    time.sleep(3 * TTL * RENEW_FRACTION + 0.1)
    assert all(store.renewals >= 3 for store in stores)
    for registration in registrations:
        openers.leave(registration)
    thread.join(5)
    assert not thread.is_alive() and openers.renewal_thread() is None
    counts = [store.renewals for store in stores]
    time.sleep(2 * TTL * RENEW_FRACTION)
    assert [store.renewals for store in stores] == counts  # left: no longer renewed
    openers.open(stores[0], clear_if_first=True)
    assert openers.renewal_thread() is not None and openers.renewal_thread() is not thread


def test_a_store_error_in_renewal_is_logged_and_renewal_goes_on(openers, caplog):
    caplog.set_level(logging.DEBUG, logger="dbwrap_py.openers")
    store = FakeStore(Table())
    registration = openers.open(store, clear_if_first=True)
    store.fail_next = 3
    wait_for(lambda: store.fail_next == 0 and store.renewals >= 3)
    # the service's own: another module's client left running may log too (pytest
    # captures non-propagating loggers, kazoo's quieted one among them)
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and r.name == "dbwrap_py.openers"]
    assert any("renewing FakeStore(t.tdb) failed (1 in a row)" in w and "store down" in w for w in warnings)
    assert any("works again after 3 failures" in w for w in warnings)
    assert len(warnings) == 2  # a run of failures is one warning, its end another
    assert openers.registrations() == [registration]
    assert openers.renewal_thread().is_alive()


def test_a_store_error_on_leave_is_logged_not_raised(openers, caplog):
    caplog.set_level(logging.INFO, logger="dbwrap_py.openers")
    store = FakeStore(Table())
    registration = openers.open(store, clear_if_first=True)
    store.fail_unregister = True
    openers.leave(registration)
    assert openers.registrations() == []
    assert "left to expire" in caplog.text


def test_a_failed_join_registers_nothing(openers):
    store = FakeStore(Table())
    store.fail_next = 1
    with pytest.raises(ConnectionError):
        openers.open(store, clear_if_first=True)
    assert openers.registrations() == [] and openers.renewal_thread() is None


def test_a_registration_the_store_keeps_alive_is_not_renewed(openers):
    store = FakeStore(Table(), ttl=None)
    openers.open(store, clear_if_first=True)
    assert openers.registrations() == [] and openers.renewal_thread() is None
    assert store.renewals == 1


def test_a_forked_child_renews_its_own_and_the_parent_goes_on_renewing_its_own(openers):
    parent_store = FakeStore(Table(), "parent.tdb")
    parent_reg = openers.open(parent_store, clear_if_first=True)
    parent_thread = openers.renewal_thread()

    def child(result: dict) -> None:  # in the forked child
        result["inherited"] = len(openers.registrations())
        child_store = FakeStore(Table(), "child.tdb")
        child_reg = openers.open(child_store, clear_if_first=True)
        thread = openers.renewal_thread()
        result["own_thread"] = thread is not None and thread is not parent_thread and thread.is_alive()
        time.sleep(3 * TTL * RENEW_FRACTION + 0.1)
        result["child_renewals"] = child_store.renewals
        before = parent_store.renewals
        openers.leave(parent_reg)  # the parent's: not the child's to remove
        result["parent_row_kept"] = parent_reg.opener in parent_store.table.rows["parent.tdb"]
        result["parent_not_renewed_here"] = parent_store.renewals == before
        result["mine"] = openers.registrations() == [child_reg]

    result = in_forked_child(child)
    assert result == {"inherited": 0, "own_thread": True, "child_renewals": result["child_renewals"],
                      "parent_row_kept": True, "parent_not_renewed_here": True, "mine": True}
    assert result["child_renewals"] >= 3
    renewed = parent_store.renewals
    time.sleep(2 * TTL * RENEW_FRACTION + 0.1)
    assert parent_store.renewals > renewed
    assert openers.registrations() == [parent_reg]
    assert openers.renewal_thread() is parent_thread and parent_thread.is_alive()


class AtomicStore(FakeStore):
    """A store whose test, wipe and registration are one step (etcd's transaction)."""

    def exclusive(self) -> Iterator[None]:
        raise AssertionError("an atomic store is never asked for its lock")

    def open_atomically(self, opener: int, clear_if_first: bool) -> bool:
        with self.table.lock:
            first = clear_if_first and not self._live()
            self.wipes += first
            self.register(opener)
            return first


def test_an_atomic_store_opens_in_its_own_step_and_is_kept_like_any_other(openers):
    table = Table()
    first = openers.open(AtomicStore(table), clear_if_first=True)
    second = openers.open(AtomicStore(table), clear_if_first=True)
    assert (first.first, second.first) == (True, False)
    assert set(openers.registrations()) == {first, second}, "renewed like a locked store's"
    openers.leave(first)
    openers.leave(second)
    assert not table.rows["t.tdb"]
    assert openers.open(AtomicStore(table), clear_if_first=True).first, "nobody left: the next open wipes"
