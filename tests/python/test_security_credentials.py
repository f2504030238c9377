"""Issue 39, credentials: a local user without privileges, or someone on the
network, goes after the etcd and Cassandra passwords (and the cephx key).
Each test named for an attack performs it and shows it refused or the
secret redacted; the others show what must keep working.

The rules are ``dbwrap_py.options``'s (SECRET_OPTIONS, read_secret_file,
password_of) and the node agent's (--options-file).
"""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_etcd import open_etcd, put

from dbwrap_py.adapters.cassandra import client as cc
from dbwrap_py.adapters.etcd.client import _Config as EtcdConfig
from dbwrap_py.testing.servers.etcd import EtcdCluster, EtcdTls
from dbwrap_py.errors import AccessDenied, ConfigError, DbwrapError, UnsafePath
from dbwrap_py.nodecache.agent import OPTIONS_FILE, NodeAgentProcess, main as agent_main, read_options_file
from dbwrap_py.options import REDACTED, Options, password_of, read_secret_file, shown_options
from dbwrap_py.proxy.client import ProxyClient
from dbwrap_py.proxy.daemon import ProxyDaemonProcess
from dbwrap_py.servers.tls import Pki, issue, make_ca, make_pki

#: the password every test hides; it must show up nowhere
SECRET = "hunter2-do-not-print"
ROOT_PASSWORD = "root-secret"
#: an unprivileged user's uid (Debian's nobody)
OTHER_UID = 65534


def secret_file(directory: Path, mode: int = 0o600, text: str = SECRET + "\n", name: str = "pw") -> Path:
    path = directory / name
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.fixture(scope="module")
def auth_etcd() -> Iterator[EtcdCluster]:
    """Plain http, auth on: root, and smbd (password SECRET) on dbwrap_py/ only."""
    with EtcdCluster() as cluster:
        cluster.enable_auth(ROOT_PASSWORD)
        cluster.add_user("smbd", SECRET, key_prefix="dbwrap_py/")
        yield cluster


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


# -- redaction: repr, logs, messages ------------------------------------------------


def test_password_in_options_repr_is_redacted():
    options = Options({"user": "smbd", "password": SECRET, "endpoints": "127.0.0.1:2379"})
    for text in (repr(options), str(options), f"{options}", shown_options(options),
                 shown_options([f"password={SECRET}", "user=smbd"])):
        assert SECRET not in text and REDACTED in text, text
    assert "smbd" in repr(options), "what is not a secret is still shown"


def test_password_in_config_dataclasses_repr_is_redacted():
    etcd = EtcdConfig.from_options(Options({"endpoints": "127.0.0.1:1", "user": "u", "password": SECRET,
                                            "allow_plaintext": "yes"}))
    assert etcd.password == SECRET and SECRET not in repr(etcd)
    cassandra = cc.ClientConfig.from_options(
        Options({"user": "u", "password": SECRET, "allow_plaintext": "yes"}), 1.0)
    assert cassandra.password == SECRET and SECRET not in repr(cassandra)


def test_cephx_key_in_rados_client_settings_repr_is_redacted():
    rados_client = pytest.importorskip("dbwrap_py.adapters.rados.client")
    key = "AQBfake+cephx+key+do+not+print=="
    config = rados_client.ClientConfig(settings=(("key", key), ("mon_host", "127.0.0.1")), user="admin", pool="p")
    assert key not in repr(config) and REDACTED in repr(config) and "127.0.0.1" in repr(config)


def test_password_in_a_refused_option_message_is_redacted():
    options = Options({"password": SECRET})
    options.declare(["password"])
    with pytest.raises(ConfigError) as bad:
        options.get_bool("password", False)  # a message that quotes the value it refuses
    assert SECRET not in str(bad.value) and REDACTED in str(bad.value)
    with pytest.raises(ConfigError) as plain:
        EtcdConfig.from_options(Options({"endpoints": "127.0.0.1:1", "user": "u", "password": SECRET}))
    assert SECRET not in str(plain.value)


@pytest.mark.server
def test_password_in_proxy_daemon_log_on_reopen_with_other_options_is_redacted(auth_etcd, tmp_path):
    """smb.conf changed under the daemon: it logs both option sets, never the password."""
    path = str(tmp_path / "reopened.tdb")
    first = [f"endpoints={auth_etcd.endpoints}", "user=smbd", f"password={SECRET}", "allow_plaintext=yes",
             "lease_ttl=1", "op_timeout=3"]
    with ProxyDaemonProcess() as daemon:
        with ProxyClient(daemon.socket_path, 10.0) as one, ProxyClient(daemon.socket_path, 10.0) as two:
            one.hello()
            two.hello()
            a = one.open(path, "etcd", first)
            b = two.open(path, "etcd", [*first[:-1], "op_timeout=4"])
            one.lock(a, b"k")
            one.unlock(a, b"k", b"v")
            assert two.fetch(b, b"k") == b"v"
        log = daemon.log_text()
    assert "opened again with other options" in log, log
    assert SECRET not in log and f"password={REDACTED}" in log, log


# -- password_file ------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602])
def test_world_or_group_readable_password_file_is_refused(tmp_path, mode):
    path = secret_file(tmp_path, mode)
    with pytest.raises(UnsafePath) as refused:
        read_secret_file(path)
    message = str(refused.value)
    assert str(path) in message and f"{mode:04o}" in message, message
    assert SECRET not in message


def test_password_file_of_another_user_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to give the file away")
    path = secret_file(tmp_path)
    os.chown(path, OTHER_UID, -1)
    with pytest.raises(UnsafePath, match=f"owned by uid {OTHER_UID}") as refused:
        read_secret_file(path)
    assert str(path) in str(refused.value)


def test_password_file_through_a_link_is_refused(tmp_path):
    link = tmp_path / "link"
    link.symlink_to(secret_file(tmp_path))
    with pytest.raises(UnsafePath, match="symbolic link") as refused:
        read_secret_file(link)
    assert str(link) in str(refused.value)


def test_missing_password_file_is_a_config_error_naming_it(tmp_path):
    with pytest.raises(ConfigError, match="cannot read") as refused:
        read_secret_file(tmp_path / "missing")
    assert str(tmp_path / "missing") in str(refused.value)


def test_password_file_is_read_with_its_newline_stripped(tmp_path):
    assert read_secret_file(secret_file(tmp_path)) == SECRET
    assert read_secret_file(secret_file(tmp_path, text=SECRET + "\n\n", name="two")) == SECRET + "\n"
    assert read_secret_file(secret_file(tmp_path, text=SECRET, name="none")) == SECRET


def test_relative_password_file_is_looked_up_in_credentials_directory(tmp_path, monkeypatch):
    secret_file(tmp_path, name="etcd-password")
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    with pytest.raises(ConfigError, match="CREDENTIALS_DIRECTORY"):
        read_secret_file("etcd-password")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    assert read_secret_file("etcd-password") == SECRET


def test_password_and_password_file_together_are_refused(tmp_path):
    options = Options({"password": SECRET, "password_file": str(secret_file(tmp_path))})
    with pytest.raises(ConfigError, match="password and password_file"):
        password_of(options, tls=True)


@pytest.mark.server
def test_etcd_logs_in_with_password_file(auth_etcd, tmp_path):
    path = secret_file(tmp_path)
    db = open_etcd(auth_etcd.endpoints, str(tmp_path / "f.tdb"), user="smbd", password_file=str(path),
                   allow_plaintext="yes")
    put(db, b"k", b"v")
    assert db.fetch(b"k") == b"v"
    db.close()
    path.chmod(0o644)
    with pytest.raises(UnsafePath, match="0644"):
        open_etcd(auth_etcd.endpoints, str(tmp_path / "f.tdb"), user="smbd", password_file=str(path),
                  allow_plaintext="yes")


# -- plaintext ----------------------------------------------------------------------


def test_etcd_password_without_tls_is_refused(tmp_path):
    for given in ({"password": SECRET}, {"password_file": str(secret_file(tmp_path))}):
        options = Options({"endpoints": "127.0.0.1:2379", "user": "smbd", **given})
        with pytest.raises(ConfigError, match="allow_plaintext") as refused:
            EtcdConfig.from_options(options)
        assert next(iter(given)) in str(refused.value) and SECRET not in str(refused.value)
    # one endpoint of several in clear text is enough to refuse
    mixed = Options({"endpoints": "https://127.0.0.1:2379,http://127.0.0.2:2379", "user": "smbd",
                     "password": SECRET})
    with pytest.raises(ConfigError, match="allow_plaintext"):
        EtcdConfig.from_options(mixed)
    assert EtcdConfig.from_options(Options({"endpoints": "https://127.0.0.1:2379", "user": "smbd",
                                            "password": SECRET})).password == SECRET
    assert EtcdConfig.from_options(Options({"endpoints": "127.0.0.1:2379", "user": "smbd", "password": SECRET,
                                            "allow_plaintext": "yes"})).password == SECRET


def test_cassandra_password_without_tls_is_refused(pki):
    with pytest.raises(ConfigError, match="allow_plaintext") as refused:
        cc.ClientConfig.from_options(Options({"user": "cassandra", "password": SECRET}), 1.0)
    assert "option password" in str(refused.value) and SECRET not in str(refused.value)
    with_tls = cc.ClientConfig.from_options(
        Options({"user": "cassandra", "password": SECRET, "tls_ca": str(pki.ca.cert)}), 1.0)
    assert with_tls.password == SECRET


# -- the node agent's argv ----------------------------------------------------------


def test_password_on_node_agent_argv_is_refused(tmp_path, capsys):
    status = agent_main(["--adapter", "etcd", "--cache-dir", str(tmp_path), "-o", "endpoints=127.0.0.1:1",
                         "-o", f"password={SECRET}"])
    err = capsys.readouterr().err
    assert status == 1 and "--options-file" in err and "-o password" in err, err
    assert SECRET not in err


@pytest.mark.parametrize(("mode", "why"), [(0o620, "group may write"), (0o602, "others may write"),
                                          (0o644, "readable")])
def test_node_agent_options_file_open_to_others_is_refused(tmp_path, mode, why):
    path = secret_file(tmp_path, mode, text=f"endpoints=127.0.0.1:1\npassword={SECRET}\n")
    with pytest.raises(UnsafePath, match=why) as refused:
        read_options_file(path)
    assert str(path) in str(refused.value) and f"{mode:04o}" in str(refused.value)
    assert SECRET not in str(refused.value)


def test_node_agent_options_file_lines(tmp_path):
    path = secret_file(tmp_path, 0o644, text="# the store\nendpoints = 127.0.0.1:1\n\n prefix=x \n")
    assert read_options_file(path) == ["endpoints = 127.0.0.1:1", "prefix=x"]


@pytest.mark.server
def test_password_is_not_on_a_running_node_agents_cmdline(auth_etcd, tmp_path):
    options = {"endpoints": auth_etcd.endpoints, "user": "smbd", "password": SECRET, "allow_plaintext": "yes"}
    with NodeAgentProcess("etcd", options, cache_dir=tmp_path / "cache", ttl=2) as agent:
        assert agent.pid is not None
        cmdline = Path(f"/proc/{agent.pid}/cmdline").read_bytes()
        assert SECRET.encode() not in cmdline and b"--options-file" in cmdline, cmdline
        written = agent.cache_dir / OPTIONS_FILE
        assert written.stat().st_mode & 0o777 == 0o600
    assert SECRET not in (tmp_path / "cache" / "agent.log").read_text(errors="replace")


# -- TLS host names -----------------------------------------------------------------


@pytest.mark.server
def test_etcd_server_certificate_for_another_name_is_refused(pki, tmp_path):
    """The certificate names 127.0.0.1 only: reached as localhost, it is refused."""
    with EtcdCluster(tls=EtcdTls(pki.server.cert, pki.server.key)) as cluster:
        port = cluster.endpoints.rsplit(":", 1)[1]
        good = open_etcd(f"https://127.0.0.1:{port}", str(tmp_path / "a.tdb"), ca_file=pki.ca.cert)
        put(good, b"k", b"v")
        good.close()
        bad = open_etcd(f"https://localhost:{port}", str(tmp_path / "b.tdb"), ca_file=pki.ca.cert)
        with pytest.raises(AccessDenied, match="(?i)hostname|mismatch") as refused:
            bad.fetch(b"k")
        bad.close()
        assert "localhost" in str(refused.value)


class _TlsListener:
    """A TLS server on 127.0.0.1 presenting ``cert``: the handshake is all
    it does (a server that is not the one named in the certificate)."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert, key)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.handshakes = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            try:
                with self.context.wrap_socket(conn, server_side=True) as tls:
                    self.handshakes += 1
                    tls.settimeout(0.5)
                    tls.recv(1)
            except (OSError, ssl.SSLError):
                conn.close()

    def close(self) -> None:
        self.sock.close()


def _cassandra_session_error(options: dict[str, str]) -> str:
    config = cc.ClientConfig.from_options(Options(options), 1.0)
    with pytest.raises(Exception) as failed:
        cc._Session(config)
    return str(failed.value)


def test_cassandra_server_certificate_for_another_name_is_refused(tmp_path):
    """Signed by the trusted CA but for 127.0.0.2: contacted as 127.0.0.1 the
    handshake fails on the name; tls_check_hostname = no lets it through
    (to a server that then speaks no CQL)."""
    ca = make_ca(tmp_path)
    other = issue(ca, tmp_path, "other", server=True, ips=("127.0.0.2",))
    listener = _TlsListener(other.cert, other.key)
    try:
        options = {"contact_points": f"127.0.0.1:{listener.port}", "tls_ca": str(ca.cert)}
        assert cc.ClientConfig.from_options(Options(options), 1.0).tls.check_hostname
        message = _cassandra_session_error(options)
        assert "mismatch" in message or "match" in message, message
        assert listener.handshakes == 0
        unchecked = {**options, "tls_check_hostname": "no"}
        assert not cc.ClientConfig.from_options(Options(unchecked), 1.0).tls.check_hostname
        message = _cassandra_session_error(unchecked)
        assert "mismatch" not in message, message
        assert listener.handshakes > 0, "with the check off the handshake went through"
    finally:
        listener.close()


@pytest.mark.server
@pytest.mark.xdist_group("cassandra")  # a JVM: with the other Cassandra tests, one at a time
def test_cassandra_tls_checks_the_host_name_and_carries_the_password(tmp_path):
    """Real Cassandras taking CQL over TLS only, with password auth on.
    Its certificate for 127.0.0.1 (an IP SAN: the driver connects to
    addresses, resolving names first): the adapter logs in with a
    password_file over TLS, no allow_plaintext needed. A certificate from
    the same CA for another address (a server posing as this one): refused
    on the name; tls_check_hostname = no keeps the CA check alone, which
    lets it through."""
    from dbwrap_py.testing.servers.cassandra import CassandraCluster, CassandraTls
    from dbwrap_py.database import open_database

    pki = make_pki(tmp_path / "pki")
    elsewhere = issue(pki.ca, tmp_path / "pki", "elsewhere", server=True, ips=("127.0.0.9",))

    def opened(reach: dict[str, str], name: str, **extra: str) -> Any:
        password = secret_file(tmp_path, text=reach["password"] + "\n", name="cassandra-password")
        options = {**{k: v for k, v in reach.items() if k != "password"}, "password_file": str(password),
                   "op_timeout": "10", **extra}
        return open_database(str(tmp_path / name), 0, 0, os.O_RDWR | os.O_CREAT, 0o600, 0, 0, "cassandra",
                             [f"{k}={v}" for k, v in options.items()])

    right = CassandraTls(ca=pki.ca.cert, cert=pki.server.cert, key=pki.server.key)
    with CassandraCluster(nodes=1, auth="password", tls=right) as cluster:
        reach = cluster.options()
        assert "allow_plaintext" not in reach and reach["tls_ca"] == str(pki.ca.cert)
        db = opened(reach, "a.tdb")
        put(db, b"k", b"over TLS")
        assert db.fetch(b"k") == b"over TLS"
        db.close()

    wrong = CassandraTls(ca=pki.ca.cert, cert=elsewhere.cert, key=elsewhere.key)
    with CassandraCluster(nodes=1, auth="password", tls=wrong) as cluster:
        reach = cluster.options()
        with pytest.raises(DbwrapError) as refused:
            opened(reach, "b.tdb").fetch(b"k")
        assert "127.0.0.1" in str(refused.value) and "mismatch" in str(refused.value), refused.value
        unchecked = opened(reach, "c.tdb", tls_check_hostname="no")
        put(unchecked, b"k", b"CA check only")
        assert unchecked.fetch(b"k") == b"CA check only"
        unchecked.close()
