"""The fdb adapter, run on the model of FoundationDB (``fdb_library = model``):
what the conformance suite does not look at. These are results of
``fdb (model)``, not of FoundationDB, which cannot run on this machine.
"""

from __future__ import annotations

import ctypes.util
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import dbwrap_py.testing.fdb_model as fdb_model
from dbwrap_py.adapters.fdb import library as library
from dbwrap_py.adapter import TDB_CLEAR_IF_FIRST
from dbwrap_py.adapters.fdb.adapter import FdbAdapter
from dbwrap_py.database import Database, open_database
from dbwrap_py.errors import ConfigError, FencedOut, InvalidParameter, Timeout
from dbwrap_py.options import Options
from dbwrap_py.servers import pause_process
from dbwrap_py.testing.fdb_model.throwaway import model_server
from lease_renewal import assert_renewal_keeps_the_lock

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def cluster_file() -> Iterator[Path]:
    """A model server. This process starts its network at once, so the
    databases it opens run in it (and its forked children need relays); the
    opening process's own path, through its keeper, runs in subprocesses."""
    with model_server() as path:
        library.open_database(library.load("model", library.DEFAULT_API_VERSION), "model", str(path))
        yield path


def open_fdb(cluster_file: Path, name: str, volatile: bool = True, extra: tuple[str, ...] = ()) -> Database:
    return open_database(name, 0, TDB_CLEAR_IF_FIRST if volatile else 0, os.O_RDWR | os.O_CREAT, 0o600,
                         0, 0, "fdb", ["fdb_library=model", f"cluster_file={cluster_file}", *extra])


def test_real_library_missing_refuses_the_open_naming_it(tmp_path: Path) -> None:
    if ctypes.util.find_library("fdb_c"):
        pytest.skip("libfdb_c is installed here: the missing-library path cannot be shown")
    with pytest.raises(ConfigError, match=r"libfdb_c\.so"):
        open_database(str(tmp_path / "real.tdb"), 0, 0, os.O_RDWR | os.O_CREAT, 0o600, 0, 0, "fdb",
                      ["fdb_library=real", f"cluster_file={tmp_path / 'fdb.cluster'}"])



def test_the_node_cache_on_a_real_cluster_is_refused_until_its_leases_are_safe(tmp_path: Path) -> None:
    """Read versions jump at a recovery, so a node lease judged in them could
    end early on a real cluster while its node still serves records."""
    with pytest.raises(ConfigError, match="recovery"):
        open_database(str(tmp_path / "real.tdb"), 0, 0, os.O_RDWR | os.O_CREAT, 0o600, 0, 0, "fdb",
                      ["fdb_library=real", "node_cache=yes", f"cluster_file={tmp_path / 'fdb.cluster'}"])
    with pytest.raises(ConfigError, match="recovery"):
        FdbAdapter.node_store(Options({"fdb_library": "real", "cluster_file": str(tmp_path / "fdb.cluster")}))

OPEN_THEN_USE = """
import os, sys
from dbwrap_py.adapters.fdb import library as library
from dbwrap_py.database import open_database
db = open_database(sys.argv[2], 0, 1, os.O_RDWR | os.O_CREAT, 0o600, 0, 0, "fdb",
                   ["fdb_library=model", "cluster_file=" + sys.argv[1]])
print("after open:", library._network_pid, flush=True)
db.adapter.lock_get(b"k")
db.adapter.put_unlock(b"k", b"parent")
# flushed before the fork: a child would write a copy of what is still buffered
print("after use:", library._network_pid, type(db.adapter.store()).__name__, flush=True)
pid = os.fork()
if pid == 0:
    print("child reads:", db.adapter.get(b"k"), library._network_pid == os.getpid(),
          type(db.adapter.store()).__name__, flush=True)
    os._exit(0)
os.waitpid(pid, 0)
"""


def test_the_opening_process_never_starts_the_network_its_children_do(cluster_file: Path,
                                                                        tmp_path: Path) -> None:
    """smbd's parent opens the databases, runs a few operations (such as
    smbXsrv_version_global_init) and forks: those run in its keeper, so each
    child can start a network of its own (no relay)."""
    out = subprocess.run([sys.executable, "-c", OPEN_THEN_USE, str(cluster_file), str(tmp_path / "lazy.tdb")],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.splitlines() == ["after open: None", "after use: None KeeperStore",
                                "child reads: b'parent' True FdbStore"]


def test_a_child_forked_after_the_network_started_uses_a_relay(cluster_file: Path, tmp_path: Path) -> None:
    db = open_fdb(cluster_file, str(tmp_path / "fork.tdb"))
    adapter = db.adapter
    adapter.lock_get(b"k")
    adapter.put_unlock(b"k", b"parent")  # the network now runs in this process
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            try:  # what the inherited network would do here: the model refuses, as libfdb_c cannot serve
                fdb_model.open(str(cluster_file)).create_transaction().get(b"x").wait()
            except fdb_model.FDBError as exc:
                assert exc.code == 2008
            else:
                raise AssertionError("the model let a forked child use its parent's network")
            assert type(adapter.store()).__name__ == "RelayStore"
            assert adapter.lock_get(b"k") == b"parent"
            adapter.put_unlock(b"k", b"child")
            adapter.close()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert status == 0
    assert adapter.get(b"k") == b"child"
    db.close()


def test_a_1_mib_value_is_split_into_chunks_and_reassembled(cluster_file: Path, tmp_path: Path) -> None:
    db = open_fdb(cluster_file, str(tmp_path / "big.tdb"))
    adapter = db.adapter
    value = os.urandom(1024 * 1024)
    adapter.lock(b"big")
    adapter.put(b"big", value)
    assert adapter.get(b"big") == value
    store = adapter.store()
    begin, end = store.record_range(b"big")
    tr = fdb_model.open(str(cluster_file)).create_transaction()
    chunks = tr.get_range(begin, end)
    assert len(chunks) == 11 and all(len(kv.value) <= 100_000 for kv in chunks)
    adapter.put_unlock(b"big", b"small")  # a shorter value leaves no stale chunk behind
    assert adapter.get(b"big") == b"small"
    assert len(fdb_model.open(str(cluster_file)).create_transaction().get_range(begin, end)) == 1
    db.close()


INCREMENTS = """
import os, sys
from dbwrap_py.database import open_database
db = open_database(sys.argv[2], 0, 1, os.O_RDWR | os.O_CREAT, 0o600, 0, 0, "fdb",
                   ["fdb_library=model", "cluster_file=" + sys.argv[1]])
adapter = db.adapter
for _ in range(int(sys.argv[3])):
    value = adapter.lock_get(b"counter")
    adapter.put_unlock(b"counter", str(int(value or b"0") + 1).encode())
"""


def test_injected_unknown_results_and_conflicts_lose_and_double_no_increment(
        cluster_file: Path, tmp_path: Path) -> None:
    name = str(tmp_path / "counter.tdb")
    db = open_fdb(cluster_file, name)  # the first opener: later ones must not wipe
    control = fdb_model.Control(str(cluster_file))
    before = control.stats()
    # a storm: each commit, retries included, fails with 1021 (applied or not) or 1020
    control.inject_rate("unknown", 0.2, outcome="random")
    control.inject_rate("not_committed", 0.1)
    try:
        children = [subprocess.Popen([sys.executable, "-c", INCREMENTS, str(cluster_file), name, "40"])
                    for _ in range(3)]
        assert [child.wait(timeout=240) for child in children] == [0, 0, 0]
    finally:
        control.inject_rate("unknown", 0)
        control.inject_rate("not_committed", 0)
    after = control.stats()
    control.close()
    assert db.adapter.get(b"counter") == b"120"
    for kind in ("injected_unknown_applied", "injected_unknown_dropped", "injected_not_committed"):
        assert after.get(kind, 0) - before.get(kind, 0) >= 5, f"too few {kind} to show anything"
    db.close()


def test_a_transaction_over_10_mb_fails_clearly_and_writes_nothing(cluster_file: Path, tmp_path: Path) -> None:
    db = open_fdb(cluster_file, str(tmp_path / "persistent.tdb"), volatile=False)
    adapter = db.adapter
    adapter.transaction_start()
    for i in range(3):
        key = b"part%d" % i
        adapter.lock(key)
        adapter.put(key, b"x" * (4 * 1024 * 1024))
        adapter.unlock(key)
    with pytest.raises(InvalidParameter, match="10,000,000"):
        adapter.transaction_commit()
    assert list(adapter.scan()) == []
    adapter.transaction_start(nonblock=True)  # the transaction lock was let go
    adapter.lock(b"small")
    adapter.put(b"small", b"fits")
    adapter.unlock(b"small")
    adapter.transaction_commit()
    assert adapter.get(b"small") == b"fits"
    db.close()


def test_a_waiter_sleeps_on_a_watch_until_the_release(cluster_file: Path, tmp_path: Path) -> None:
    name = str(tmp_path / "watch.tdb")
    holder = open_fdb(cluster_file, name).adapter
    waiter = open_fdb(cluster_file, name).adapter
    holder.lock(b"k")
    store = waiter.store()
    tries = []
    take = store.take_lease

    def counted(*args, **kwargs):
        tries.append(time.monotonic())
        return take(*args, **kwargs)

    store.take_lease = counted
    released = []
    timer = threading.Timer(1.0, lambda: (holder.unlock(b"k"), released.append(time.monotonic())))
    timer.start()
    waiter.lock(b"k")
    got = time.monotonic()
    timer.join()
    assert released and got - released[0] < 0.3, "the waiter did not wake at the release"
    assert len(tries) <= 3, f"{len(tries)} tries in 1 s: polling, not a watch"
    waiter.unlock(b"k")


def test_a_holder_whose_lease_ran_out_and_was_taken_over_is_fenced(cluster_file: Path, tmp_path: Path) -> None:
    name = str(tmp_path / "fence.tdb")
    stale = open_fdb(cluster_file, name, extra=("lease=0.3",)).adapter
    fresh = open_fdb(cluster_file, name, extra=("lease=0.3",)).adapter
    stale.lock(b"k")
    time.sleep(0.5)  # its lease ends in the store's read versions
    fresh.lock(b"k")
    fresh.put(b"k", b"new holder")
    with pytest.raises(FencedOut):
        stale.put(b"k", b"stale holder")
    fresh.unlock(b"k")
    assert fresh.get(b"k") == b"new holder"


def test_a_renewed_lease_keeps_the_lock_past_its_time(cluster_file: Path, tmp_path: Path) -> None:
    name = str(tmp_path / "renew.tdb")
    assert_renewal_keeps_the_lock(open_fdb(cluster_file, name, extra=("lease=0.4",)).adapter,
                                  open_fdb(cluster_file, name, extra=("lease=0.4",)).adapter,
                                  contend_for=0.15)


def test_the_opener_keys_renewals_are_not_counted_as_the_callers_round_trips(cluster_file: Path,
                                                                           tmp_path: Path) -> None:
    """round_trips counts what callers ran: the node cache's tests compare
    it before and after one operation, and a renewal from the opener's own
    thread in between made a traverse look one transaction dearer."""
    db = open_fdb(cluster_file, str(tmp_path / "renewed.tdb"))
    assert db.fetch(b"k") is None  # the store opens lazily
    before = db.adapter.round_trips
    db.adapter._store.renew_opener()
    assert db.adapter.round_trips == before
    assert db.fetch(b"k") is None
    assert db.adapter.round_trips == before + 1
    db.close()


def test_a_traverse_longer_than_the_transaction_limit_pages_across_transactions(
        cluster_file: Path, tmp_path: Path) -> None:
    db = open_fdb(cluster_file, str(tmp_path / "long.tdb"), extra=("page_size=3",))
    adapter = db.adapter
    keys = [b"r%02d" % i for i in range(12)]
    for key in keys:
        adapter.lock(key)
        adapter.put(key, key * 30_000)  # 90 kB: one chunk each, 3 records a page
        adapter.unlock(key)
    control = fdb_model.Control(str(cluster_file))
    control.set_too_old_seconds(0.3)
    try:
        seen = []
        for key, value in adapter.scan():  # 12 x 0.1 s: far past one transaction's life
            assert value == key * 30_000
            seen.append(key)
            time.sleep(0.1)
        tr = fdb_model.open(str(cluster_file)).create_transaction()
        tr.get(b"x").wait()
        time.sleep(0.4)
        with pytest.raises(fdb_model.FDBError) as old:  # so one transaction would not have lasted
            tr.get(b"x").wait()
        assert old.value.code == 1007
    finally:
        control.set_too_old_seconds(5.0)
        control.close()
    assert sorted(seen) == keys
    db.close()


@pytest.mark.parametrize("outcome", ["applied", "dropped"])
def test_a_transaction_commit_that_got_1021_lands_exactly_once(
        cluster_file: Path, tmp_path: Path, outcome: str) -> None:
    db = open_fdb(cluster_file, str(tmp_path / f"txn-{outcome}.tdb"), volatile=False)
    adapter = db.adapter
    adapter.transaction_start()
    adapter.lock(b"k")
    adapter.put(b"k", b"committed")
    adapter.unlock(b"k")
    control = fdb_model.Control(str(cluster_file))
    control.inject("unknown", count=1, outcome=outcome)
    stats = control.stats()
    adapter.transaction_commit()  # neither FencedOut (it landed) nor lost (it did not)
    assert control.stats()[f"injected_unknown_{outcome}"] == stats.get(f"injected_unknown_{outcome}", 0) + 1
    control.close()
    assert adapter.get(b"k") == b"committed"
    adapter.transaction_start(nonblock=True)  # and the transaction lock is free
    adapter.transaction_cancel()
    db.close()


def test_keys_over_foundationdbs_limit_are_refused_clearly(cluster_file: Path, tmp_path: Path) -> None:
    adapter = open_fdb(cluster_file, str(tmp_path / "keys.tdb")).adapter
    adapter.lock(b"k" * 9_900)  # fits with the prefix
    adapter.put(b"k" * 9_900, b"v")
    adapter.unlock(b"k" * 9_900)
    with pytest.raises(InvalidParameter, match="10000 bytes"):
        adapter.lock(b"k" * 10_000)


def test_results_on_the_model_are_labelled_fdb_model_everywhere() -> None:
    from dbwrap_py.bench.smb import Backend
    from dbwrap_py.bench.targets import display_name
    from dbwrap_py.registry import find_adapter

    model = {"fdb_library": "model"}
    assert display_name("fdb", model) == "fdb (model)"
    assert display_name("fdb", {"fdb_library": "real"}) == "fdb"
    assert display_name("native", {}) == "native" and display_name("tdb", {}) == "tdb"
    assert Backend("fdb", model).label == "bridge+fdb (model)"
    notes = find_adapter("fdb").declared_capabilities(model).notes
    assert any("model of FoundationDB" in note and "not FoundationDB" in note for note in notes)


def test_the_conformance_table_names_the_model() -> None:
    from dbwrap_py.conformance import run_suite

    run = run_suite("fdb", {"fdb_library": "model"}, only=["kv.values"])
    assert run.target == "fdb (model)"
    assert [r.result for r in run.results] == ["pass"], run.log


def exited(pid: int) -> bool:
    """Gone, or a zombie its new parent has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_relay_ends_with_the_child_that_started_it(cluster_file: Path, tmp_path: Path) -> None:
    db = open_fdb(cluster_file, str(tmp_path / "relay.tdb"))
    db.adapter.get(b"k")  # the network runs here: a child needs a relay
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            db.adapter.get(b"k")
            os.write(write_end, str(db.adapter.store()._process.pid).encode())
            code = 0
        finally:
            os._exit(code)  # no close: the relay must notice on its own
    os.close(write_end)
    relay = int(os.read(read_end, 32))
    os.close(read_end)
    assert os.waitpid(pid, 0)[1] == 0
    deadline = time.monotonic() + 10
    while not exited(relay) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert exited(relay), "the relay outlived its child"
    db.close()


PARENT_THEN_CHILDREN = """
import os, sys, time
from dbwrap_py.adapters.fdb import library as library
from dbwrap_py.adapters.fdb import store as _fdb_store
from dbwrap_py.database import open_database
_fdb_store.OPENER_TTL = 1.0  # so that a child's opener key lapses within the test
db = open_database(sys.argv[2], 0, 1, os.O_RDWR | os.O_CREAT, 0o600, 0, 0, "fdb",
                   ["fdb_library=model", "cluster_file=" + sys.argv[1]])
adapter = db.adapter

def in_child(work):
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            work()
            code = 0
        finally:
            os._exit(code)  # no close: as a killed smbd child
    assert os.waitpid(pid, 0)[1] == 0

in_child(lambda: adapter.put_unlock(b"k", b"durable") if adapter.lock_get(b"k") is None else None)
time.sleep(3.0)  # three opener TTLs: the first child's opener key is long gone
def second():
    print("second child reads:", adapter.get(b"k"), flush=True)
in_child(second)
print("parent's network:", library._network_pid, flush=True)
db.close()
"""


def test_a_volatile_database_lives_while_the_parent_that_opened_it_does(
        cluster_file: Path, tmp_path: Path) -> None:
    """smbd's way: the parent opens and forks, and never starts the network;
    a child writes and dies, and a child long after it still sees the
    record, as with tdb (the parent's keeper holds its opener key)."""
    out = subprocess.run([sys.executable, "-c", PARENT_THEN_CHILDREN, str(cluster_file),
                          str(tmp_path / "parent.tdb")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["second child reads: b'durable'", "parent's network: None"]


OPEN_AND_WAIT = """
import os, sys
from dbwrap_py.adapters.fdb.keeper import KeeperClient
from dbwrap_py.database import open_database
db = open_database(sys.argv[2], 0, 1, os.O_RDWR | os.O_CREAT, 0o600, 0, 0, "fdb",
                   ["fdb_library=model", "cluster_file=" + sys.argv[1]])
print(KeeperClient._current._process.pid, flush=True)
sys.stdin.read()
"""


def openers(cluster_file: Path, db: object) -> list[bytes]:
    store = db.adapter.store()
    tr = fdb_model.open(str(cluster_file)).create_transaction()
    return [bytes(kv.key) for kv in tr.get_range(store.openers, store.openers + b"\xff")]


def test_the_keeper_lets_the_opener_key_go_when_its_process_dies(cluster_file: Path, tmp_path: Path) -> None:
    name = str(tmp_path / "dies.tdb")
    opener = subprocess.Popen([sys.executable, "-c", OPEN_AND_WAIT, str(cluster_file), name],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        keeper = int(opener.stdout.readline())
        started = time.monotonic()
        probe = open_fdb(cluster_file, name)  # joins too: two openers now
        # a make test (python-servers, 4 workers) once found one: say whether
        # the probe wiped (it saw no live opener: a renewal late by 10 s?)
        found = openers(cluster_file, probe)
        assert len(found) == 2, (f"openers {found}; the probe's open took {time.monotonic() - started:.2f} s "
                                 f"and its wipe revision is {probe.adapter.wipe_revision}")
        opener.kill()  # no close: the keeper must notice on its own
        opener.wait()
        deadline = time.monotonic() + 5  # well under the 10 s the key would take to expire
        while len(openers(cluster_file, probe)) > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(openers(cluster_file, probe)) == 1, "the dead process still counts as an opener"
        while not exited(keeper) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert exited(keeper), "the keeper outlived its process"
        probe.close()
        assert openers(cluster_file, open_fdb(cluster_file, name)) != [], "sanity: an open joins"
    finally:
        opener.kill()
        opener.wait()


def test_closing_leaves_the_openers_and_a_later_open_wipes(cluster_file: Path, tmp_path: Path) -> None:
    name = str(tmp_path / "closed.tdb")
    script = ("import os, sys\nfrom dbwrap_py.database import open_database\n"
              "db = open_database(sys.argv[2], 0, 1, os.O_RDWR | os.O_CREAT, 0o600, 0, 0, 'fdb',"
              " ['fdb_library=model', 'cluster_file=' + sys.argv[1]])\n"
              "db.adapter.lock(b'k'); db.adapter.put(b'k', b'v'); db.adapter.unlock(b'k')\n"
              "print(db.adapter.get(b'k')); db.close()\n")
    out = subprocess.run([sys.executable, "-c", script, str(cluster_file), name],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == "b'v'"
    db = open_fdb(cluster_file, name)  # nobody has it open: TDB_CLEAR_IF_FIRST wipes, as tdb
    assert db.adapter.get(b"k") is None
    db.close()


OPEN_MANY = """
import os, sys, time
from dbwrap_py.adapters.fdb.keeper import KeeperClient
from dbwrap_py.database import open_database
dbs = [open_database(sys.argv[2] + str(i), 0, 1, os.O_RDWR | os.O_CREAT, 0o600, 0, 0, "fdb",
                     ["fdb_library=model", "cluster_file=" + sys.argv[1]]) for i in range(12)]
time.sleep(0.5)
def parent_of(pid):
    try:  # a process that ends between listdir and open is not ours
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1]
    except (FileNotFoundError, ProcessLookupError):
        return None
children = [p for p in os.listdir("/proc") if p.isdigit() and parent_of(p) == str(os.getpid())]
status = dict(line.split(":", 1) for line in open(f"/proc/{KeeperClient._current._process.pid}/status"))
print(len(children), status["Threads"].strip(), status["VmRSS"].strip(), flush=True)
"""


def test_one_keeper_serves_every_database_of_its_process(cluster_file: Path, tmp_path: Path) -> None:
    """The cost of the parent's place among the openers: one process, a few threads."""
    run = subprocess.run([sys.executable, "-c", OPEN_MANY, str(cluster_file), str(tmp_path / "many")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    processes, threads, rss = run.stdout.split(maxsplit=2)
    print(f"12 volatile databases: {processes} keeper process, {threads} threads, {rss} RSS")
    assert (int(processes), int(threads)) == (1, 3)


PARENT_WITH_CACHE = """
import os, sys
from dbwrap_py.adapters.fdb import library as library
from dbwrap_py.database import open_database
db = open_database(sys.argv[2], 0, 1, os.O_RDWR | os.O_CREAT, 0o600, 0, 0, "fdb",
                   ["fdb_library=model", "cluster_file=" + sys.argv[1], "node_cache=yes",
                    "node_cache_dir=" + sys.argv[3]])
assert db.adapter.cache is not None, "the agent serves the directory"
print("after open:", library._network_pid, flush=True)
pid = os.fork()
if pid == 0:
    db.adapter.lock_get(b"k")  # through the node cache: the child's network, the agent's claim
    db.adapter.put_unlock(b"k", b"from the child")
    os._exit(0)
assert os.waitpid(pid, 0)[1] == 0
print("parent's network after the child:", library._network_pid, flush=True)
"""


def test_with_the_node_cache_the_parent_still_starts_no_network(cluster_file: Path, tmp_path: Path) -> None:
    from dbwrap_py.nodecache.agent import NodeAgentProcess

    with NodeAgentProcess("fdb", {"fdb_library": "model", "cluster_file": str(cluster_file)},
                          tmp_path / "node", ttl=2) as agent:
        out = subprocess.run([sys.executable, "-c", PARENT_WITH_CACHE, str(cluster_file),
                              str(tmp_path / "cached.tdb"), str(agent.cache_dir)],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines() == ["after open: None", "parent's network after the child: None"]
        reader = open_fdb(cluster_file, str(tmp_path / "cached.tdb"))
        assert reader.adapter.get(b"k") == b"from the child"  # asked of node0's agent
        reader.close()


def test_a_hung_relay_fails_the_call_in_time_and_is_replaced(cluster_file: Path, tmp_path: Path) -> None:
    db = open_fdb(cluster_file, str(tmp_path / "hung-relay.tdb"),
                  extra=("op_timeout=1", "transaction_timeout=1"))
    db.adapter.get(b"k")  # the network runs here: a child needs a relay
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        report = "unexpected"
        try:
            from dbwrap_py.adapters.fdb import relay as _fdb_relay

            _fdb_relay.REPLY_SLACK = 0.5  # the call may take op_timeout + transaction_timeout + this
            db.adapter.get(b"k")
            hung = db.adapter.store()._process.pid
            pause_process(hung)  # every thread stopped: one already running could still answer
            began = time.monotonic()
            try:
                db.adapter.get(b"k")
                report = "the call through a stopped relay returned"
            except Timeout:
                waited = time.monotonic() - began
                db.adapter.put_unlock(b"k", b"after") if db.adapter.lock_get(b"k") is None else None
                replaced = db.adapter.store()._process.pid != hung
                report = f"{waited:.2f} {replaced} {exited(hung)}"
        except BaseException as exc:  # reported to the parent, which fails the test
            report = repr(exc)
        finally:
            os.write(write_end, report.encode())
            os._exit(0)
    os.close(write_end)
    if not select.select([read_end], [], [], 30)[0]:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the call through a stopped relay did not return in 30 s")
    report = os.read(read_end, 1024).decode()
    os.close(read_end)
    os.waitpid(pid, 0)
    waited, replaced, killed = report.split()  # fails with the child's report otherwise
    assert 2.4 < float(waited) < 6, report  # 1 s + 1 s + 0.5 s, then the kill
    assert (replaced, killed) == ("True", "True"), report
    assert db.adapter.get(b"k") == b"after"
    db.close()


#: The keeper is paused with pause_process, which returns once every thread
#: of it has stopped: a bare SIGSTOP is only queued, and in a loaded Debian 13
#: root a keeper thread already running answered the next open (the open
#: returned, and the stopped keeper, holding this script's stderr, kept
#: subprocess.run waiting its 60 s). The keeper is killed on every way out,
#: so a failure is reported, not waited on.
KEEPER_STOPPED = """
import os, signal, sys
from dbwrap_py.adapters.fdb import keeper as _fdb_keeper
from dbwrap_py.adapters.fdb.keeper import KeeperClient
from dbwrap_py.database import open_database
from dbwrap_py.errors import Timeout
from dbwrap_py.servers import pause_process

def open_one(i):
    return open_database(sys.argv[2] + str(i), 0, 1, os.O_RDWR | os.O_CREAT, 0o600, 0, 0, "fdb",
                         ["fdb_library=model", "cluster_file=" + sys.argv[1], "transaction_timeout=1"])

open_one(0)
_fdb_keeper.REPLY_SLACK = 0.5
hung = KeeperClient._current._process.pid
pause_process(hung)
try:
    open_one(1)
    print("the open through a stopped keeper returned")
except Timeout as exc:
    open_one(2)  # a new keeper
    print("timeout", KeeperClient._current._process.pid != hung, flush=True)
finally:
    try:
        os.kill(hung, signal.SIGKILL)  # gone already when the open timed out
    except ProcessLookupError:
        pass
"""


def test_a_hung_keeper_fails_the_open_in_time_and_is_replaced(cluster_file: Path, tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", KEEPER_STOPPED, str(cluster_file), str(tmp_path / "k")],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["timeout", "True"], out.stdout + out.stderr
