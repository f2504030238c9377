"""dbwrap-py copy: records carried between backends, verified, never overwritten unasked."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from dbwrap_py import migrate
from dbwrap_py.cli import build_parser, main
from dbwrap_py.migrate import CopyRefused, Endpoint, copy_database

FIXTURES = str(Path(__file__).resolve().parents[1] / "fixtures")
TDB = Endpoint("tdb")
SQLITE = Endpoint("sqlite")
RECORDS = {b"SECRETS/SID/DBWRAPPY\x00": b"\x01\x04" + bytes(22), b"\x00\xff binary": b"",
           b"INFO/version\x00": b"\x04\x00\x00\x00"}


def fill(endpoint: Endpoint, name: str, records: dict[bytes, bytes]) -> None:
    db = endpoint.open(name, create=True)
    try:
        for key, value in records.items():
            db.lock(key)
            db.store(key, value, 0)
            db.unlock(key)
    finally:
        db.close()


def read(endpoint: Endpoint, name: str) -> dict[bytes, bytes]:
    db = endpoint.open(name, create=False)
    try:
        return dict(db.traverse(False))
    finally:
        db.close()


def test_tdb_to_sqlite_and_back_carries_every_record(tmp_path):
    name = str(tmp_path / "secrets.tdb")
    fill(TDB, name, RECORDS)
    report = copy_database(name, TDB, SQLITE)
    assert report.ok and report.transactional
    assert (report.copied, report.verified) == (3, 3)
    assert read(SQLITE, name) == RECORDS
    Path(name).rename(name + ".bak")
    back = copy_database(name, SQLITE, TDB)
    assert back.ok and read(TDB, name) == RECORDS


def test_a_non_empty_destination_is_refused_and_left_alone(tmp_path):
    name = str(tmp_path / "passdb.tdb")
    fill(TDB, name, RECORDS)
    fill(SQLITE, name, {b"theirs": b"keep me"})
    with pytest.raises(CopyRefused, match="already holds 1 records; pass --overwrite"):
        copy_database(name, TDB, SQLITE)
    assert read(SQLITE, name) == {b"theirs": b"keep me"}


def test_overwrite_replaces_and_removes_what_the_source_lacks(tmp_path):
    name = str(tmp_path / "registry.tdb")
    fill(TDB, name, RECORDS)
    fill(SQLITE, name, {b"stale": b"x", b"INFO/version\x00": b"old"})
    report = copy_database(name, TDB, SQLITE, overwrite=True)
    assert report.ok and report.overwritten == 2
    assert read(SQLITE, name) == RECORDS


def test_verification_catches_a_destination_that_loses_or_bends_records(tmp_path):
    name = str(tmp_path / "share_info.tdb")
    fill(TDB, name, {b"lost-1": b"a", b"bent-1": b"b", b"fine": b"c"})
    lossy = Endpoint("dbwrap_py_fixtures.lossy_sqlite")
    sys.path.insert(0, FIXTURES)
    try:
        report = copy_database(name, TDB, lossy)
    finally:
        sys.path.remove(FIXTURES)
    assert not report.ok
    assert report.missing == [b"lost-1"] and report.differing == [b"bent-1"]
    assert report.verified == 1


def test_empty_source_writes_nothing_and_volatile_databases_are_refused(tmp_path):
    name = str(tmp_path / "group_mapping.tdb")
    fill(TDB, name, {})
    report = copy_database(name, TDB, SQLITE)
    assert report.empty_source and not Path(name + ".sqlite").exists()
    with pytest.raises(CopyRefused, match="volatile: smbd wipes it"):
        copy_database(str(tmp_path / "locking.tdb"), TDB, SQLITE)
    with pytest.raises(CopyRefused, match="cannot open the source"):
        copy_database(str(tmp_path / "missing.tdb"), TDB, SQLITE)


def test_options_belong_to_the_side_named_before_them():
    args = build_parser().parse_args(
        ["copy", "--from", "etcd", "-o", "endpoints=a:1", "-o", "prefix=p",
         "--to", "sqlite", "-o", "timeout=3", "/x/secrets.tdb"])
    assert (args.source, args.from_options) == ("etcd", ["endpoints=a:1", "prefix=p"])
    assert (args.destination, args.to_options) == ("sqlite", ["timeout=3"])
    again = build_parser().parse_args(["copy", "--from", "tdb", "--to", "sqlite", "/x/y.tdb"])
    assert again.from_options == [] and again.to_options == []


def test_a_process_holding_the_database_open_stops_the_copy(tmp_path, capsys):
    name = str(tmp_path / "account_policy.tdb")
    fill(TDB, name, RECORDS)
    holder = subprocess.Popen([sys.executable, "-c",
                               f"f = open({name!r}, 'rb'); print('open', flush=True);"
                               " import time; time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        status = main(["copy", "--from", "tdb", "--to", "sqlite", name])
        err = capsys.readouterr().err
        assert status == 2
        assert f"(pid {holder.pid}) has {Path(name).resolve()} open" in err
        assert "Stop smbd, winbindd and nmbd first" in err
    finally:
        holder.kill()
        holder.wait()
    assert not Path(name + ".sqlite").exists()
    assert main(["copy", "--from", "tdb", "--to", "sqlite", name]) == 0
    assert "3 records copied in one transaction; 3 verified" in capsys.readouterr().out
