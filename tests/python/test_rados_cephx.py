"""The rados adapter on a throwaway Ceph with cephx (python/dbwrap_py/testing/servers/rados.py,
``auth="cephx"``): a restricted user's credentials reach the cluster, and a
wrong key, missing caps or a keyring without the user fail with typed errors
and without waiting."""

from __future__ import annotations

import configparser
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.server


rados = pytest.importorskip("rados", reason="python3-rados (Debian) is not installed")

from dbwrap_py.adapter import TDB_CLEAR_IF_FIRST, DatabaseSpec  # noqa: E402
from dbwrap_py.testing.servers.rados import CephCluster  # noqa: E402
from dbwrap_py.adapters.rados.adapter import RadosAdapter  # noqa: E402
from dbwrap_py.errors import AccessDenied, ConfigError, DbwrapError  # noqa: E402
from dbwrap_py.options import Options  # noqa: E402

#: seconds an op may take: a refused login must not wait it out, let alone hang
OP_TIMEOUT = 3
#: a refusal is quick (measured ~0.01 s); this only tells a refusal from a hang
REFUSED_WITHIN = 10.0

Opener = Callable[..., RadosAdapter]


@pytest.fixture(scope="module")
def ceph() -> Iterator[CephCluster]:
    with CephCluster(osds=1, auth="cephx") as cluster:
        yield cluster


@pytest.fixture(scope="module")
def alice(ceph: CephCluster) -> str:
    """client.alice: read the maps, read and write the pool; her keyring's path."""
    return ceph.add_user("alice")


@pytest.fixture
def open_db(ceph: CephCluster, tmp_path: Path) -> Iterator[Opener]:
    """Opens databases on the cluster; closes them before the next test (and
    before the cluster stops: a watch outliving it times out unwatching)."""
    opened: list[RadosAdapter] = []

    def open_(name: str = "t.tdb", flags: int = TDB_CLEAR_IF_FIRST, **options: str) -> RadosAdapter:
        values = {**ceph.options(), "op_timeout": str(OP_TIMEOUT), **options}
        db = RadosAdapter(DatabaseSpec(str(tmp_path / name), tdb_flags=flags), Options(values))
        opened.append(db)
        return db

    yield open_
    for db in opened:
        db.close()


def keyring_with(path: Path, section: str, key: str) -> str:
    path.write_text(f"[{section}]\n\tkey = {key}\n")
    return str(path)


def key_in(keyring: str, section: str) -> str:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(keyring)
    return parser[section]["key"]


def test_clients_get_no_admin_key_unless_they_ask(ceph, alice):
    assert ceph.options() == {"conf": ceph.conf_path, "pool": ceph.pool}
    conf = configparser.ConfigParser(interpolation=None, strict=False)
    conf.read(ceph.conf_path)
    assert conf["global"]["auth client required"] == "cephx"
    assert not Path(conf["global"]["keyring"]).exists()  # the conf leads to no key
    sections = configparser.ConfigParser(interpolation=None)
    sections.read(alice)
    assert sections.sections() == ["client.alice"]
    assert ceph.options("admin")["keyring"] == ceph.admin_keyring != alice
    assert key_in(ceph.admin_keyring, "client.admin") != key_in(alice, "client.alice")
    client = rados.Rados(conffile=ceph.conf_path, conf={"client_mount_timeout": str(OP_TIMEOUT)})
    try:
        with pytest.raises(rados.Error):  # the conf alone: no key, no login
            client.connect(timeout=OP_TIMEOUT)
    finally:
        client.shutdown()


def test_a_restricted_user_locks_writes_and_reads(open_db, alice):
    db = open_db(user="alice", keyring=alice)
    db.lock(b"k")
    db.put_unlock(b"k", b"v")
    assert db.get(b"k") == b"v"
    assert open_db(user="alice", keyring=alice).get(b"k") == b"v"  # another opener sees it


def test_a_restricted_user_commits_a_persistent_transaction(open_db, alice):
    db = open_db("p.tdb", flags=0, user="alice", keyring=alice)
    db.transaction_start()
    for key in (b"a", b"b"):
        db.lock(key)
        db.put_unlock(key, b"committed " + key)
    db.transaction_commit()
    reader = open_db("p.tdb", flags=0, user="alice", keyring=alice)
    assert [reader.get(k) for k in (b"a", b"b")] == [b"committed a", b"committed b"]


def test_a_wrong_key_is_refused_at_connect_without_waiting(open_db, alice, tmp_path):
    wrong = subprocess.run(["ceph-authtool", "--gen-print-key"], capture_output=True, text=True,
                           check=True, timeout=30).stdout.strip()
    assert wrong and wrong != key_in(alice, "client.alice")
    keyring = keyring_with(tmp_path / "wrong.keyring", "client.alice", wrong)
    started = time.monotonic()
    # librados: PermissionDeniedError (EACCES) from connect
    with pytest.raises(AccessDenied, match=r"connect to the cluster.*permission denied"):
        open_db(user="alice", keyring=keyring)
    assert time.monotonic() - started < REFUSED_WITHIN


@pytest.mark.parametrize(("name", "osd_caps"), [("elsewhere", "allow rwx pool=some_other_pool"),
                                              ("reader", "allow r pool={pool}")])
def test_caps_that_do_not_let_the_user_write_the_pool_are_refused(ceph, open_db, name, osd_caps):
    """The login and the pool lookup succeed (mon 'allow r'); the first write,
    at open, is refused by the OSD: librados PermissionError (EPERM)."""
    keyring = ceph.add_user(name, {"mon": "allow r", "osd": osd_caps.format(pool=ceph.pool)})
    started = time.monotonic()
    with pytest.raises(AccessDenied, match=r"open: .*permission error"):
        open_db(user=name, keyring=keyring)
    assert time.monotonic() - started < REFUSED_WITHIN


def test_a_keyring_without_the_user_is_a_config_error(open_db, alice, tmp_path):
    keyring = keyring_with(tmp_path / "other.keyring", "client.bob", key_in(alice, "client.alice"))
    with pytest.raises(ConfigError, match=r"no key for client\.alice"):
        open_db(user="alice", keyring=keyring)


def test_the_confs_keyring_serves_a_user_named_without_one(ceph, open_db, alice, tmp_path):
    """user = alice and no keyring option: the key is read, at open, from
    the conf's keyring files ($name expanded); with none there, the error says so."""
    (tmp_path / "client.alice.keyring").write_text(Path(alice).read_text())
    conf = tmp_path / "ceph.conf"
    conf.write_text(Path(ceph.conf_path).read_text() + f"\n[client]\nkeyring = {tmp_path}/$name.keyring\n")
    db = open_db(conf=str(conf), user="alice")
    db.lock(b"k")
    db.put_unlock(b"k", b"v")
    assert db.get(b"k") == b"v"
    (tmp_path / "client.alice.keyring").unlink()
    with pytest.raises(DbwrapError, match="no key was found: give keyring"):
        open_db("other.tdb", conf=str(conf), user="alice")
