"""The etcd adapter's TLS and auth options against real etcd servers.

ca_file, cert_file, key_file, user and password, against throwaway etcds on
127.0.0.1 with https client URLs (certificates from dbwrap_py.servers.tls,
made with openssl in the test's temporary directory), with client
certificate auth, and with etcd's user/password auth turned on.
Each refusal must be a typed error (AccessDenied), at once, not a retry loop
that ends in Unavailable after op_timeout.
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_etcd import TDB_REPLACE, Child, open_etcd, put  # the same helpers as the plain-http tests

from dbwrap_py.database import Database
from dbwrap_py.errors import AccessDenied, Timeout, Unavailable
from dbwrap_py.testing.servers.etcd import EtcdCluster, EtcdTls
from dbwrap_py.servers.tls import KeyPair, Pki, issue, make_ca, make_pki

pytestmark = pytest.mark.server


ROOT_PASSWORD = "root-secret"
SMBD_PASSWORD = "smbd-secret"
#: etcd's --auth-token-ttl for the auth server: an unused token goes after ~2-3 s
TOKEN_TTL = 2
#: a refusal must come this fast: a retry loop would take the whole op_timeout (3 s)
AT_ONCE = 1.0


# -- servers and certificates -----------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def stranger(tmp_path_factory: pytest.TempPathFactory) -> tuple[KeyPair, KeyPair]:
    """Another CA, and a client certificate it signed: neither is the server's."""
    directory = tmp_path_factory.mktemp("stranger")
    ca = make_ca(directory, common_name="some other CA")
    return ca, issue(ca, directory, "client", server=False)


@pytest.fixture(scope="module")
def tls_etcd(pki: Pki) -> Iterator[EtcdCluster]:
    """https client URLs, any client."""
    with EtcdCluster(tls=EtcdTls(pki.server.cert, pki.server.key)) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def mtls_etcd(pki: Pki) -> Iterator[EtcdCluster]:
    """https client URLs, clients need a certificate signed by pki.ca."""
    tls = EtcdTls(pki.server.cert, pki.server.key, trusted_ca_file=pki.ca.cert, client_cert_auth=True)
    with EtcdCluster(tls=tls) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def auth_etcd() -> Iterator[EtcdCluster]:
    """Plain http, auth on: root, and smbd who may use dbwrap_py/ only."""
    with EtcdCluster(auth_token_ttl=TOKEN_TTL) as cluster:
        cluster.enable_auth(ROOT_PASSWORD)
        cluster.add_user("smbd", SMBD_PASSWORD, key_prefix="dbwrap_py/")
        yield cluster


@pytest.fixture
def name(tmp_path: Path) -> str:
    return str(tmp_path / "test.tdb")


def client_cert(pki: Pki) -> dict[str, Any]:
    return {"cert_file": pki.client.cert, "key_file": pki.client.key}


def smbd_login(password: str = SMBD_PASSWORD, plaintext: bool = True) -> dict[str, Any]:
    """smbd's login; over plain http (auth_etcd, on 127.0.0.1) allow_plaintext
    must say so, or the adapter refuses to send the password."""
    return {"user": "smbd", "password": password, **({"allow_plaintext": "yes"} if plaintext else {})}


def round_trip(db: Database) -> None:
    """put/get, lock_get + put_unlock, lock + unlock, delete, scan."""
    put(db, b"a", b"1")
    put(db, b"b", b"2")
    assert db.fetch(b"a") == b"1"
    assert db.lock(b"a") == b"1"
    db.unlock(b"a", b"one")  # put_unlock
    db.lock(b"b")
    db.unlock(b"b")  # plain unlock: the lock key goes, the record stays
    db.lock(b"c")
    db.unlock(b"c", b"3")
    db.lock(b"b")
    db.delete(b"b")
    db.unlock(b"b")
    assert dict(db.traverse(False)) == {b"a": b"one", b"c": b"3"}
    assert db.exists(b"c") and not db.exists(b"b")


def stored_keys(cluster: EtcdCluster, db: Database) -> set[bytes]:
    """The database's record keys as etcd itself has them (the adapter bypassed)."""
    prefix = db.db_id() + b"d/"
    end = prefix[:-1] + bytes([prefix[-1] + 1])
    reply = cluster.gateway(
        "/v3/kv/range",
        {"key": base64.b64encode(prefix).decode(), "range_end": base64.b64encode(end).decode(), "keys_only": True},
    )
    # d/<bucket>/<key>: the bucket's two hex digits and a slash come first
    return {base64.b64decode(kv["key"])[len(prefix) + 3:] for kv in reply.get("kvs", [])}


def refused_at_once(exc_type: type[Exception], fn: Any) -> str:
    """``fn()`` raises ``exc_type`` well within op_timeout; its message."""
    start = time.monotonic()
    with pytest.raises(exc_type) as failed:
        fn()
    took = time.monotonic() - start
    assert took < AT_ONCE, f"{exc_type.__name__} after {took:.2f} s: a retry loop, not a refusal"
    return str(failed.value)


# -- TLS --------------------------------------------------------------------------


def test_tls_with_ca_file(tls_etcd, pki, name):
    assert tls_etcd.endpoints.startswith("https://127.0.0.1:")
    db = open_etcd(tls_etcd.endpoints, name, ca_file=pki.ca.cert)
    round_trip(db)
    assert stored_keys(tls_etcd, db) == {b"a", b"c"}, "the records are in the TLS server"
    db.close()
    # host:port without a scheme: https, because ca_file is given
    bare = tls_etcd.endpoints.removeprefix("https://")
    again = open_etcd(bare, name, volatile=True, ca_file=pki.ca.cert)
    put(again, b"k", b"v")
    assert again.fetch(b"k") == b"v"
    again.close()


def test_tls_wrong_or_missing_ca_is_access_denied(tls_etcd, stranger, name):
    other_ca, _ = stranger
    db = open_etcd(tls_etcd.endpoints, name, ca_file=other_ca.cert)
    message = refused_at_once(AccessDenied, lambda: db.fetch(b"k"))
    assert "certificate did not verify" in message and "ca_file" in message, message
    refused_at_once(AccessDenied, lambda: db.lock(b"k"))
    db.close()
    # no ca_file: the system's CAs do not know the throwaway CA either
    db = open_etcd(tls_etcd.endpoints, name)
    refused_at_once(AccessDenied, lambda: db.fetch(b"k"))
    db.close()
    # a volatile open talks to etcd at once: the open itself fails
    refused_at_once(AccessDenied, lambda: open_etcd(tls_etcd.endpoints, name, volatile=True, ca_file=other_ca.cert))


def test_client_cert_auth(mtls_etcd, pki, stranger, name):
    db = open_etcd(mtls_etcd.endpoints, name, ca_file=pki.ca.cert, **client_cert(pki))
    round_trip(db)
    assert stored_keys(mtls_etcd, db) == {b"a", b"c"}
    db.close()

    # no client certificate: etcd's TLS 1.3 alert comes with the first reply
    db = open_etcd(mtls_etcd.endpoints, name, ca_file=pki.ca.cert)
    message = refused_at_once(AccessDenied, lambda: db.fetch(b"a"))
    assert "client certificate" in message, message
    refused_at_once(AccessDenied, lambda: db.lock(b"a"))
    db.close()
    refused_at_once(AccessDenied, lambda: open_etcd(mtls_etcd.endpoints, name, volatile=True, ca_file=pki.ca.cert))

    # a client certificate from a CA etcd does not trust
    _, foreign = stranger
    db = open_etcd(mtls_etcd.endpoints, name, ca_file=pki.ca.cert, cert_file=foreign.cert, key_file=foreign.key)
    refused_at_once(AccessDenied, lambda: db.fetch(b"a"))
    db.close()


def test_tls_client_cert_and_password_together(pki, tmp_path, name):
    tls = EtcdTls(pki.server.cert, pki.server.key, trusted_ca_file=pki.ca.cert, client_cert_auth=True)
    with EtcdCluster(tls=tls) as cluster:
        cluster.enable_auth(ROOT_PASSWORD)
        cluster.add_user("smbd", SMBD_PASSWORD, key_prefix="dbwrap_py/")
        db = open_etcd(cluster.endpoints, name, ca_file=pki.ca.cert, **client_cert(pki), **smbd_login(plaintext=False))
        round_trip(db)
        assert stored_keys(cluster, db) == {b"a", b"c"}
        db.close()
        db = open_etcd(cluster.endpoints, name, ca_file=pki.ca.cert, **client_cert(pki), **smbd_login("wrong", plaintext=False))
        refused_at_once(AccessDenied, lambda: db.fetch(b"a"))
        db.close()
        # etcd 3.4's gateway, with auth on, refuses a client certificate with a CommonName
        named = issue(pki.ca, tmp_path, "named", server=False, common_name="smbd")
        db = open_etcd(cluster.endpoints, name, ca_file=pki.ca.cert, cert_file=named.cert, key_file=named.key,
                       **smbd_login(plaintext=False))
        message = refused_at_once(AccessDenied, lambda: db.fetch(b"a"))
        assert "CommonName" in message, message
        db.close()


# -- user and password --------------------------------------------------------------


def test_password_auth(auth_etcd, name):
    db = open_etcd(auth_etcd.endpoints, name, **smbd_login())
    round_trip(db)
    db.transaction_start(False)
    db.store(b"t", b"in a transaction", TDB_REPLACE)
    db.transaction_commit()
    assert db.fetch(b"t") == b"in a transaction"
    assert stored_keys(auth_etcd, db) == {b"a", b"c", b"t"}
    db.close()
    root = open_etcd(auth_etcd.endpoints, name, user="root", password=ROOT_PASSWORD,
                   allow_plaintext="yes")
    assert root.fetch(b"a") == b"one"
    root.close()


def test_password_auth_refusals(auth_etcd, name):
    db = open_etcd(auth_etcd.endpoints, name, **smbd_login("wrong"))
    message = refused_at_once(AccessDenied, lambda: db.fetch(b"a"))
    assert "smbd" in message and "invalid user ID or password" in message, message
    refused_at_once(AccessDenied, lambda: db.lock(b"a"))
    db.close()
    refused_at_once(AccessDenied, lambda: open_etcd(auth_etcd.endpoints, name, volatile=True, **smbd_login("wrong")))
    # no user at all: etcd says "user name is empty"
    db = open_etcd(auth_etcd.endpoints, name)
    message = refused_at_once(AccessDenied, lambda: db.fetch(b"a"))
    assert "user name is empty" in message, message
    db.close()
    # a user whose role does not cover the adapter's prefix
    db = open_etcd(auth_etcd.endpoints, name, prefix="elsewhere", **smbd_login())
    message = refused_at_once(AccessDenied, lambda: db.fetch(b"a"))
    assert "permission denied" in message, message
    db.close()


def test_password_auth_logs_in_again_when_the_token_goes(auth_etcd, name):
    db = open_etcd(auth_etcd.endpoints, name, **smbd_login())
    put(db, b"k", b"0")
    transport = db.adapter._session.transport
    first = transport._token
    assert first

    # a password change (here to the same password) invalidates the user's tokens
    db.lock(b"k")
    auth_etcd.change_password("smbd", SMBD_PASSWORD)
    db.unlock(b"k", b"1")  # put_unlock, refused as unauthenticated, then sent again
    second = transport._token
    assert second != first
    assert db.fetch(b"k") == b"1"

    # an unused simple token expires after --auth-token-ttl, here with a lock held
    assert db.lock(b"k") == b"1"
    time.sleep(TOKEN_TTL + 1.5)
    db.unlock(b"k", b"2")
    assert transport._token not in (first, second)
    assert db.fetch(b"k") == b"2"

    # the password really changed: logging in again fails, clearly
    auth_etcd.change_password("smbd", "changed")
    try:
        message = refused_at_once(AccessDenied, lambda: db.fetch(b"k"))
        assert "invalid user ID or password" in message, message
    finally:
        auth_etcd.change_password("smbd", SMBD_PASSWORD)
    assert db.fetch(b"k") == b"2", "and works again once the password is back"
    db.close()


def test_login_without_quorum_is_a_timeout_not_access_denied(tmp_path):
    """etcd answers a login it cannot commit with "request timed out" after ~5 s."""
    with EtcdCluster(nodes=3) as cluster:
        cluster.enable_auth(ROOT_PASSWORD)
        cluster.stop_member(1)
        cluster.stop_member(2)
        db = open_etcd(cluster.member_endpoint(0), str(tmp_path / "q.tdb"),
                       op_timeout="8", user="root", password=ROOT_PASSWORD,
                   allow_plaintext="yes")
        start = time.monotonic()
        with pytest.raises((Timeout, Unavailable)):
            db.fetch(b"k")
        assert time.monotonic() - start < 8.5
        db.close()


# -- fork ---------------------------------------------------------------------------


@pytest.mark.parametrize("server", ["password", "client_cert"])
def test_forked_child_connects_and_authenticates_itself(server, request, pki, name):
    if server == "password":
        cluster: EtcdCluster = request.getfixturevalue("auth_etcd")
        options = smbd_login()
    else:
        cluster = request.getfixturevalue("mtls_etcd")
        options = {"ca_file": pki.ca.cert, **client_cert(pki)}
    db = open_etcd(cluster.endpoints, name, **options)
    put(db, b"k", b"parent")
    db.lock(b"held")
    parent_session = db.adapter._session
    parent_token = parent_session.transport._token

    def child_work(ch: Child) -> tuple[bytes | None, int, str | None, float, bytes | None]:
        value = db.fetch(b"k")
        put(db, b"k", b"child")
        session = db.adapter._session
        other = open_etcd(cluster.endpoints, name, **options)  # the inherited one thinks it holds b"held"
        ch.send("waiting")
        start = time.monotonic()
        held = other.lock(b"held")  # waits (a watch, on the child's own login) for the parent
        waited = time.monotonic() - start
        other.unlock(b"held")
        return value, session.pid, session.transport._token, waited, held

    child = Child(child_work)
    assert child.recv() == "waiting"
    time.sleep(0.3)
    db.unlock(b"held", b"released")
    value, child_pid, child_token, waited, held = child.result()
    assert value == b"parent"
    assert child_pid == child.pid and parent_session.pid == os.getpid()
    if server == "password":
        assert child_token and child_token != parent_token, "the child logged in itself"
    assert held == b"released" and 0.2 < waited < 2.5, waited
    assert db.fetch(b"k") == b"child", "the parent's connection still works"
    db.close()
