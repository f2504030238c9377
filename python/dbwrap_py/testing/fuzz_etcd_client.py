"""Bad replies for the etcd adapter's HTTP client: a fake JSON gateway under it.

    python -m dbwrap_py.testing.fuzz_etcd_client [--broken] [SECONDS [SEED]]

The client is adapters/etcd/client.py: a minimal HTTP/1.1 client for
etcd's v3 JSON gateway. This runs its calls, one at a time, against a fake
gateway on 127.0.0.1 (a thread of this process) that answers the first
request of each call with one case: a valid reply (with a length, chunked,
or up to the close), a mutated one (a field of the wrong type, a missing
one, a huge or non-finite number, base64 that is not, a deep nesting),
its bytes mutated, JSON that is not an object, an error reply with any
status and body, a bad status line, a bad, negative or huge Content-Length,
a body shorter than its length, bad chunks, oversized headers, a close
mid-head, silence, a slow drip that goes on past the client's timeout, or
random bytes. Later requests of the same call (a retry, the request after
a log-in) get a valid reply.

The calls: a range (its keys and values decoded by ``_unb64``), a put, a
txn, a lease grant (``_Session.lease``), a keepalive round
(``_Session._refresh``), a log-in then a range (a user's first request),
and a watch (``_Transport.open_stream`` and ``read_chunk``
up to its deadline, as the lock wait's ``_wait_deleted`` in client.py reads it).

It fails when a call

* raises anything but the adapter's typed errors (``DbwrapError``; for the
  watch stream, whose readers catch ``OSError``, an ``OSError``): a
  KeyError, TypeError, ValueError, binascii.Error, a JSON error,
  RecursionError or MemoryError escaping is a bug;
* returns the wrong type (a reply that is not a dict, a lease id that is
  not a positive int, a keepalive wait that is not a positive finite
  number, a log-in without a str token, a chunk that is not bytes);
* lasts longer than its timeout (OP_TIMEOUT; a keepalive round,
  KEEPALIVE_TIMEOUT) plus MARGIN, plus the CPU time the call itself used
  stretched by how slowly this process gets a core just then (parsing a
  256 KiB reply under tracemalloc takes 0.12 s of CPU; beside make test's
  smbds, 1.5 s of the clock). A client that waits on the server per read,
  not per call, uses next to no CPU while it waits: a slow drip still
  fails it (``broken_deadline``, the broken example of this check);
* uses more than CPU_BOUND of its thread's CPU: the allowance above does
  not let a call that computes too long pass;
* allocates more than MEMORY_BOUND at its peak (tracemalloc): no case
  sends more than a few hundred KiB, so a client that allocates what a
  Content-Length or a chunk size claims fails here.

``--broken`` runs it against a broken parse, the integer fields read with
a bare ``int()`` (what the client did before this fuzzer): it must fail
(tests/python/test_etcd_client.py).
"""

from __future__ import annotations

import collections
import contextlib
import copy
import json
import math
import random
import socket
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from dbwrap_py.adapters.etcd import client as client
from dbwrap_py.errors import DbwrapError

#: the client's op_timeout here: a silent case costs this much
OP_TIMEOUT = 0.3
#: a keepalive round's request has a third of the lease's TTL (1 s here),
#: and a lapsed lease's grant after it op_timeout
KEEPALIVE_TIMEOUT = 1 / 3 + OP_TIMEOUT
#: how long past its timeout a call may take (a loaded 2-core machine)
MARGIN = 1.0
#: a slow drip goes on this long (a client that waits per read, not per
#: call, takes about this long: well past OP_TIMEOUT + MARGIN)
DRIP_SECONDS = 4.0
#: the most CPU a call may use (the biggest body here, 256 KiB parsed
#: under tracemalloc, takes about 0.15 s)
CPU_BOUND = 0.6
#: the most a call may allocate at its peak
MEMORY_BOUND = 40 << 20
#: the most failures a report keeps
MAX_FAILURES = 200
#: the most any case sends of a body it means
BODY_MOST = 256 << 10

_HEADER = {"cluster_id": "14841639068965178418", "member_id": "10276657743932975437",
           "revision": "12", "raft_term": "2"}
_KV = {"key": "ZGJ3cmFwL2Zvbw==", "create_revision": "5", "mod_revision": "12", "version": "3",
       "value": "YmFy", "lease": "7587862072907233549"}
#: valid replies of etcd 3.5's gateway to each path the client calls
VALID: dict[str, Any] = {
    "/v3/kv/range": {"header": _HEADER, "kvs": [_KV], "count": "1"},
    "/v3/kv/put": {"header": _HEADER},
    "/v3/kv/txn": {"header": _HEADER, "succeeded": True, "responses": [
        {"response_put": {"header": {"revision": "13"}}},
        {"response_range": {"header": {"revision": "13"}, "kvs": [_KV], "count": "1"}}]},
    "/v3/lease/grant": {"header": _HEADER, "ID": "7587862072907233549", "TTL": "10"},
    "/v3/lease/keepalive": {"result": {"header": _HEADER, "ID": "7587862072907233549", "TTL": "10"}},
    "/v3/lease/revoke": {"header": _HEADER},
    "/v3/auth/authenticate": {"header": _HEADER, "token": "qNbhVjyaeYCdgPoB.27"},
}
WATCH_LINES = [
    {"result": {"header": _HEADER, "created": True}},
    {"result": {"header": _HEADER, "events": [{"type": "DELETE", "kv": {"key": _KV["key"],
                                                                        "mod_revision": "14"}}]}},
]
ERRORS = [
    (404, {"error": "etcdserver: requested lease not found", "code": 5,
           "message": "etcdserver: requested lease not found"}),
    (503, {"error": "etcdserver: no leader", "code": 14, "message": "etcdserver: no leader"}),
    (401, {"error": "etcdserver: invalid auth token", "code": 16, "message": "etcdserver: invalid auth token"}),
    (400, {"error": "etcdserver: too many operations in txn request", "code": 3,
           "message": "etcdserver: too many operations in txn request"}),
    (503, {"error": "etcdserver: request timed out", "code": 14, "message": "etcdserver: request timed out"}),
]


@dataclass
class EtcdFuzzReport:
    cases: int = 0
    by_kind: collections.Counter[str] = field(default_factory=collections.Counter)
    by_call: collections.Counter[str] = field(default_factory=collections.Counter)
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    connections: int = 0
    longest: float = 0.0
    peak_bytes: int = 0
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def broken(self) -> bool:
        return bool(self.failures)


# -- what the fake gateway sends: a script of steps ----------------------------------

@dataclass
class Script:
    """One reply: bytes to send (each after its delay), then close, silence or keep-alive."""

    steps: list[tuple[float, bytes]] = field(default_factory=list)
    end: str = "keep"  # "keep", "close" or "silence"

    def send(self, data: bytes, delay: float = 0.0) -> "Script":
        self.steps.append((delay, data))
        return self


def _head(status: int, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}"]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _with_length(body: bytes, status: int = 200) -> bytes:
    return _head(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]) + body


def _chunked(pieces: list[bytes], status: int = 200) -> bytes:
    out = [_head(status, [("Content-Type", "application/json"), ("Transfer-Encoding", "chunked")])]
    out += [b"%x\r\n%s\r\n" % (len(p), p) for p in pieces if p]
    return b"".join(out) + b"0\r\n\r\n"


def valid_reply(path: str) -> bytes:
    """What a healthy gateway answers (a watch: created, a delete event, the end)."""
    if path == "/v3/watch":
        return _chunked([json.dumps(line).encode() + b"\n" for line in WATCH_LINES])
    return _with_length(json.dumps(VALID.get(path, {"header": _HEADER})).encode())


class _Cases:
    """The fuzzed replies: each a Script for the first request of a call."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    # -- JSON bodies ----------------------------------------------------------

    def weird_value(self) -> Any:
        rng = self.rng
        return rng.choice([
            None, True, False, 0, -1, 2 ** 64, -(2 ** 63), 1.5, math.inf, -math.inf, math.nan,
            "", "abc", "-5", "9" * 5000, "not base64!", "YWJj=", "YQ", "\udcff", "\u00e9\u20ac",
            "12 ", "0x10", "1_000", [], [1, "2"], {}, {"a": 1}, self.nested(rng.randint(2, 50)),
        ])

    def nested(self, depth: int) -> Any:
        value: Any = 0
        for _ in range(depth):
            value = [value] if self.rng.random() < 0.5 else {"a": value}
        return value

    def mutate_json(self, value: Any) -> Any:
        """A copy with one to four fields changed, removed or added, at any depth."""
        value = copy.deepcopy(value)
        for _ in range(self.rng.randint(1, 4)):
            value = self._mutate_at(value, self.rng.randint(0, 4))
        return value

    def _mutate_at(self, value: Any, depth: int) -> Any:
        rng = self.rng
        if depth == 0 or not isinstance(value, (dict, list)) or not value:
            return self.weird_value()
        if isinstance(value, dict):
            key = rng.choice(list(value))
            choice = rng.random()
            if choice < 0.25:
                del value[key]
            elif choice < 0.35:
                value[rng.choice(["kvs", "ID", "TTL", "token", "result", "code", "x"])] = self.weird_value()
            else:
                value[key] = self._mutate_at(value[key], depth - 1)
            return value
        i = rng.randrange(len(value))
        value[i] = self._mutate_at(value[i], depth - 1)
        return value

    def dumps(self, value: Any) -> bytes:
        """JSON as the gateway would write it; inf and nan as out-of-range numbers
        and NaN (Python's json reads both), lone surrogates as \\udcff."""
        text = json.dumps(value)
        return text.replace("Infinity", "1e999").encode()

    def mutate_bytes(self, data: bytes) -> bytes:
        out = bytearray(data)
        for _ in range(self.rng.randint(1, 6)):
            choice = self.rng.random()
            if out and choice < 0.4:
                out[self.rng.randrange(len(out))] = self.rng.randrange(256)
            elif out and choice < 0.6:
                at = self.rng.randrange(len(out))
                del out[at:at + self.rng.randint(1, 8)]
            else:
                at = self.rng.randrange(len(out) + 1)
                out[at:at] = self.rng.choice([self.rng.randbytes(self.rng.randint(1, 8)),
                                              b"\xff\xfe", b'"', b"[", b"{", b"}", b"1e999"])
        return bytes(out)

    def body_for(self, path: str) -> bytes:
        """A JSON body for path, mutated (or not)."""
        rng = self.rng
        if path == "/v3/watch":
            lines = [self.dumps(self.mutate_json(line) if rng.random() < 0.7 else line)
                     for line in WATCH_LINES]
            return b"\n".join(lines) + b"\n"
        value = VALID.get(path, {"header": _HEADER})
        choice = rng.random()
        if choice < 0.6:
            return self.dumps(self.mutate_json(value))
        if choice < 0.9:
            return self.mutate_bytes(self.dumps(value))
        return self.dumps(self.weird_value())

    # -- the cases: (name, weight, fn(path) -> Script) -------------------------

    def pick(self) -> tuple[str, Callable[[str], Script]]:
        cases: list[tuple[str, int, Callable[[str], Script]]] = [
            ("valid", 10, self.valid),
            ("valid_chunked", 3, self.valid_chunked),
            ("valid_to_close", 2, self.valid_to_close),
            ("json_mutated", 24, self.json_mutated),
            ("json_chunked_mutated", 6, self.json_chunked_mutated),
            ("not_an_object", 4, self.not_an_object),
            ("deep_nesting", 3, self.deep_nesting),
            ("huge_numbers", 3, self.huge_numbers),
            ("not_utf8", 2, self.not_utf8),
            ("error_status", 10, self.error_status),
            ("bad_status_line", 4, self.bad_status_line),
            ("bad_content_length", 6, self.bad_content_length),
            ("short_body", 4, self.short_body),
            ("huge_claim", 4, self.huge_claim),
            ("big_claim_within_cap", 3, self.big_claim_within_cap),
            ("bad_chunks", 8, self.bad_chunks),
            ("endless_body", 2, self.endless_body),
            ("oversized_headers", 4, self.oversized_headers),
            ("close_mid_head", 3, self.close_mid_head),
            ("close", 2, self.close),
            ("silence", 1, self.silence),
            ("slow_drip", 2, self.slow_drip),
            ("quick_drip", 2, self.quick_drip),
            ("valid_then_extra", 3, self.valid_then_extra),
            ("random_bytes", 3, self.random_bytes),
        ]
        names, weights, fns = zip(*cases)
        i = self.rng.choices(range(len(cases)), weights=weights)[0]
        return names[i], fns[i]

    def valid(self, path: str) -> Script:
        return Script().send(valid_reply(path))

    def valid_chunked(self, path: str) -> Script:
        body = valid_reply(path).split(b"\r\n\r\n", 1)[1] if path != "/v3/watch" else b""
        if path == "/v3/watch":
            return Script().send(valid_reply(path))
        cut = self.rng.randrange(len(body) + 1)
        return Script().send(_chunked([body[:cut], body[cut:]]))

    def valid_to_close(self, path: str) -> Script:
        body = json.dumps(VALID.get(path, {"header": _HEADER})).encode()
        return Script(end="close").send(_head(200, [("Content-Type", "application/json")]) + body)

    def json_mutated(self, path: str) -> Script:
        if path == "/v3/watch":
            return self.json_chunked_mutated(path)
        return Script().send(_with_length(self.body_for(path)))

    def json_chunked_mutated(self, path: str) -> Script:
        body = self.body_for(path)
        cuts = sorted(self.rng.randrange(len(body) + 1) for _ in range(self.rng.randint(0, 3)))
        pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)])]
        return Script().send(_chunked(pieces))

    def not_an_object(self, path: str) -> Script:
        body = self.rng.choice([b"[]", b'"text"', b"12", b"null", b"true", b"[{}]", b"1e999", b"NaN", b""])
        return Script().send(_with_length(body) if path != "/v3/watch" else _chunked([body + b"\n"]))

    def deep_nesting(self, path: str) -> Script:
        depth = self.rng.choice([1000, 5000, 100_000])
        opener = self.rng.choice([b"[", b'{"a":'])
        body = opener * depth + (b"" if self.rng.random() < 0.5 else b"0" + b"]" * depth)
        if self.rng.random() < 0.5:
            body = b'{"kvs":' + body + b"}"
        return Script().send(_with_length(body) if path != "/v3/watch" else _chunked([body + b"\n"]))

    def huge_numbers(self, path: str) -> Script:
        value = copy.deepcopy(VALID.get(path, {"header": _HEADER}))
        number = self.rng.choice([b"1e999", b"-1e999", b"9" * 5000, b"-" + b"9" * 4300, b"1" + b"0" * 400,
                                  b"0.5", b"18446744073709551616"])
        target = value.get("result", value) if isinstance(value.get("result"), dict) else value
        name = self.rng.choice(["ID", "TTL", "count", "code", "revision"])
        target[name] = "@@"
        body = self.dumps(value).replace(b'"@@"', number)
        return Script().send(_with_length(body))

    def not_utf8(self, path: str) -> Script:
        body = self.dumps(VALID.get(path, {"header": _HEADER})).replace(b"YmFy", b"\xff\xfe\x80")
        return Script().send(_with_length(body))

    def error_status(self, path: str) -> Script:
        rng = self.rng
        status, error = rng.choice(ERRORS)
        choice = rng.random()
        if choice < 0.4:
            body = self.dumps(error)
        elif choice < 0.8:
            body = self.dumps(self.mutate_json(error))
        else:
            body = rng.choice([b"", b"<html>Bad Gateway</html>", rng.randbytes(rng.randint(1, 300)),
                               b"[" * 5000, b'{"code": 1e999}', b'{"code": NaN}', b'{"code": "14"}'])
        status = rng.choice([status, status, rng.randint(100, 999), 200 if rng.random() < 0.1 else 500])
        return Script().send(_with_length(body, status))

    def bad_status_line(self, path: str) -> Script:
        rng = self.rng
        line = rng.choice([b"HTTP/1.1 abc OK", b"HTTP/1.1 " + b"2" * 5000 + b" OK", b"HTTP/2 200 OK",
                           b"HTTP/1.1", b"", b"\x00\x01\x02", b"HTTP/1.1 -200 OK", b"HTTP/1.1 20 OK",
                           b"HTTP/1.1 0200 OK", b"ICY 200 OK", b"HTTP/1.1 \xd9\xa2\xd9\xa0\xd9\xa0 OK"])
        body = json.dumps(VALID.get(path, {})).encode()
        return Script(end=rng.choice(["close", "keep"])).send(
            line + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    def bad_content_length(self, path: str) -> Script:
        rng = self.rng
        body = json.dumps(VALID.get(path, {})).encode()
        value = rng.choice([b"abc", b"-1", b"-%d" % len(body), b"", b" ", b"1_0", b"0x10", b"+5",
                            b"1e3", b"9" * 5000, b"%d, %d" % (len(body), len(body)), b"\xd9\xa1\xd9\xa0"])
        return Script(end="close").send(
            b"HTTP/1.1 200 OK\r\nContent-Length: " + value + b"\r\n\r\n" + body)

    def short_body(self, path: str) -> Script:
        body = self.dumps(VALID.get(path, {}))
        claim = len(body) + self.rng.randint(1, 1 << 16)
        end = self.rng.choice(["close", "silence"])
        return Script(end=end).send(
            b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % claim + body)

    def huge_claim(self, path: str) -> Script:
        claim = self.rng.choice([1 << 31, 1 << 40, (1 << 63) - 1, 1 << 64, 10 ** 30,
                                 self.rng.randint(1 << 30, 1 << 62)])
        return Script(end=self.rng.choice(["close", "silence"])).send(
            b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n{" % claim)

    def big_claim_within_cap(self, path: str) -> Script:
        """A length a client may accept (up to its cap) and a few bytes of it:
        its memory must follow what came, not what was claimed."""
        claim = self.rng.randint(MEMORY_BOUND + 1, client.MAX_REPLY_BYTES
                                 if hasattr(client, "MAX_REPLY_BYTES") else 128 << 20)
        return Script(end=self.rng.choice(["close", "silence"])).send(
            b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % claim + self.rng.randbytes(1000))

    def bad_chunks(self, path: str) -> Script:
        rng = self.rng
        head = _head(200, [("Transfer-Encoding", "chunked")])
        body = self.body_for(path)
        good = b"%x\r\n%s\r\n" % (len(body), body)
        bad = rng.choice([
            b"zz\r\n" + body, b"-5\r\n" + body, b"-1\r\n", b"fffffffffff\r\n" + body,
            b"ffffffffffffffffffffff\r\n", b"%x\r\n" % (MEMORY_BOUND * 2) + body,
            b"%x\r\n%sXX" % (len(body), body), b"%x\r\n%s" % (len(body) + 10, body),
            b"0x10\r\n" + body[:16] + b"\r\n", b" 5 \r\n12345\r\n", b"5_0\r\n", b"\r\n",
            b"%x;ext=1\r\n%s\r\n0\r\nTrailer: x\r\n\r\n" % (len(body), body),
            b"0\r\n" + b"X-Trailer: y\r\n" * 20000 + b"\r\n",
            good,  # no last chunk, then the end
        ])
        pieces = [good, bad] if rng.random() < 0.5 else [bad]
        return Script(end=rng.choice(["close", "silence", "keep"])).send(head + b"".join(pieces))

    def endless_body(self, path: str) -> Script:
        """No length, no chunks: the body ends at the close, and this one is big."""
        script = Script(end="close").send(_head(200, [("Content-Type", "application/json")]))
        for _ in range(self.rng.randint(1, 8)):
            script.send(b"[" + b"0," * (BODY_MOST // 16))
        return script

    def oversized_headers(self, path: str) -> Script:
        rng = self.rng
        body = json.dumps(VALID.get(path, {})).encode()
        extra = rng.choice([
            b"X-Long: " + b"a" * 70_000 + b"\r\n",
            b"".join(b"X-%d: v\r\n" % i for i in range(20_000)),
            b"X-Long: " + b"a" * 65_530 + b"\r\n" + b"X-Two: " + b"b" * 65_530 + b"\r\n",
            b"No colon at all\r\n", b": empty name\r\n", b"X-Bin: \xff\xfe\r\n",
            b"Content-Length: 5\r\n",
        ])
        return Script(end=rng.choice(["close", "keep"])).send(
            b"HTTP/1.1 200 OK\r\n" + extra + b"Content-Length: %d\r\n\r\n" % len(body) + body)

    def close_mid_head(self, path: str) -> Script:
        reply = valid_reply(path)
        cut = reply.index(b"\r\n\r\n") + 2
        return Script(end="close").send(reply[:self.rng.randrange(cut)])

    def close(self, path: str) -> Script:
        return Script(end="close")

    def silence(self, path: str) -> Script:
        return Script(end="silence")

    def slow_drip(self, path: str) -> Script:
        """A byte at a time, each well within the client's timeout, for DRIP_SECONDS."""
        reply = valid_reply(path)
        head_end = reply.index(b"\r\n\r\n") + 4
        filler = b"X-Drip: " + b"d" * 4096 + b"\r\n"
        data = reply[:17] + filler + reply[17:head_end] if self.rng.random() < 0.7 else reply
        gap = OP_TIMEOUT / 6
        script = Script(end="close")
        steps = int(DRIP_SECONDS / gap)
        for i in range(min(steps, len(data))):
            script.send(data[i:i + 1] if i < steps - 1 else data[i:], gap)
        return script

    def quick_drip(self, path: str) -> Script:
        """A valid reply in small pieces, done well within the timeout."""
        reply = valid_reply(path)
        script = Script()
        step = max(1, len(reply) // 20)
        for at in range(0, len(reply), step):
            script.send(reply[at:at + step], 0.002)
        return script

    def valid_then_extra(self, path: str) -> Script:
        return Script().send(valid_reply(path) + self.rng.choice(
            [b"HTTP/1.1 200 OK\r\n", self.rng.randbytes(self.rng.randint(1, 64)), b"\r\n"]))

    def random_bytes(self, path: str) -> Script:
        data = self.rng.randbytes(self.rng.randint(1, 4096))
        if self.rng.random() < 0.5:
            data = b"HTTP/1.1 200 OK\r\n" + data
        return Script(end=self.rng.choice(["close", "silence"])).send(data)


# -- the fake gateway ---------------------------------------------------------------

class FakeGateway:
    """A TCP server on 127.0.0.1 that answers the first request after ``arm``
    with its script, and every other request with a valid reply."""

    def __init__(self, report: EtcdFuzzReport) -> None:
        self.report = report
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._armed: Script | None = None
        self._socks: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self.failed: list[str] = []
        self._thread = threading.Thread(target=self._accept_loop, name="fake-etcd-gateway", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            socks = list(self._socks)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(10)
        for thread in list(self._threads):
            thread.join(10)

    def arm(self, script: Script) -> None:
        with self._lock:
            self._armed = script

    def disarm(self) -> bool:
        """Whether the armed script was used."""
        with self._lock:
            used, self._armed = self._armed is None, None
        return used

    def _take(self) -> Script | None:
        with self._lock:
            script, self._armed = self._armed, None
        return script

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._socks.add(sock)
                self.report.connections += 1
                self._threads = [t for t in self._threads if t.is_alive()]
            thread = threading.Thread(target=self._serve, args=(sock,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, sock: socket.socket) -> None:
        pending = b""
        try:
            while not self._stopping.is_set():
                request = _read_request(sock, pending)
                if request is None:
                    return
                path, pending = request
                script = self._take() or Script().send(valid_reply(path))
                if not self._play(sock, script):
                    return
        except OSError:
            pass
        except Exception as exc:  # a bug of the fuzzer's own must not pass for a quiet run
            self.failed.append(f"the fake gateway itself: {type(exc).__name__}: {exc}")
        finally:
            with self._lock:
                self._socks.discard(sock)
            sock.close()

    def _play(self, sock: socket.socket, script: Script) -> bool:
        """Send the script; False when the connection is over."""
        for delay, data in script.steps:
            if delay and self._stopping.wait(delay):
                return False
            sock.sendall(data)
        if script.end == "close":
            return False
        if script.end == "silence":  # read on, answer nothing: the client times out and hangs up
            while sock.recv(65536):
                pass
            return False
        return True


def _read_request(sock: socket.socket, pending: bytes) -> tuple[str, bytes] | None:
    """The next request's path, and what came after it; None at the close."""
    data = pending
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    path = lines[0].split(b" ")[1].decode()
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        rest += chunk
    return path, rest[length:]


# -- the calls --------------------------------------------------------------------

class _Calls:
    """The client's calls, each checked for its result's type; one transport
    (and one session) throughout, as in a process of smbd."""

    def __init__(self, port: int) -> None:
        endpoint = client._Endpoint("127.0.0.1", port, False)
        self.config = client._Config(endpoints=(endpoint,), lease_ttl=1, op_timeout=OP_TIMEOUT, ca_file=None,
                                     cert_file=None, key_file=None, user=None, password=None)
        self.auth_config = client._Config(endpoints=(endpoint,), lease_ttl=1, op_timeout=OP_TIMEOUT,
                                          ca_file=None, cert_file=None, key_file=None, user="fuzz",
                                          password="fuzz")
        self.session = client._Session(self.config)
        self.session._stop.set()  # a keepalive thread started by a grant ends at once
        self.auth = client._Transport(self.auth_config)
        self.counter = client._Counter(self.session, "keepalive_round_trips")

    def close(self) -> None:
        self.session.transport.close()
        self.auth.close()

    def pick(self, rng: random.Random) -> tuple[str, str, Callable[[], str | None]]:
        """(name, the path its fuzzed request goes to, the call); the call
        returns why its result is of the wrong type, or None."""
        calls = [
            ("range", "/v3/kv/range", self.range),
            ("put", "/v3/kv/put", self.put),
            ("txn", "/v3/kv/txn", self.txn),
            ("lease_grant", "/v3/lease/grant", self.lease_grant),
            ("keepalive", "/v3/lease/keepalive", lambda: self.keepalive(rng)),
            ("log_in", "/v3/auth/authenticate", self.log_in),
            ("watch", "/v3/watch", self.watch),
        ]
        return rng.choice(calls)

    def _deadline(self) -> float:
        return time.monotonic() + OP_TIMEOUT

    @staticmethod
    def _dict(reply: object) -> str | None:
        return None if isinstance(reply, dict) else f"a reply of type {type(reply).__name__}"

    def range(self) -> str | None:
        """A range, its keys and values decoded (``_unb64``) as adapters/etcd/adapter.py does."""
        key = client._b64(b"dbwrap/foo")
        reply = self.session.transport.call("/v3/kv/range", {"key": key}, self._deadline(), True)
        kvs = reply.get("kvs") if isinstance(reply, dict) else None
        for kv in kvs if isinstance(kvs, list) else []:
            for name in ("key", "value"):
                if isinstance(kv, dict) and type(client._unb64(kv.get(name))) is not bytes:
                    return f"a {name} decoded to a non-bytes"
        return self._dict(reply)

    def put(self) -> str | None:
        body = {"key": client._b64(b"dbwrap/foo"), "value": client._b64(b"bar")}
        return self._dict(self.session.transport.call("/v3/kv/put", body, self._deadline(), False))

    def txn(self) -> str | None:
        body = {"compare": [], "success": [{"request_put": {"key": client._b64(b"k")}}]}
        return self._dict(self.session.transport.call("/v3/kv/txn", body, self._deadline(), False))

    def lease_grant(self) -> str | None:
        self.session._lease_id = None
        lease_id = self.session.lease(self._deadline(), self.counter)
        if type(lease_id) is not int or lease_id <= 0:
            return f"a lease id {lease_id!r:.80}"
        return self._ttl_wrong()

    def _ttl_wrong(self) -> str | None:
        ttl, expires = self.session._lease_ttl, self.session._expires_at
        if type(ttl) is not int or ttl <= 0 or not math.isfinite(expires) or ttl / 3 > threading.TIMEOUT_MAX:
            return f"a lease TTL {ttl!r:.80}, expiring at {expires!r:.80}"
        return None

    def keepalive(self, rng: random.Random) -> str | None:
        session = self.session
        session._lease_id, session._lease_ttl = 7587862072907233549, 1  # its request's timeout: 1/3 s
        session._openers = {b"opener": None} if rng.random() < 0.3 else {}
        wait = session._refresh(session.transport, self.counter)
        if type(wait) is not float or not 0 < wait <= threading.TIMEOUT_MAX:
            return f"a keepalive wait of {wait!r:.80}"
        return self._ttl_wrong()

    def log_in(self) -> str | None:
        self.auth._token = None  # a user's first request logs in first
        reply = self.auth.call("/v3/kv/range", {"key": client._b64(b"k")}, self._deadline(), True)
        if not isinstance(self.auth._token, str):
            return f"a token of type {type(self.auth._token).__name__}"
        return self._dict(reply)

    def watch(self) -> str | None:
        """As the lock wait (client.py's ``_wait_deleted``) reads it: chunks up to the deadline."""
        deadline = self._deadline()
        body = {"create_request": {"key": client._b64(b"k"), "start_revision": "13", "filters": ["NOPUT"]}}
        conn = self.session.transport.open_stream("/v3/watch", body, deadline)
        try:
            while (remaining := deadline - time.monotonic()) > 0:
                conn.settimeout(remaining)
                chunk = conn.read_chunk()
                if type(chunk) is not bytes:
                    return f"a chunk of type {type(chunk).__name__}"
                if not chunk:
                    return None
        finally:
            conn.close()
        return None


# -- the run ------------------------------------------------------------------------

#: what each call may raise: the adapter's typed errors; the watch stream's
#: readers catch OSError (a lost or timed-out stream) and poll instead
ALLOWED: dict[str, tuple[type[BaseException], ...]] = {"watch": (OSError,)}
ALLOWED_DEFAULT: tuple[type[BaseException], ...] = (DbwrapError,)


def _one_case(calls: _Calls, gateway: FakeGateway, cases: _Cases, rng: random.Random,
              report: EtcdFuzzReport, margin: float) -> None:
    name, path, call = calls.pick(rng)
    kind, make = cases.pick()
    gateway.arm(make(path))
    report.cases += 1
    report.by_kind[kind] += 1
    report.by_call[name] += 1
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    started, cpu_started = time.monotonic(), time.thread_time()
    wrong: str | None = None
    try:
        wrong = call()
        outcome = "returned"
    except ALLOWED.get(name, ALLOWED_DEFAULT) as exc:
        outcome = type(exc).__name__
    except BaseException as exc:  # noqa: B036 - what the property is about (KeyboardInterrupt aside)
        if isinstance(exc, KeyboardInterrupt):
            raise
        outcome = type(exc).__name__
        wrong = f"raised {type(exc).__name__}: {str(exc)[:200]}"
    elapsed, cpu = time.monotonic() - started, time.thread_time() - cpu_started
    peak = tracemalloc.get_traced_memory()[1] - base
    gateway.disarm()
    report.outcomes[outcome] += 1
    report.longest = max(report.longest, elapsed)
    report.peak_bytes = max(report.peak_bytes, peak)
    where = f"{name} call, case {kind} (#{report.cases})"
    found = [wrong] if wrong is not None else []
    timeout = KEEPALIVE_TIMEOUT if name == "keepalive" else OP_TIMEOUT
    if elapsed > timeout + margin:
        stretch = _stretch()
        if elapsed > timeout + margin + cpu * stretch:
            found.append(f"took {elapsed:.2f} s, its timeout is {timeout:.2f} s (allowed: {margin:.2f} s more, "
                         f"and its {cpu:.2f} s of CPU x {stretch:.1f}, how slowly this process gets a core now)")
    if cpu > CPU_BOUND:
        found.append(f"used {cpu:.2f} s of CPU, over its {CPU_BOUND:.2f} s")
    if peak > MEMORY_BOUND:
        found.append(f"allocated {peak >> 20} MiB at its peak")
    report.failures += [f"{where}: {why}" for why in found][:MAX_FAILURES - len(report.failures)]


#: the CPU time _stretch spends measuring
STRETCH_SAMPLE = 0.02


def _stretch() -> float:
    """How many seconds of the clock a second of this thread's CPU takes
    now: 1 on an idle machine, more while the thread waits for a core (or
    for the GIL). Measured by STRETCH_SAMPLE of busy work."""
    wall, cpu = time.monotonic(), time.thread_time()
    spent = 0.0
    while spent < STRETCH_SAMPLE:
        sum(range(1000))
        spent = time.thread_time() - cpu
    return max(1.0, (time.monotonic() - wall) / spent)


def fuzz(seconds: float, seed: int, stop_at_first: bool = True, margin: float = MARGIN) -> EtcdFuzzReport:
    """The client's calls against a fake gateway for ``seconds``; with
    ``stop_at_first``, it stops at the first failure. ``margin``: how long
    past its timeout a call may take (under DRIP_SECONDS - KEEPALIVE_TIMEOUT,
    or a slow drip passes)."""
    report = EtcdFuzzReport()
    rng = random.Random(seed)
    cases = _Cases(random.Random(rng.randrange(1 << 64)))
    gateway = FakeGateway(report)
    calls = _Calls(gateway.port)
    started = time.monotonic()
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    try:
        gateway.start()
        while time.monotonic() - started < seconds:
            _one_case(calls, gateway, cases, rng, report, margin)
            if report.failures and stop_at_first:
                break
    finally:
        calls.close()
        gateway.stop()
        if not tracing:
            tracemalloc.stop()
        report.failures += gateway.failed
        report.seconds = time.monotonic() - started
    return report


def _int_or_bust(value: object, what: str) -> int:
    """The broken parse: an integer field read with a bare int()."""
    return int(value)  # type: ignore[call-overload]


def _read_with_the_whole_timeout(self: client._DeadlineReader, buffer: Any) -> int | None:
    """The broken wait: every read given the whole timeout afresh."""
    return socket.SocketIO.readinto(self, buffer)


@contextlib.contextmanager
def broken_deadline() -> Iterator[None]:
    """The client as it was before its reads shared one deadline: a server
    dripping a byte at a time kept a call going as long as it liked."""
    saved = client._DeadlineReader.readinto
    client._DeadlineReader.readinto = _read_with_the_whole_timeout  # type: ignore[method-assign]
    try:
        yield
    finally:
        client._DeadlineReader.readinto = saved  # type: ignore[method-assign]


@contextlib.contextmanager
def broken_parse() -> Iterator[None]:
    """The client with its integer fields read by a bare int(): what a
    reply with a missing or mistyped field did before this fuzzer."""
    saved = client._reply_int
    client._reply_int = _int_or_bust
    try:
        yield
    finally:
        client._reply_int = saved


def summary(report: EtcdFuzzReport, seed: int) -> str:
    kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(report.by_kind.items()))
    calls = ", ".join(f"{name} {n}" for name, n in sorted(report.by_call.items()))
    outcomes = ", ".join(f"{name} {n}" for name, n in sorted(report.outcomes.items()))
    return (f"etcd client fuzz, seed {seed}: {report.cases} cases in {report.seconds:.1f} s "
            f"({kinds}); calls: {calls}; outcomes: {outcomes}; {report.connections} connections; "
            f"longest call {report.longest:.2f} s, peak {report.peak_bytes / (1 << 20):.1f} MiB; "
            f"failures: {len(report.failures)}")


def main(argv: list[str] | None = None) -> int:
    """Exit 1 unless every call returned its type or raised a typed error, in time."""
    args = sys.argv[1:] if argv is None else list(argv)
    broken = "--broken" in args
    args = [a for a in args if a != "--broken"]
    if any(a.startswith("-") for a in args):
        print(__doc__, file=sys.stderr)
        return 2
    seconds = float(args[0]) if args else 15.0
    seed = int(args[1]) if len(args) > 1 else int(time.time())
    with broken_parse() if broken else contextlib.nullcontext():
        report = fuzz(seconds, seed)
    print(summary(report, seed))
    for failure in report.failures:
        print(f"FAIL: {failure}", file=sys.stderr)
    return 1 if report.broken else 0


if __name__ == "__main__":
    raise SystemExit(main())
