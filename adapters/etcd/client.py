"""etcd v3 client for the etcd adapter: the JSON gateway, and one session per process.

Transport: etcd's gRPC-JSON gateway (``/v3/...`` on the client port) over a
minimal HTTP/1.1 client on a plain socket, one keep-alive connection per
process. It is fork-safe and needs no extra package, and a process using it
is about half the size of one using a gRPC client, with a third of the threads
(smbd forks one process per client; bench/etcd_client_choice.py measures both,
docs/adapters/etcd.md has the numbers).

Session: what one process shares between its databases on one cluster: that
connection, a lease granted on first need and a keepalive thread refreshing it.
A session inherited through fork() is dropped unused, never closed.

The leading underscore keeps the registry from listing this as an adapter;
the etcd adapter's own modules are its only users.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import math
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from dbwrap_py.errors import (
    AccessDenied,
    ConfigError,
    DbwrapError,
    InvalidParameter,
    NotSupported,
    Timeout,
    Unavailable,
)
from dbwrap_py.leased import OP_TIMEOUT, renewal_timeout
from dbwrap_py.options import PASSWORD_OPTIONS, Option, Options, password_of

DEFAULT_LEASE_TTL = 10
DEFAULT_OP_TIMEOUT = 10.0
#: the options _Config reads (the adapter's and the node agent's)
CLIENT_OPTIONS = (
    Option("endpoints", list, [], help="host:port[,host:port...] (required); https:// for TLS"),
    Option("lease_ttl", int, DEFAULT_LEASE_TTL, minimum=1, help="seconds, the process lease's TTL"),
    OP_TIMEOUT.with_default(DEFAULT_OP_TIMEOUT),
    Option("ca_file", str, "", help="CA certificate file (TLS)"),
    Option("cert_file", str, "", help="client certificate file (TLS, with key_file)"),
    Option("key_file", str, "", help="client key file (TLS, with cert_file)"),
    Option("user", str, "", help="etcd user (with a password)"),
    *PASSWORD_OPTIONS,
)
#: the largest reply body read: a bigger one is refused, not allocated (a scan
#: page is page_size records; etcd's --max-request-bytes bounds each)
MAX_REPLY_BYTES = 128 << 20
#: the largest reply head (status line and headers); etcd's are ~200 bytes
_MAX_HEAD_BYTES = 64 << 10
#: a body is read this much at a time: memory follows what comes, not what a length claims
_PIECE = 1 << 20
#: etcd's own bound on a lease's TTL (lease.MaxLeaseTTL)
_MAX_LEASE_TTL = 9_000_000_000

# gRPC status codes, as the gateway reports them in {"code": N}
_DEADLINE_EXCEEDED = 4
_NOT_FOUND = 5
_PERMISSION_DENIED = 7
_RESOURCE_EXHAUSTED = 8
_OUT_OF_RANGE = 11
_UNAVAILABLE = 14
_UNAUTHENTICATED = 16
_INVALID_ARGUMENT = 3

_AUTHENTICATE = "/v3/auth/authenticate"


class _LeaseGone(DbwrapError):
    """etcd no longer knows the lease (it expired); get a new one and retry."""


class _Compacted(DbwrapError):
    """A pinned revision was compacted away during a paged scan."""


class _Malformed(ConnectionError):
    """etcd's reply breaks HTTP or is not what the request gets: no retry mends it."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes:
    """A key or value of etcd's reply; Unavailable if it is not base64."""
    try:
        return base64.b64decode(text) if text else b""
    except (ValueError, TypeError):  # binascii.Error, a str not ASCII, not a str
        shown = f"{text!r:.80}" if isinstance(text, str) else f"a JSON {type(text).__name__}"
        raise Unavailable(f"etcd's reply has {shown} for a key or value, not base64") from None


def _reply_int(value: object, what: str) -> int:
    """An integer field of etcd's reply (the gateway writes int64s as strings);
    Unavailable if it is not one."""
    if type(value) is int:
        return value
    if isinstance(value, str) and len(value) <= 20:
        try:
            return int(value)
        except ValueError:
            pass
    shown = f"{value!r:.80}" if isinstance(value, str) else f"a JSON {type(value).__name__}"
    raise Unavailable(f"etcd's reply has {what} {shown}, not an integer")


def _json_object(data: bytes) -> dict[str, Any]:
    """A reply body: a JSON object, or _Malformed."""
    try:
        reply = json.loads(data)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, a deep nesting
        raise _Malformed(f"not JSON ({type(exc).__name__}: {str(exc)[:100]})") from None
    if not isinstance(reply, dict):
        raise _Malformed(f"a JSON {type(reply).__name__}, not an object")
    return reply


def _prefix_end(prefix: bytes) -> bytes:
    """The first key after every key starting with ``prefix`` (which ends in '/')."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


# -- configuration ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Endpoint:
    host: str
    port: int
    tls: bool

    def __str__(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"


@dataclasses.dataclass(frozen=True)
class _Config:
    """What one connection needs; processes share a session per distinct config."""

    endpoints: tuple[_Endpoint, ...]
    lease_ttl: int
    op_timeout: float
    ca_file: str | None
    cert_file: str | None
    key_file: str | None
    user: str | None
    password: str | None = dataclasses.field(repr=False)

    @classmethod
    def from_options(cls, options: Options) -> "_Config":
        options = options.with_schema(CLIENT_OPTIONS)
        ca_file = options.value("ca_file") or None
        cert_file = options.value("cert_file") or None
        key_file = options.value("key_file") or None
        user = options.value("user") or None
        for name, path in (("ca_file", ca_file), ("cert_file", cert_file), ("key_file", key_file)):
            if path is not None and not os.path.isfile(path):
                raise ConfigError(f"option {name}={path!r}: no such file")
        if (cert_file is None) != (key_file is None):
            raise ConfigError("options cert_file and key_file go together")
        tls_default = ca_file is not None or cert_file is not None
        raw = options.value("endpoints")
        if not raw:
            raise ConfigError("option endpoints is required (host:port[,host:port...])")
        endpoints = tuple(_parse_endpoint(item, tls_default) for item in raw)
        password = password_of(options, tls=all(e.tls for e in endpoints)) or None
        if (user is None) != (password is None):
            raise ConfigError("options user and password (or password_file) go together")
        return cls(
            endpoints=endpoints,
            lease_ttl=options.value("lease_ttl"),
            op_timeout=_positive(options.value("op_timeout"), "op_timeout"),
            ca_file=ca_file,
            cert_file=cert_file,
            key_file=key_file,
            user=user,
            password=password,
        )


def _positive(value: float, name: str) -> float:
    if not value > 0:
        raise ConfigError(f"option {name}={value} must be above 0")
    return value


def _parse_endpoint(text: str, tls_default: bool) -> _Endpoint:
    tls = tls_default
    rest = text
    if "://" in text:
        scheme, _, rest = text.partition("://")
        if scheme not in ("http", "https"):
            raise ConfigError(f"endpoint {text!r}: scheme must be http or https")
        tls = scheme == "https"
    host, sep, port_text = rest.rstrip("/").rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(f"endpoint {text!r} is not host:port")
    return _Endpoint(host, int(port_text), tls)


# -- transport: the JSON gateway over a minimal HTTP/1.1 client -----------------


class _DeadlineReader(socket.SocketIO):
    """A socket's reads, each given only what is left of the deadline: a
    server dripping a byte at a time cannot stretch a reply past it."""

    deadline = math.inf

    def readinto(self, buffer: Any) -> int | None:
        if self.deadline != math.inf:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("etcd's reply did not come within the timeout")
            self._sock.settimeout(remaining)
        return super().readinto(buffer)


class _HttpConnection:
    """Just enough HTTP/1.1 for etcd's gateway: POST of a JSON body on a
    keep-alive socket, replies with Content-Length or chunked.

    The standard library's http.client took ~650 us per small range read here
    against ~430 us for this (its header parsing costs ~110 us of CPU), and
    imports email and ssl: ~6 MiB more in every process.
    """

    def __init__(self, endpoint: _Endpoint, timeout: float, context: Any) -> None:
        sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if endpoint.tls:
                sock = context.wrap_socket(sock, server_hostname=endpoint.host)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self._raw = _DeadlineReader(sock, "rb")
        self._reader = io.BufferedReader(self._raw)
        self._host = f"{endpoint.host}:{endpoint.port}".encode()
        #: the server will close after this reply: do not reuse the connection
        self.server_closes = False

    def settimeout(self, seconds: float | None) -> None:
        """Bound what follows, the reply's every read together, to ``seconds``."""
        self.sock.settimeout(seconds)
        self._raw.deadline = math.inf if seconds is None else time.monotonic() + seconds

    def close(self) -> None:
        self._reader.close()
        self.sock.close()

    def send(self, path: str, body: bytes, token: str | None) -> None:
        head = b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % (
            path.encode(), self._host, len(body))
        if token is not None:
            head += b"Authorization: %s\r\n" % token.encode()
        self.sock.sendall(head + b"\r\n" + body)

    def read_head(self) -> tuple[int, dict[bytes, bytes]]:
        left = _MAX_HEAD_BYTES
        line = self._line(left)
        left -= len(line)
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or len(parts[1]) != 3 or not parts[1].isdigit():
            raise _Malformed(f"not an HTTP reply: {line[:80]!r}")
        headers: dict[bytes, bytes] = {}
        while True:
            line = self._line(left)
            left -= len(line)
            if line in (b"\r\n", b"\n"):
                break
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        if headers.get(b"connection", b"").lower() == b"close":
            self.server_closes = True
        return int(parts[1]), headers

    def read_body(self, headers: Mapping[bytes, bytes]) -> bytes:
        length = headers.get(b"content-length")
        if length is not None:
            if not length.isdigit():
                raise _Malformed(f"a Content-Length of {length[:40]!r}")
            return self._exactly(_capped(int(length) if len(length) <= 12 else MAX_REPLY_BYTES + 1))
        if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            parts = []
            total = 0
            while chunk := self.read_chunk():
                total = _capped(total + len(chunk))
                parts.append(chunk)
            return b"".join(parts)
        self.server_closes = True
        return _capped_data(self._up_to(MAX_REPLY_BYTES + 1))

    def read_chunk(self) -> bytes:
        """The next chunk of a chunked body; b"" after the last."""
        size_text = self._line().split(b";")[0].strip()
        if not size_text or len(size_text) > 8 or size_text.translate(None, b"0123456789abcdefABCDEF"):
            raise _Malformed(f"a chunk size of {size_text[:40]!r}")
        size = _capped(int(size_text, 16))
        if size == 0:
            while self._line() not in (b"\r\n", b"\n"):  # trailers
                pass
            return b""
        data = self._exactly(size)
        if self._exactly(2) != b"\r\n":
            raise _Malformed("a chunk longer than its size")
        return data

    def _line(self, most: int = 65537) -> bytes:
        line = self._reader.readline(most)
        if not line.endswith(b"\n"):
            if len(line) >= most:
                raise _Malformed(f"a reply head over {_MAX_HEAD_BYTES} bytes, or a line over {most}")
            raise ConnectionError("etcd closed the connection")
        return line

    def _exactly(self, size: int) -> bytes:
        data = self._up_to(size)
        if len(data) < size:
            raise ConnectionError("etcd closed the connection mid-reply")
        return data

    def _up_to(self, size: int) -> bytes:
        """``size`` bytes, fewer if the server closes first, read _PIECE at a
        time: what a reply claims is not allocated before it comes."""
        if size <= _PIECE:
            return self._reader.read(size)
        parts = []
        while size > 0 and (piece := self._reader.read(min(size, _PIECE))):
            parts.append(piece)
            size -= len(piece)
        return b"".join(parts)


def _capped(size: int) -> int:
    if size > MAX_REPLY_BYTES:
        raise _Malformed(f"a reply of {size} bytes, over the {MAX_REPLY_BYTES} read (lower page_size)")
    return size


def _capped_data(data: bytes) -> bytes:
    _capped(len(data))
    return data


class _Transport:
    """One keep-alive HTTP connection to one endpoint at a time, failing over.

    A request is retried on another endpoint only when it cannot have been
    applied (no connection), or when it is safe to repeat (``idempotent``).
    Every request ends within its deadline: Timeout if the server is silent,
    Unavailable if no endpoint answers, AccessDenied at once if every endpoint
    refuses our TLS certificates or theirs fails ca_file, or etcd refuses the
    user and password. With a user, the first request logs in (as a request
    of its own) and a request refused for an expired token logs in again.
    """

    def __init__(self, config: _Config) -> None:
        self.config = config
        self._current = 0
        self._conn: _HttpConnection | None = None
        self._token: str | None = None
        self._ssl: Any = None
        if any(e.tls for e in config.endpoints):
            import ssl  # only with TLS: it costs ~4 MiB

            self._ssl = ssl.create_default_context(cafile=config.ca_file)
            if config.cert_file is not None:
                self._ssl.load_cert_chain(config.cert_file, config.key_file)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def open_stream(self, path: str, body: Mapping[str, Any], deadline: float) -> _HttpConnection:
        """A fresh connection carrying one streaming request (a watch), its
        reply head read; the caller reads chunks and closes it."""
        endpoint = self.config.endpoints[self._current]
        conn = _HttpConnection(endpoint, max(0.001, deadline - time.monotonic()), self._ssl)
        try:
            conn.settimeout(max(0.001, deadline - time.monotonic()))
            conn.send(path, json.dumps(body).encode(), self._token)
            status, _ = conn.read_head()
            if status != 200:
                raise ConnectionError(f"etcd answered {path} with HTTP {status}")
            return conn
        except BaseException:
            conn.close()
            raise

    def call(self, path: str, body: Mapping[str, Any], deadline: float, idempotent: bool) -> dict[str, Any]:
        if self.config.user and self._token is None and path != _AUTHENTICATE:
            self._log_in(deadline)
        payload = json.dumps(body).encode()
        refused: list[str] = []
        tls_refused: set[_Endpoint] = set()
        reauthenticated = False
        timed_out: str | None = None  # etcd's own "request timed out" of a repeated request
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if timed_out is not None:
                    raise Timeout(f"etcd {path}: {timed_out} (repeated until the deadline)")
                if refused:
                    raise Unavailable(f"no etcd endpoint reachable: {'; '.join(refused[-3:])}")
                raise Timeout(f"etcd did not answer {path} in time")
            endpoint = self.config.endpoints[self._current]
            try:
                conn = self._connection(endpoint, deadline)
            except OSError as exc:  # nothing was sent
                refused.append(f"{endpoint}: {exc}")
                self._tls_refused(exc, endpoint, tls_refused)
                self._rotate()
                if len(refused) % len(self.config.endpoints) == 0:
                    time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
                continue
            try:
                conn.settimeout(remaining)
                conn.send(path, payload, self._token)
                status, headers = conn.read_head()
                data = conn.read_body(headers)
                reply = _json_object(data) if status == 200 else None
            except (socket.timeout, TimeoutError):
                self.close()
                raise Timeout(f"etcd at {endpoint} did not answer {path} within the timeout") from None
            except _Malformed as exc:
                self.close()
                raise Unavailable(
                    f"etcd at {endpoint} sent a malformed reply to {path} "
                    f"(a write may or may not have been applied): {exc}"
                ) from None
            except OSError as exc:
                # The request may have reached etcd: repeat only what is safe to repeat.
                self.close()
                if self._tls_refused(exc, endpoint, tls_refused):
                    refused.append(f"{endpoint}: {exc}")  # refused before any request was read
                    self._rotate()
                    continue
                self._rotate()
                if idempotent:
                    refused.append(f"{endpoint}: {exc}")
                    continue
                raise Unavailable(
                    f"connection to etcd at {endpoint} lost during {path}; "
                    f"the write may or may not have been applied: {exc}"
                ) from None
            if conn.server_closes:
                self.close()
            if reply is not None:
                return reply
            code, message = _error_of(data, status)
            if code == _UNAVAILABLE and "no leader" in message:
                # refused before it was proposed: safe to repeat once a leader is elected
                refused.append(f"{endpoint}: {message}")
                if len(self.config.endpoints) > 1:
                    self._rotate()
                time.sleep(min(0.02, max(0.0, deadline - time.monotonic())))
                continue
            transient = code in (_UNAVAILABLE, _DEADLINE_EXCEEDED, _RESOURCE_EXHAUSTED) or "timed out" in message
            if path == _AUTHENTICATE and not transient:  # else Timeout/Unavailable below, as for any request
                raise AccessDenied(f"etcd refused user {self.config.user!r}: {message}")
            if code == _UNAUTHENTICATED and self.config.user and not reauthenticated and path != _AUTHENTICATE:
                # tokens expire (5 min by default, and when the user's password
                # changes): log in again, once; the request was refused, not applied
                self._token = None
                reauthenticated = True
                self._log_in(deadline)
                continue
            if idempotent and transient and code != _RESOURCE_EXHAUSTED:
                # "request timed out, possibly due to previous leader failure":
                # a member died and raft elects another leader; safe to repeat
                # (measured: a lease grant refused so when one of three members
                # was SIGKILLed, and smbd failed an open)
                timed_out = message
                if len(self.config.endpoints) > 1:
                    self._rotate()
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
                continue
            raise _error_for(code, message, path)

    # -- internals ----------------------------------------------------------

    def _rotate(self) -> None:
        self.close()
        self._current = (self._current + 1) % len(self.config.endpoints)

    def _connection(self, endpoint: _Endpoint, deadline: float) -> _HttpConnection:
        conn = self._conn
        if conn is not None:
            # A readable idle keep-alive socket means the server closed it
            # (a killed member): reconnect before sending, so nothing is ambiguous.
            readable, _, _ = select.select([conn.sock], [], [], 0)
            if not readable:
                return conn
            self.close()
        conn = self._conn = _HttpConnection(endpoint, max(0.001, deadline - time.monotonic()), self._ssl)
        return conn

    def _log_in(self, deadline: float) -> None:
        """Get a token for user/password: a request like any other (failover,
        no-leader retries, the deadline); AccessDenied if etcd refuses them."""
        body = {"name": self.config.user, "password": self.config.password}
        token = self.call(_AUTHENTICATE, body, deadline, idempotent=True).get("token")
        if not isinstance(token, str) or not token or not token.isascii() or not token.isprintable():
            raise Unavailable(f"etcd's reply to {_AUTHENTICATE} has no token (a header's text)")
        self._token = token

    def _tls_refused(self, exc: OSError, endpoint: _Endpoint, refused_by: set[_Endpoint]) -> bool:
        """Whether ``exc`` is a TLS certificate refusal (by us or by etcd),
        which no retry mends: AccessDenied once every endpoint refused."""
        why = _tls_refusal(exc)
        if why is None:
            return False
        refused_by.add(endpoint)
        if len(refused_by) >= len(set(self.config.endpoints)):
            raise AccessDenied(f"TLS with etcd at {endpoint} failed: {why}")
        return True


def _tls_refusal(exc: OSError) -> str | None:
    """Why a TLS connection failed for good, or None (not TLS, or a network
    fault). Under TLS 1.3 etcd rejects a client certificate after the
    handshake, so its alert can come with the reply to the first request."""
    reason = getattr(exc, "reason", None)  # ssl.SSLError's OpenSSL reason code
    if not isinstance(reason, str):
        return None
    if reason == "CERTIFICATE_VERIFY_FAILED":
        detail = getattr(exc, "verify_message", None) or exc
        return f"etcd's certificate did not verify ({detail}); is ca_file the CA that signed it?"
    if "ALERT" in reason and any(word in reason for word in ("CERTIFICATE", "UNKNOWN_CA", "ACCESS_DENIED")):
        return (
            f"etcd refused the connection ({reason}): it wants a client certificate "
            f"(cert_file, key_file) signed by a CA it trusts"
        )
    return None


def _error_of(data: bytes, status: int) -> tuple[int, str]:
    """The gRPC code and message of an error reply; from its HTTP status if it has none."""
    code, text = (_UNAVAILABLE if status >= 500 else 0), f"HTTP {status}: {data[:200]!r}"
    try:
        parsed = _json_object(data)
    except _Malformed:
        return code, text
    message = parsed.get("message") or parsed.get("error")
    if type(parsed.get("code", 0)) is int:
        code = parsed.get("code", 0)
    return code, message if isinstance(message, str) else text


def _error_for(code: int, message: str, path: str) -> DbwrapError:
    text = f"etcd {path}: {message}"
    if code == _NOT_FOUND and "lease not found" in message:
        return _LeaseGone(text)
    if code == _OUT_OF_RANGE and "compacted" in message:
        return _Compacted(text)
    if "too large" in message or "larger than max" in message:
        return InvalidParameter(f"{text} (etcd's --max-request-bytes bounds a value)")
    if code == _DEADLINE_EXCEEDED or "timed out" in message:
        return Timeout(text)
    if code == _UNAVAILABLE or code == _RESOURCE_EXHAUSTED:
        # RESOURCE_EXHAUSTED is "database space exceeded": etcd takes no writes
        return Unavailable(text)
    if code in (_PERMISSION_DENIED, _UNAUTHENTICATED) or "user name is empty" in message or "CommonName" in message:
        # "user name is empty" (INVALID_ARGUMENT): etcd has auth on, we gave no user;
        # "CommonName of client ...": etcd 3.4's gateway with auth and client
        # certificate auth refuses a client certificate that has a CN
        return AccessDenied(text)
    if code == _INVALID_ARGUMENT and "too many operations" in message:
        return NotSupported(f"{text} (raise etcd's --max-txn-ops for larger transactions)")
    if code == _INVALID_ARGUMENT:
        return InvalidParameter(text)
    return DbwrapError(text)


# -- per-process session: connection, lease, keepalive thread ------------------


class _Session:
    """What one process shares between its databases on one cluster.

    The lease is granted on first need and refreshed every TTL/3 by a daemon
    thread with its own connection; a refresh waits for its answer as long as
    etcd may still hold the lease (``renewal_timeout``). The thread sleeps between refreshes: it
    costs one parked thread and TTL/3-spaced requests per process, and it is
    what keeps a lock (or a volatile database's opener key) alive through a
    long hold. The lease is revoked when the last database closes.
    """

    def __init__(self, config: _Config) -> None:
        self.config = config
        self.pid = os.getpid()
        self.transport = _Transport(config)
        self.users = 0
        self.keepalive_round_trips = 0
        self._mutex = threading.Lock()
        self._lease_id: int | None = None
        self._lease_ttl = config.lease_ttl
        self._expires_at = 0.0
        self._renewed_at = 0.0  # when etcd's last grant or renewal of it was answered
        #: the keepalive's failures since the last renewal, and the last one's cause
        self._failures, self._last_failure = 0, ""
        #: leases that lapsed under us, newest last: (lease, noticed at, seconds unrenewed, failures, cause)
        self.lapses: list[tuple[int, float, float, int, str]] = []
        self._openers: dict[bytes, None] = {}  # opener keys to put again under a new lease
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def lease(self, deadline: float, count: "_Counter") -> int:
        """The live lease, granted now if there is none (or it has lapsed)."""
        with self._mutex:
            if self._lease_id is not None and time.monotonic() < self._expires_at:
                return self._lease_id
            if self._lease_id is not None:  # the keepalive did not renew it in time
                self._lapsed(self._lease_id)
            return self._grant(self.transport, deadline, count)

    def lease_report(self) -> str:
        """This process's lease, for a fencing error: which, when etcd last
        renewed it, and the leases that lapsed under us (a lock key goes
        with its lease; the lease now may be a newer one)."""
        with self._mutex:
            lease_id, renewed_at, ttl, lapses = self._lease_id, self._renewed_at, self._lease_ttl, list(self.lapses)
            expires_at = self._expires_at
        if renewed_at == 0.0:
            return "this process holds no lease"
        now = time.monotonic()
        which = f"lease {lease_id:x}" if lease_id is not None else "the last lease, since dropped,"
        report = f"{which} was last renewed {now - renewed_at:.1f} s ago (TTL {ttl} s)"
        if lease_id is not None and now >= expires_at:
            report += ", past its TTL: lapsed"
        for lapsed, noticed, unrenewed, failures, cause in lapses:
            report += (f"; lease {lapsed:x} lapsed {now - noticed:.1f} s ago, unrenewed for {unrenewed:.1f} s"
                       f" ({failures} keepalive failure(s){': ' + cause if cause else ''})")
        return report

    def lease_lost(self, lease_id: int) -> None:
        with self._mutex:
            if self._lease_id == lease_id:
                self._lapsed(lease_id)
                self._lease_id = None

    def add_opener(self, key: bytes) -> None:
        with self._mutex:
            self._openers[key] = None

    def remove_opener(self, key: bytes) -> None:
        with self._mutex:
            self._openers.pop(key, None)

    def close(self) -> None:
        """Revoke the lease (our locks and opener keys go at once) and stop the thread."""
        self._stop.set()
        with self._mutex:
            lease_id, self._lease_id = self._lease_id, None
        if lease_id is not None:
            try:
                deadline = time.monotonic() + min(1.0, self.config.op_timeout)
                self.transport.call("/v3/lease/revoke", {"ID": str(lease_id)}, deadline, idempotent=True)
            except DbwrapError:
                pass  # it expires by itself
        self.transport.close()

    # -- internals: called with self._mutex held -----------------------------

    def _lapsed(self, lease_id: int) -> None:
        """Remember that ``lease_id`` ended under us (the last few), for lease_report."""
        self.lapses = [*self.lapses[-2:], (lease_id, time.monotonic(), time.monotonic() - self._renewed_at,
                                           self._failures, self._last_failure)]

    def _grant(self, transport: _Transport, deadline: float, count: "_Counter") -> int:
        sent = time.monotonic()
        count.add()
        reply = transport.call("/v3/lease/grant", {"TTL": str(self.config.lease_ttl)}, deadline, idempotent=True)
        lease_id = _reply_int(reply.get("ID"), "lease ID")
        ttl = _reply_int(reply.get("TTL", self.config.lease_ttl), "lease TTL")  # etcd may raise a TTL below its minimum
        if not 0 < lease_id < 1 << 63 or not 0 < ttl <= _MAX_LEASE_TTL:
            raise Unavailable(f"etcd granted lease {lease_id} with TTL {ttl}: out of range")
        self._lease_id, self._lease_ttl = lease_id, ttl
        self._expires_at = sent + self._lease_ttl
        self._renewed_at = time.monotonic()
        if self._openers:  # the old lease took our opener keys with it
            count.add()
            ops = [{"request_put": {"key": _b64(k), "lease": str(lease_id)}} for k in self._openers]
            transport.call("/v3/kv/txn", {"success": ops}, deadline, idempotent=True)
        if self._thread is None:
            self._thread = threading.Thread(target=self._keepalive, name="dbwrap-py-etcd-keepalive", daemon=True)
            self._thread.start()
        return lease_id

    def _keepalive(self) -> None:
        transport = _Transport(self.config)
        counter = _Counter(self, "keepalive_round_trips")
        interval = self._lease_ttl / 3
        while not self._stop.wait(interval):
            interval = self._refresh(transport, counter)
        transport.close()

    def _refresh(self, transport: _Transport, counter: "_Counter") -> float:
        """One round of the keepalive thread; the seconds to wait before the next."""
        interval = self._lease_ttl / 3
        with self._mutex:
            lease_id, renewed_at = self._lease_id, self._renewed_at
        if lease_id is None:
            return interval
        sent = time.monotonic()
        try:
            counter.add()
            # etcd renews only once it has applied what it committed: a slow
            # disk delays the answer, worth waiting for while etcd may still
            # hold the lease (up to a TTL after its last answer)
            wait = renewal_timeout(interval, renewed_at + self._lease_ttl - sent)
            reply = transport.call("/v3/lease/keepalive", {"ID": str(lease_id)}, sent + wait, idempotent=True)
            ttl = _keepalive_ttl(reply)
            with self._mutex:
                if self._lease_id != lease_id:
                    return interval
                if ttl > 0:
                    self._expires_at = sent + ttl
                    self._renewed_at = time.monotonic()
                    self._failures, self._last_failure = 0, ""
                    return max(0.0, sent + interval - time.monotonic())  # a slow answer is not added
                self._lapsed(lease_id)
                if self._openers:  # lapsed: put the opener keys back at once
                    self._grant(transport, time.monotonic() + self.config.op_timeout, counter)
                else:
                    self._lease_id = None  # the next lock grants a new one
        except DbwrapError as exc:
            with self._mutex:
                self._failures += 1
                self._last_failure = f"{type(exc).__name__}: {exc}"[:160]
            return max(0.05, self._lease_ttl / 10)  # retry sooner while etcd is away
        return max(0.0, sent + interval - time.monotonic())  # a slow answer is not added to the interval


def _keepalive_ttl(reply: Mapping[str, Any]) -> int:
    """The TTL a keepalive reply gives the lease: 0 or less when it has lapsed."""
    result = reply.get("result", {})
    if not isinstance(result, dict):
        raise Unavailable(f"etcd's keepalive reply has a JSON {type(result).__name__} for its result")
    ttl = _reply_int(result.get("TTL", 0), "lease TTL")
    if ttl > _MAX_LEASE_TTL:
        raise Unavailable(f"etcd's keepalive reply has lease TTL {ttl}: out of range")
    return ttl


class _Counter:
    """Adds one to an integer attribute: the round-trip counts."""

    __slots__ = ("owner", "name")

    def __init__(self, owner: object, name: str) -> None:
        self.owner = owner
        self.name = name

    def add(self) -> None:
        setattr(self.owner, self.name, getattr(self.owner, self.name) + 1)


def _wait_deleted(transport: _Transport, key: bytes, start_revision: int, deadline: float,
                  once_watching: Callable[[], None] | None = None) -> None:
    """Return when ``key`` is deleted at or after ``start_revision``, or at
    ``deadline`` (one watch stream; a watch that cannot open is a short poll).

    ``once_watching`` runs when etcd has created the watch: what it
    causes is then seen at once. (A watch created at a revision already
    past is caught up by etcd's 100 ms sync loop instead.)
    """
    body = {"create_request": {"key": _b64(key), "start_revision": str(start_revision), "filters": ["NOPUT"]}}
    try:
        conn = transport.open_stream("/v3/watch", body, deadline)
    except OSError:
        if once_watching is not None:
            once_watching()
        time.sleep(min(0.01, max(0.0, deadline - time.monotonic())))  # poll instead
        return
    pending = b""
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            conn.settimeout(remaining)
            chunk = conn.read_chunk()
            if not chunk:
                return
            pending += chunk
            while b"\n" in pending:  # one JSON object per line
                line, pending = pending.split(b"\n", 1)
                result = json.loads(line).get("result", {}) if line.strip() else {}
                if result.get("events") or result.get("canceled"):
                    return  # deleted (or compacted past start_revision): try again
                if result.get("created") and once_watching is not None:
                    once_watching()
    except (OSError, ValueError):
        return
    finally:
        conn.close()


_sessions: dict[_Config, _Session] = {}
_inherited: list[_Session] = []  # from before fork(): kept, never used or closed


def _session_for(config: _Config) -> _Session:
    session = _sessions.get(config)
    if session is not None and session.pid == os.getpid():
        return session
    if session is not None:
        _inherited.append(session)
    session = _sessions[config] = _Session(config)
    return session
