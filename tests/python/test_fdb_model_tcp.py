"""The model of FoundationDB on TCP (a networked cluster's ``throwaway_host``)
as well as on its unix socket: the cluster file names either, the client
reads both and refuses anything else naming the file, and every connection
the client makes (requests, a watch's own, the test controls) works on TCP
with TCP_NODELAY at both ends. Without a host, the unix socket as before."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import dbwrap_py.testing.fdb_model as fdb
from dbwrap_py.errors import ConfigError
from dbwrap_py.testing.fdb_model import _wire, tests_only
from dbwrap_py.testing.fdb_model.server import Store, TcpModelServer, _handler, listening_host
from dbwrap_py.testing.fdb_model.throwaway import DESCRIPTION, model_server
from dbwrap_py.testing.hooks import hooks_for

API = 730
#: an IPv4 address every host has (the test's stand-in for a bridge address)
HOST = "127.0.0.1"


# -- the cluster file: both forms, and the malformed ones --------------------------


@pytest.mark.parametrize("text, address", [
    ("d@unix:/run/model.sock\n", "/run/model.sock"),
    ("d@tcp:10.1.2.3:4500\n", ("10.1.2.3", 4500)),
    ("  d@tcp:127.0.0.1:1  ", ("127.0.0.1", 1)),
])
def test_both_forms_parse(text: str, address: _wire.Address) -> None:
    assert _wire.parse_cluster_text(text) == address


@pytest.mark.parametrize("address", ["/tmp/x/model.sock", ("192.0.2.7", 65535)])
def test_what_the_throwaway_writes_is_what_the_client_reads(address: _wire.Address) -> None:
    assert _wire.parse_cluster_text(_wire.cluster_text(DESCRIPTION, address)) == address


MALFORMED = [
    "",
    "no-at-sign",
    "@unix:/run/model.sock",  # no description
    "d@unix:",  # no path
    "d@udp:10.1.2.3:4500",
    "d:abcdef@10.1.2.3:4500",  # a real FoundationDB cluster file: never the model's
    "d@tcp:10.1.2.3",  # no port
    "d@tcp:localhost:4500",  # a name, not an IPv4 address
    "d@tcp:[::1]:4500",
    "d@tcp:10.1.2.3:0",
    "d@tcp:10.1.2.3:65536",
    "d@tcp:10.1.2.3:port",
]


@pytest.mark.parametrize("text", MALFORMED)
def test_a_malformed_cluster_file_is_refused_naming_it(text: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.cluster"
    path.write_text(text)
    with pytest.raises(fdb.FDBError) as refused:
        fdb.Control(str(path))
    assert refused.value.code == 2104
    assert str(path) in str(refused.value) and "names no model server" in str(refused.value)


def test_a_missing_cluster_file_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "absent.cluster"
    with pytest.raises(fdb.FDBError) as refused:
        fdb.Control(str(path))
    assert refused.value.code == 2104 and str(path) in str(refused.value)


def test_a_well_formed_file_naming_no_server_fails_with_1100_naming_the_address(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind((HOST, 0))
        port = s.getsockname()[1]
    path = tmp_path / "nobody.cluster"
    path.write_text(f"d@tcp:{HOST}:{port}\n")
    fdb.api_version(API)
    with pytest.raises(fdb.FDBError) as failed:
        fdb.open(str(path)).create_transaction().get(b"k").wait()
    assert failed.value.code == 1100 and f"{HOST}:{port}" in str(failed.value)


# -- the server's side ----------------------------------------------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "255.255.255.255", "224.0.0.1", "localhost", "::1", ""])
def test_the_server_listens_on_one_ipv4_address_never_a_wildcard(host: str) -> None:
    with pytest.raises(ConfigError):
        listening_host(host)
    assert listening_host(HOST) == HOST


def test_the_server_refuses_a_wildcard_address_from_the_command_line(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "dbwrap_py.testing.fdb_model.server", "--tcp", "0.0.0.0",
                          "--port-file", str(tmp_path / "port")], env=tests_only.test_run_environment(), cwd="/",
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "checks no peer" in run.stderr, run.stderr
    assert not (tmp_path / "port").exists()


def test_tcp_no_delay_on_both_ends() -> None:
    server = TcpModelServer((HOST, 0), _handler(Store()))
    try:
        client = _wire.connect(server.server_address)
        accepted, _ = server.get_request()
        with client, accepted:
            for end in (client, accepted):
                assert end.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        server.server_close()


# -- a whole server on TCP ------------------------------------------------------------


@pytest.fixture(scope="module")
def tcp_cluster_file() -> Iterator[Path]:
    with model_server(host=HOST) as path:
        yield path


@pytest.mark.server
def test_the_tcp_server_is_named_by_address_and_port(tcp_cluster_file: Path) -> None:
    address = _wire.parse_cluster_text(tcp_cluster_file.read_text())
    assert isinstance(address, tuple) and address[0] == HOST and address[1] > 0
    assert tcp_cluster_file.read_text() == f"{DESCRIPTION}@tcp:{HOST}:{address[1]}\n"
    assert not (tcp_cluster_file.parent / "model.sock").exists(), "a unix socket beside the TCP one"


@pytest.mark.server
def test_transactions_a_watch_and_the_controls_work_over_tcp(tcp_cluster_file: Path) -> None:
    fdb.api_version(API)
    db = fdb.open(str(tcp_cluster_file))
    key = f"tcp/{time.monotonic_ns()}".encode()
    db[key] = b"a"
    assert db[key] == b"a"
    tr = db.create_transaction()
    tr.get(key).wait()
    watch = tr.watch(key)  # a connection of its own, in the watch's thread
    tr.commit().wait()
    threading.Timer(0.2, lambda: db.__setitem__(key, b"b")).start()
    deadline = time.monotonic() + 10
    while not watch.is_ready() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert watch.is_ready() and db[key] == b"b"
    control = fdb.Control(str(tcp_cluster_file))
    try:
        control.inject("not_committed", 1)
        with pytest.raises(fdb.FDBError) as conflict:
            tr = db.create_transaction()
            tr.set(key, b"c")
            tr.commit().wait()
        assert conflict.value.code == 1020 and control.stats()["injected_not_committed"] >= 1
    finally:
        control.close()


@pytest.mark.server
@pytest.mark.parametrize("host, form", [(HOST, f"@tcp:{HOST}:"), (None, "@unix:")])
def test_the_hooks_listen_on_tcp_with_throwaway_host_and_on_a_unix_socket_without(host: str | None,
                                                                                 form: str) -> None:
    options = {"fdb_library": "model", **({"throwaway_host": host} if host else {})}
    with hooks_for("fdb").throwaway_server(options) as reach:
        text = Path(reach["cluster_file"]).read_text()
        assert text.startswith(DESCRIPTION + form), text
        control = fdb.Control(reach["cluster_file"])
        try:
            assert control.stats()["version"] > 0
        finally:
            control.close()
