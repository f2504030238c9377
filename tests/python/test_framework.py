"""The dbwrap_py framework: registry, options, exception mapping, fork hooks.

Adapter-specific behaviour is in test_memory_adapter.py and test_tdb_adapter.py;
the C bridge's own checks are in tests/c.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import subprocess
import sys

from pathlib import Path

import pytest

from dbwrap_py import errors, ntstatus
from dbwrap_py.adapter import TDB_CLEAR_IF_FIRST, Adapter
from dbwrap_py.database import Database, open_database
from dbwrap_py.options import REDACTED, Option, Options, is_secret, shown_options, shown_value
from dbwrap_py.registry import adapter_names, find_adapter

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures")
sys.path.insert(0, FIXTURES)


def _open(adapter: str, options=(), name="db.tdb", flags=TDB_CLEAR_IF_FIRST) -> Database:
    return open_database(name, 0, flags, os.O_RDWR | os.O_CREAT, 0o600, 0, 0, adapter, list(options))


# -- registry ---------------------------------------------------------------


def test_short_names_find_builtin_adapters():
    assert {"tdb", "memory"} <= set(adapter_names())
    assert issubclass(find_adapter("memory"), Adapter)
    assert find_adapter("memory").__module__ == "dbwrap_py.adapters.memory"


EXAMPLE_ADAPTER = """
from dbwrap_py.adapters.memory import MemoryAdapter


class ExampleAdapter(MemoryAdapter):
    \"\"\"A package of its own: the memory adapter under another name.\"\"\"
"""


def install_example_package(site: Path) -> None:
    """What pip leaves for a package that registers an adapter: the module and
    its dist-info with an entry point in the dbwrap_py.adapters group."""
    (site / "dbwrap_py_example.py").write_text(EXAMPLE_ADAPTER)
    info = site / "dbwrap_py_example-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dbwrap-py-example\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[dbwrap_py.adapters]\nexample = dbwrap_py_example:ExampleAdapter\n")


def test_an_adapter_package_registers_by_entry_point(tmp_path, monkeypatch):
    from dbwrap_py import registry

    install_example_package(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    registry._entry_points.cache_clear()
    try:
        assert "example" in adapter_names()
        assert find_adapter("example").__name__ == "ExampleAdapter"
        db = _open("example")
        db.lock(b"k")
        db.unlock(b"k", b"v")
        assert db.fetch(b"k") == b"v"
    finally:
        registry._entry_points.cache_clear()


def test_the_bridge_finds_an_adapter_package_by_entry_point(tmp_path):
    """Through Samba's dbwrap front end: the adapter package is on DBWRAP_PY_PATH."""
    install_example_package(tmp_path)
    check = Path(__file__).resolve().parents[2] / "build" / "dbwrap_check"
    env = dict(os.environ, DBWRAP_PY_PATH=str(tmp_path))
    result = subprocess.run([str(check), "--adapter", "example", "--single-process",
                             "--only", "kv.storev"], capture_output=True, text=True, env=env,
                            timeout=120)
    assert '"result": "pass"' in result.stdout, result.stdout + result.stderr


def test_dotted_path_finds_any_importable_module():
    cls = find_adapter("dbwrap_py_fixtures.misbehaving")
    assert cls.__name__ == "MisbehavingAdapter"


@pytest.mark.parametrize(
    "name, message",
    [
        ("nosuch", "unknown adapter 'nosuch'"),
        ("", "no adapter named"),
        ("dbwrap_py_fixtures.import_error", "failed to import"),
        ("dbwrap_py.errors", "has no ADAPTER"),
        ("no_such_package.adapter", "unknown adapter"),
    ],
)
def test_bad_adapter_names_raise_config_error(name, message):
    with pytest.raises(errors.ConfigError, match=message):
        find_adapter(name)


# -- options ----------------------------------------------------------------


def test_options_parse_and_typed_getters():
    opts = Options.parse(["ttl = 5", "Endpoints=a,b c", "fast=yes", "ratio=0.5"])
    assert opts.get_int("ttl", 10) == 5
    assert opts.get_list("endpoints", []) == ["a", "b", "c"]
    assert opts.get_bool("fast", False) is True
    assert opts.get_float("ratio", 1.0) == 0.5
    assert opts.get_int("missing", 7) == 7


def test_options_refuse_undeclared_names():
    opts = Options.parse(["ttl=5"])
    with pytest.raises(errors.ConfigError, match=r"unknown option\(s\) ttl \(valid: endpoints\)"):
        opts.declare(["endpoints"])
    opts = Options.parse(["ttl=5"])
    opts.declare(["ttl"])
    assert opts.get_int("ttl", 1) == 5
    with pytest.raises(errors.AdapterContractError, match="does not declare"):
        opts.get_str("endpoints", "")


@pytest.mark.parametrize(
    "pairs, getter, message",
    [
        (["novalue"], None, "not of the form key=value"),
        (["=x"], None, "not of the form key=value"),
        (["ttl=abc"], ("get_int", "ttl", 1), "not a int"),
        (["ttl=-1"], ("get_int", "ttl", 1, 0), "below the minimum"),
        (["fast=maybe"], ("get_bool", "fast", False), "not a boolean"),
    ],
)
def test_bad_options_raise_config_error(pairs, getter, message):
    with pytest.raises(errors.ConfigError, match=message):
        opts = Options.parse(pairs)
        if getter:
            getattr(opts, getter[0])(*getter[1:])


def test_unknown_option_fails_open_before_the_adapter_exists(tmp_path):
    path = tmp_path / "typo.tdb"
    with pytest.raises(errors.ConfigError, match="unknown option.*typo"):
        _open("tdb", ["typo=1"], name=str(path))
    assert not path.exists()


# -- the declared option schema -----------------------------------------------

TIMEOUT = Option("timeout", float, 30.0, minimum=0.0)
SCHEMA = (TIMEOUT, Option("hosts", list, ["a"]), Option("token", str, "", secret=True))


def _declared(*pairs: str) -> Options:
    opts = Options.parse(pairs)
    opts.declare(SCHEMA)
    return opts


@pytest.mark.parametrize("pair, message", [
    ("timeout=soon", r"option timeout='soon' is not a float"),
    ("timeout=-1", r"option timeout=-1.0 is below the minimum 0.0"),
])
def test_declare_refuses_a_bad_value_naming_the_option(pair, message):
    with pytest.raises(errors.ConfigError, match=message):
        _declared(pair)


def test_a_bad_value_fails_open_naming_the_option_before_the_adapter_exists(tmp_path):
    path = tmp_path / "typed.tdb"
    with pytest.raises(errors.ConfigError, match=r"adapter 'tdb': option native_records='maybe' is not a boolean"):
        _open("tdb", ["native_records=maybe"], name=str(path))
    assert not path.exists()


def test_value_is_the_declared_type_or_the_declared_default():
    assert _declared("timeout=2.5").value("timeout") == 2.5
    opts = _declared()
    assert opts.value("timeout") == 30.0 and opts.value("token") == ""
    hosts = opts.value("hosts")
    hosts.append("b")  # a list default is a copy: the declaration keeps its own
    assert opts.value("hosts") == ["a"]


def test_a_stricter_minimum_of_one_reader_is_checked():
    with pytest.raises(errors.ConfigError, match="option timeout=0.5 is below the minimum 1.0"):
        _declared("timeout=0.5").value("timeout", minimum=1.0)


def test_reading_an_undeclared_option_is_an_adapter_bug():
    with pytest.raises(errors.AdapterContractError, match="reads option 'port' but does not declare it"):
        _declared().value("port")
    with pytest.raises(errors.AdapterContractError, match="does not declare"):
        Options({"port": "1"}).value("port")  # no schema at all: no type, no default to give


def test_the_secret_flag_drives_redaction():
    opts = _declared("token=s3cr3t", "timeout=1")
    assert "s3cr3t" not in repr(opts) and REDACTED in repr(opts) and "'1'" in repr(opts)
    assert is_secret("token", SCHEMA) and not is_secret("timeout", SCHEMA)
    assert not is_secret("token"), "without its schema a name is judged by the fallback only"
    assert shown_options(["token=s3cr3t"], SCHEMA) == f"token={REDACTED}"
    assert shown_value("token", "s3cr3t") == "s3cr3t"


def test_password_and_key_stay_secret_whatever_a_schema_says():
    careless = (Option("password"), Option("key"))
    for name in ("password", "key", " Password "):
        assert is_secret(name) and is_secret(name, careless)
        assert shown_value(name, "x", careless) == REDACTED


def test_a_refused_secret_value_is_not_in_the_message():
    with pytest.raises(errors.ConfigError) as bad:
        Options.parse(["pin=12345"]).declare((Option("pin", int, 0, minimum=99999, secret=True),))
    assert "12345" not in str(bad.value)
    with pytest.raises(errors.ConfigError) as typed:
        Options.parse(["pin=abcde"]).declare((Option("pin", int, 0, secret=True),))
    assert "abcde" not in str(typed.value) and REDACTED in str(typed.value)


def test_option_names_follow_the_schema_and_names_only_keep_the_inherited_types():
    from dbwrap_py.adapters.tdb.adapter import TdbAdapter

    class Names(TdbAdapter):
        option_names = TdbAdapter.option_names + ("extra",)

    assert TdbAdapter.option_names == ("native_records",)
    assert [o.kind for o in Names.options_schema] == [bool, str]
    opts = Options({"native_records": "no"})
    opts.adopt(Names.options_schema)
    assert opts.value("native_records") is False and opts.value("extra") == ""


def test_an_option_of_no_known_kind_is_an_adapter_bug():
    with pytest.raises(errors.AdapterContractError, match="kind"):
        Option("when", dict)


# -- exception mapping ------------------------------------------------------


def test_every_ntstatus_value_matches_samba():
    """Our constants against Samba's own nt_errstr() from libsamba-errors."""
    lib = ctypes.CDLL("libsamba-errors.so.1")
    lib.nt_errstr.restype = ctypes.c_char_p
    lib.nt_errstr.argtypes = [ctypes.c_uint32]
    for value, name in ntstatus.NAMES.items():
        assert lib.nt_errstr(value).decode() == name


@pytest.mark.parametrize(
    "exc, expected",
    [
        (errors.NotFound(), ntstatus.NT_STATUS_NOT_FOUND),
        (errors.NameCollision(), ntstatus.NT_STATUS_OBJECT_NAME_COLLISION),
        (errors.LockConflict(), ntstatus.NT_STATUS_FILE_LOCK_CONFLICT),
        (errors.FencedOut(), ntstatus.NT_STATUS_FILE_LOCK_CONFLICT),
        (errors.Unavailable(), ntstatus.NT_STATUS_DEVICE_NOT_READY),
        (errors.Timeout(), ntstatus.NT_STATUS_IO_TIMEOUT),
        (errors.WriteProtected(), ntstatus.NT_STATUS_MEDIA_WRITE_PROTECTED),
        (errors.NotSupported(), ntstatus.NT_STATUS_NOT_SUPPORTED),
        (errors.Corruption(), ntstatus.NT_STATUS_INTERNAL_DB_CORRUPTION),
        (errors.AccessDenied(), ntstatus.NT_STATUS_ACCESS_DENIED),
        (errors.ConfigError(), ntstatus.NT_STATUS_INVALID_PARAMETER),
        (errors.AdapterContractError(), ntstatus.NT_STATUS_INTERNAL_DB_ERROR),
        (MemoryError(), ntstatus.NT_STATUS_NO_MEMORY),
        (KeyError("x"), ntstatus.NT_STATUS_INTERNAL_DB_ERROR),
    ],
)
def test_exceptions_map_to_ntstatus(exc, expected):
    assert errors.ntstatus_of(exc) == expected


@pytest.mark.parametrize(
    "rule, call, exc",
    [
        ("get:wrongtype", lambda db: db.fetch(b"k"), errors.AdapterContractError),
        ("get:raise", lambda db: db.fetch(b"k"), RuntimeError),
        ("get:typed-Timeout", lambda db: db.fetch(b"k"), errors.Timeout),
        ("remove:wrongtype", lambda db: db.delete(b"k"), errors.AdapterContractError),
        ("exists:wrongtype", lambda db: db.exists(b"k"), errors.AdapterContractError),
        ("seqnum:wrongtype", lambda db: db.seqnum(), errors.AdapterContractError),
        ("scan:wrongtype", lambda db: list(db.traverse(False)), errors.AdapterContractError),
        ("db_id:none", lambda db: db.db_id(), errors.AdapterContractError),
        ("scan:none", lambda db: list(db.traverse(True)), errors.AdapterContractError),
    ],
)
def test_contract_violations_become_typed_errors(rule, call, exc):
    db = _open("dbwrap_py_fixtures.misbehaving", [f"break={rule}"])
    with pytest.raises(exc):
        call(db)


def test_lock_is_released_when_the_read_after_it_fails():
    db = _open("dbwrap_py_fixtures.misbehaving", ["break=get:raise"])
    with pytest.raises(RuntimeError):
        db.lock(b"k")
    assert db.records.held(b"k") == 0


# -- framework-derived semantics --------------------------------------------


def test_locks_are_reentrant_per_process():
    calls = []
    adapter = _open("memory").adapter
    # the record rules bind the adapter's methods when the database opens
    adapter.lock = lambda key: calls.append(("lock", key))
    adapter.unlock = lambda key: calls.append(("unlock", key))
    db = Database(adapter)
    db.lock(b"k")
    db.lock(b"k")
    db.unlock(b"k")
    assert calls == [("lock", b"k")]
    db.unlock(b"k")
    assert calls == [("lock", b"k"), ("unlock", b"k")]


def test_close_releases_held_locks_once_and_refuses_later_calls():
    calls = []
    db = _open("memory")
    db.adapter.unlock = lambda key: calls.append(("unlock", key))
    db.adapter.close = lambda: calls.append(("close",))
    db.lock(b"a")
    db.lock(b"a")
    db.close()
    db.close()
    assert calls == [("unlock", b"a"), ("close",)]
    with pytest.raises(errors.Unavailable, match="closed"):
        db.fetch(b"a")


def test_capabilities_are_switches_the_framework_reads():
    """transactions=False refuses transactions before the adapter sees them; a
    value over max_value_size fails in the record rules, and the lock still goes."""
    from dbwrap_py.adapter import Capabilities, DatabaseSpec
    from dbwrap_py.adapters.memory import MemoryAdapter

    calls = []

    class Declaring(MemoryAdapter):
        capabilities = Capabilities(transactions=False, multi_process=False, max_value_size=4)

        def transaction_start(self, nonblock=False):
            calls.append("transaction_start")

        def unlock(self, key):
            calls.append(("unlock", key))

    db = Database(Declaring(DatabaseSpec("p.tdb"), Options()))
    with pytest.raises(errors.NotSupported, match="declares no transactions"):
        db.transaction_start(False)
    db.lock(b"k")
    with pytest.raises(errors.InvalidParameter, match="5-byte value is over"):
        db.unlock(b"k", b"12345")
    assert calls == [("unlock", b"k")] and db.records.held(b"k") == 0
    db.lock(b"k")
    with pytest.raises(errors.InvalidParameter, match="max_value_size of 4 bytes"):
        db.store(b"k", b"12345", 0)
    db.unlock(b"k", b"1234")
    assert db.fetch(b"k") == b"1234"


def test_leased_adapter_is_exported():
    import dbwrap_py
    from dbwrap_py.leased import KEEP, LeasedAdapter, LeaseSource

    assert dbwrap_py.LeasedAdapter is LeasedAdapter
    assert (dbwrap_py.LeaseSource, dbwrap_py.KEEP) == (LeaseSource, KEEP)


def _recording_leased(lease_source, options=None):
    """A dict-backed leased adapter that records what the framework hands its primitives."""
    from dbwrap_py.leased import KEEP, LeasedAdapter

    class Recording(LeasedAdapter):
        def __init__(self, spec, opts):
            super().__init__(spec, opts)
            self.data, self.holders, self.calls = {}, {}, []

        def take_lease(self, key, token, seconds, read):
            self.calls.append(("take_lease", seconds, read))
            if key in self.holders:
                return False, None
            self.holders[key] = token
            return True, self.data.get(key) if read else None

        def fenced_write(self, key, token, value):
            self.calls.append(("fenced_write",))
            return self._write(key, token, value)

        def _write(self, key, token, value):
            if self.holders.get(key) != token:
                return False
            self.data.pop(key, None) if value is None else self.data.__setitem__(key, value)
            return True

        def end_lease(self, key, token, value=KEEP):
            self.calls.append(("end_lease", value))
            written = value is KEEP or self._write(key, token, value)
            if self.holders.get(key) == token:
                del self.holders[key]
            return written

        def get(self, key):
            return self.data.get(key)

        def scan(self):
            return list(self.data.items())

    if lease_source is not None:
        Recording.lease_source = lease_source
    from dbwrap_py.adapter import DatabaseSpec

    return Recording(DatabaseSpec("db.tdb"), Options(options or {}))


def test_leased_adapter_hands_durations_and_does_lock_get_and_put_unlock_in_one_step_each():
    from dbwrap_py.leased import LeaseSource

    adapter = _recording_leased(LeaseSource.STORE_CLOCK, {"lease": "1.5"})
    assert adapter.lock_get(b"k") is None
    adapter.put_unlock(b"k", b"v")
    assert adapter.calls == [("take_lease", 1.5, True), ("end_lease", b"v")], \
        "a duration, never an expiry time; one primitive each"
    assert type(adapter).declared_capabilities({"lease": "1.5"}).lock_release_seconds == 1.5


def test_leased_adapter_rounds_server_ttls_up_to_whole_seconds():
    from dbwrap_py.leased import LeaseSource

    adapter = _recording_leased(LeaseSource.SERVER_TTL, {"lease": "2.2"})
    adapter.lock(b"k")
    assert adapter.calls == [("take_lease", 3.0, False)]
    type(adapter).lease_slack = 0.5
    assert type(adapter).declared_capabilities({"lease": "2.2"}).lock_release_seconds == 3.5


def test_leased_adapter_fences_a_holder_whose_lease_was_taken():
    from dbwrap_py.leased import LeaseSource

    adapter = _recording_leased(LeaseSource.STORE_CLOCK)
    adapter.lock(b"k")
    adapter.holders[b"k"] = 12345  # the store ended our lease and gave it to another holder
    with pytest.raises(errors.FencedOut):
        adapter.put(b"k", b"stale")
    with pytest.raises(errors.FencedOut):
        adapter.put_unlock(b"k", b"stale")
    assert adapter.data == {}
    with pytest.raises(errors.LockConflict, match="without holding"):
        adapter.put(b"k", b"v")


def test_leased_adapter_must_declare_its_lease_source():
    with pytest.raises(errors.AdapterContractError, match="lease_source"):
        _recording_leased(None)


def test_transactions_need_a_persistent_database():
    with pytest.raises(errors.NotSupported, match="persistent"):
        _open("memory").transaction_start(False)


# -- fork -------------------------------------------------------------------


def test_after_fork_runs_in_the_child_and_drops_held_locks():
    db = _open("memory")
    db.lock(b"held")
    seen = []
    db.adapter.after_fork = lambda: seen.append(os.getpid())
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        ok = seen == [os.getpid()] and db.records.held(b"held") == 0
        os.write(write_end, b"1" if ok else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read_end, 1) == b"1"
    assert seen == []  # not in the parent
    assert db.records.held(b"held") == 1


def test_failing_after_fork_makes_the_child_report_unavailable():
    db = _open("memory")

    def broken():
        raise OSError("cannot reconnect")

    db.adapter.after_fork = broken
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            db.fetch(b"k")
            os.write(write_end, b"no error")
        except errors.Unavailable as exc:
            os.write(write_end, str(exc).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    assert b"cannot reconnect" in os.read(read_end, 200)
    assert db.fetch(b"k") is None  # the parent is unaffected


# -- command line -----------------------------------------------------------


def test_cli_put_get_dump_on_tdb(tmp_path):
    path = str(tmp_path / "cli.tdb")
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "dbwrap_py.cli", *a], capture_output=True, text=True
    )
    assert run("put", "tdb", path, "k\\x00ey", "value").returncode == 0
    got = run("get", "tdb", path, "k\\x00ey")
    assert got.returncode == 0 and got.stdout.strip() == "value"
    assert run("get", "tdb", path, "other").returncode == 1
    dump = run("dump", "tdb", path)
    assert 'key(4) = "k\\x00ey"' in dump.stdout
    bad = run("get", "nosuch", path, "k")
    assert bad.returncode == 2 and "NT_STATUS_INVALID_PARAMETER" in bad.stderr
