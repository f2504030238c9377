"""The etcd adapter's HTTP client (adapters/etcd/client.py) on bad replies.

No etcd: a fake JSON gateway on 127.0.0.1 (dbwrap_py.testing.fuzz_etcd_client)
answers each request with a script. The tests under "found by the fuzzer"
are the bugs its first runs found; the last ones run the fuzzer and its
broken example.
"""

from __future__ import annotations

import json
import time
import tracemalloc
from collections.abc import Iterator

import pytest

from dbwrap_py.adapters.etcd import client as client
from dbwrap_py.errors import DbwrapError, Timeout, Unavailable
from dbwrap_py.testing.fuzz_etcd_client import (
    CPU_BOUND,
    EtcdFuzzReport,
    FakeGateway,
    Script,
    broken_deadline,
    broken_parse,
    fuzz,
    summary,
    valid_reply,
)

OP_TIMEOUT = 0.5


@pytest.fixture
def gateway() -> Iterator[FakeGateway]:
    fake = FakeGateway(EtcdFuzzReport())
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()


def _config(port: int, user: str | None = None) -> client._Config:
    return client._Config(endpoints=(client._Endpoint("127.0.0.1", port, False),), lease_ttl=3,
                          op_timeout=OP_TIMEOUT, ca_file=None, cert_file=None, key_file=None,
                          user=user, password="pw" if user else None)


def _call(gateway: FakeGateway, reply: bytes, end: str = "keep", path: str = "/v3/kv/put",
          idempotent: bool = False) -> dict:
    gateway.arm(Script(end=end).send(reply))
    transport = client._Transport(_config(gateway.port))
    try:
        return transport.call(path, {"key": "aw=="}, time.monotonic() + OP_TIMEOUT, idempotent)
    finally:
        transport.close()


def _short(value: object) -> str:
    """A test id: the start of the parameter."""
    return repr(value)[:24]


def _reply(body: bytes, *headers: bytes, status: bytes = b"200 OK") -> bytes:
    return b"HTTP/1.1 " + status + b"\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body


def test_a_valid_reply_is_a_dict(gateway: FakeGateway) -> None:
    assert _call(gateway, valid_reply("/v3/kv/put"))["header"]["revision"] == "12"


# -- found by the fuzzer ------------------------------------------------------------


@pytest.mark.parametrize("length", [b"abc", b"-1", b"-5", b"", b"0x10", b"1e3", b"9" * 5000], ids=_short)
def test_a_bad_content_length_is_unavailable(gateway: FakeGateway, length: bytes) -> None:
    """int() raised ValueError; -1 read up to the close."""
    with pytest.raises(Unavailable, match="Content-Length|over the"):
        _call(gateway, _reply(b'{"header": {}}', b"Content-Length: " + length), end="close")


@pytest.mark.parametrize("claim", [1 << 31, (1 << 63) - 1, 100 << 20], ids=_short)
def test_a_claimed_length_is_not_allocated(gateway: FakeGateway, claim: int) -> None:
    """read(n) allocated n bytes up front: 2 GiB for a 2 GiB claim. Over
    MAX_REPLY_BYTES it is refused; under it, memory follows what comes."""
    tracemalloc.start()
    try:
        with pytest.raises((Unavailable, Timeout)):
            _call(gateway, _reply(b"{", b"Content-Length: %d" % claim), end="silence")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20


def test_a_body_to_the_close_is_capped(gateway: FakeGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client, "MAX_REPLY_BYTES", 1000)
    with pytest.raises(Unavailable, match="over the 1000"):
        _call(gateway, _reply(b"[" + b"0," * 2000 + b"0]"), end="close")


def test_a_slow_drip_ends_at_the_deadline(gateway: FakeGateway) -> None:
    """Each read waited the whole timeout afresh: a byte every 0.1 s kept a
    call going as long as the server liked."""
    script = Script(end="close")
    for byte in [bytes([b]) for b in valid_reply("/v3/kv/put")]:
        script.send(byte, 0.1)
    gateway.arm(script)
    transport = client._Transport(_config(gateway.port))
    started = time.monotonic()
    with pytest.raises(Timeout):
        transport.call("/v3/kv/put", {}, started + OP_TIMEOUT, idempotent=False)
    assert time.monotonic() - started < OP_TIMEOUT + 0.5
    transport.close()


@pytest.mark.parametrize("body", [b"[]", b'"text"', b"12", b"null", b"{", b'{"a": "\xff\xfe"}',
                                  b"[" * 100_000, b'{"a": ' + b"9" * 5000 + b"}"], ids=_short)
def test_a_reply_that_is_not_a_json_object_is_unavailable(gateway: FakeGateway, body: bytes) -> None:
    """json.loads' errors (JSONDecodeError, UnicodeDecodeError, RecursionError,
    ValueError) leaked, and a list or a str was returned as the reply."""
    with pytest.raises(Unavailable, match="malformed reply"):
        _call(gateway, _reply(body, b"Content-Length: %d" % len(body)))


@pytest.mark.parametrize("body", [b'{"code": null, "message": "x"}', b'{"code": 1e999}', b'{"code": NaN}',
                                  b'{"code": [14], "message": {"a": 1}}', b"[" * 5000, b"\xff"], ids=_short)
def test_an_error_reply_of_any_shape_is_a_typed_error(gateway: FakeGateway, body: bytes) -> None:
    """_error_of let TypeError and OverflowError (int(None), int(inf)) and RecursionError out."""
    with pytest.raises(DbwrapError):
        _call(gateway, _reply(body, b"Content-Length: %d" % len(body), status=b"500 Error"))


@pytest.mark.parametrize("status", [b"2" * 5000 + b" OK", b"20 OK", b"0200 OK"], ids=_short)
def test_a_bad_status_is_unavailable(gateway: FakeGateway, status: bytes) -> None:
    with pytest.raises(Unavailable, match="not an HTTP reply"):
        _call(gateway, _reply(b"{}", b"Content-Length: 2", status=status))


def test_a_head_over_its_limit_is_unavailable(gateway: FakeGateway) -> None:
    headers = [b"X-%d: %s" % (i, b"v" * 1000) for i in range(100)]
    with pytest.raises(Unavailable, match="head over"):
        _call(gateway, _reply(b"{}", *headers, b"Content-Length: 2"))


@pytest.mark.parametrize("size", [b"-5", b"fffffffffff", b" 0x10", b"5_0", b""], ids=_short)
def test_a_bad_chunk_size_ends_the_stream(gateway: FakeGateway, size: bytes) -> None:
    """int(size, 16) took -5 (a read up to the close) and sizes of terabytes."""
    head = _reply(b"", b"Transfer-Encoding: chunked")
    gateway.arm(Script(end="silence").send(head + size + b"\r\n" + b"x" * 100))
    transport = client._Transport(_config(gateway.port))
    conn = transport.open_stream("/v3/watch", {}, time.monotonic() + OP_TIMEOUT)
    with pytest.raises(ConnectionError, match="chunk size"):
        conn.read_chunk()
    conn.close()


@pytest.mark.parametrize("grant", [{}, {"ID": None}, {"ID": "abc"}, {"ID": "0"}, {"ID": [1]},
                                   {"ID": "7", "TTL": "1e999"}, {"ID": "7", "TTL": str(10 ** 19)}], ids=_short)
def test_a_bad_lease_grant_is_unavailable(gateway: FakeGateway, grant: dict) -> None:
    """int(reply["ID"]) raised KeyError, TypeError, ValueError; a TTL of 10**19
    made the keepalive thread's wait overflow."""
    body = json.dumps(grant).encode()
    gateway.arm(Script().send(_reply(body, b"Content-Length: %d" % len(body))))
    session = client._Session(_config(gateway.port))
    session._stop.set()
    with pytest.raises(Unavailable, match="lease"):
        session.lease(time.monotonic() + OP_TIMEOUT, client._Counter(session, "keepalive_round_trips"))
    assert session._lease_id is None
    session.transport.close()


@pytest.mark.parametrize("reply", [{"result": "x"}, {"result": {"TTL": {}}}, {"result": {"TTL": str(10 ** 19)}}], ids=_short)
def test_a_bad_keepalive_reply_is_retried_sooner(gateway: FakeGateway, reply: dict) -> None:
    """An AttributeError or TypeError here ended the keepalive thread: the
    lease then lapsed under a held lock."""
    body = json.dumps(reply).encode()
    gateway.arm(Script().send(_reply(body, b"Content-Length: %d" % len(body))))
    session = client._Session(_config(gateway.port))
    session._lease_id = 7
    wait = session._refresh(session.transport, client._Counter(session, "keepalive_round_trips"))
    assert wait == pytest.approx(max(0.05, 3 / 10))
    session.transport.close()


@pytest.mark.parametrize("reply", [{}, {"token": None}, {"token": 12}, {"token": ""}, {"token": "a\r\nX: y"},
                                   {"token": "\udcff"}], ids=_short)
def test_a_log_in_without_a_token_is_unavailable(gateway: FakeGateway, reply: dict) -> None:
    """reply["token"] raised KeyError; a token with CR LF went into the next
    request's head, and one with a lone surrogate raised UnicodeEncodeError."""
    body = json.dumps(reply).encode()
    gateway.arm(Script().send(_reply(body, b"Content-Length: %d" % len(body))))
    transport = client._Transport(_config(gateway.port, user="u"))
    with pytest.raises(Unavailable, match="token"):
        transport.call("/v3/kv/range", {}, time.monotonic() + OP_TIMEOUT, idempotent=True)
    transport.close()


@pytest.mark.parametrize("text", ["YQ", "not base64!", "\u00e9t\u00e9", 12, [1], {"a": 1}], ids=_short)
def test_a_key_that_is_not_base64_is_unavailable(text: object) -> None:
    """binascii.Error, ValueError and TypeError left _unb64."""
    with pytest.raises(Unavailable, match="not base64"):
        client._unb64(text)  # type: ignore[arg-type]


# -- the fuzzer ---------------------------------------------------------------------


def test_the_client_survives_a_fuzzing_gateway() -> None:
    report = fuzz(seconds=3, seed=11, margin=2.0)  # beside make check's other tests
    assert not report.broken, summary(report, 11) + "\n" + "\n".join(report.failures)
    assert report.cases > 10 and report.outcomes["returned"] > 0


def test_the_fuzzer_catches_a_client_that_reads_integers_with_int() -> None:
    """The broken example: lease IDs and TTLs read by a bare int() let
    TypeError and ValueError out of a call; seed 4 finds it in about 60 cases."""
    with broken_parse():
        report = fuzz(seconds=20, seed=4)
    assert report.broken, summary(report, 4)
    assert any("raised TypeError" in f or "raised ValueError" in f for f in report.failures), report.failures


def test_the_fuzzer_catches_a_client_that_waits_per_read() -> None:
    """The broken example of the time check: reads that each wait the whole
    timeout let a slow drip hold a call for its 4 s, however loaded the
    machine (the check allows a call's own CPU time, stretched, and a
    waiting client uses next to none); seed 1 finds it in 7 cases."""
    with broken_deadline():
        report = fuzz(seconds=30, seed=1, margin=2.0)
    assert report.broken, summary(report, 1)
    assert any("case slow_drip" in f and "took" in f for f in report.failures), report.failures


def test_the_fuzzer_catches_a_call_that_computes_too_long(monkeypatch: pytest.MonkeyPatch) -> None:
    """The time check allows a call its CPU on a starved core; the CPU
    itself is bounded: a reply parse that spins past CPU_BOUND fails."""
    parse = client._json_object

    def slow_parse(data: bytes) -> dict:
        spin_until = time.thread_time() + CPU_BOUND + 0.1
        while time.thread_time() < spin_until:
            pass
        return parse(data)

    monkeypatch.setattr(client, "_json_object", slow_parse)
    report = fuzz(seconds=20, seed=1, margin=2.0)
    assert any("of CPU, over its" in f for f in report.failures), summary(report, 1)


def test_a_lapsed_lease_is_named_in_the_report_with_the_failures_before_it(gateway: FakeGateway) -> None:
    """A fenced write's message gave only the lease the process holds now,
    "renewed 0.0 s ago", when the lock had gone with an earlier one that
    lapsed (issue 38): the report names the lapsed lease and why."""
    session = client._Session(_config(gateway.port))
    session._stop.set()
    counter = client._Counter(session, "keepalive_round_trips")
    session._lease_id, session._renewed_at, session._expires_at = 7, time.monotonic(), time.monotonic() + 60
    gateway.arm(Script(end="silence"))  # the keepalive's answer never comes
    session._refresh(session.transport, counter)
    assert "lapsed" not in session.lease_report()  # a failed keepalive is not yet a lapse
    body = json.dumps({"result": {"TTL": "0"}}).encode()
    gateway.arm(Script().send(_reply(body, b"Content-Length: %d" % len(body))))
    session._refresh(session.transport, counter)
    report = session.lease_report()
    assert session._lease_id is None and len(session.lapses) == 1, report
    assert "lease 7 lapsed" in report and "1 keepalive failure(s): " in report, report
    session.transport.close()
