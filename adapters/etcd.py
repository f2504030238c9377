"""etcd v3: Samba databases as key ranges in an etcd cluster, record locks on leases.

Transport: etcd's gRPC-JSON gateway (``/v3/...`` on the client port) over a
minimal HTTP/1.1 client on a plain socket, one keep-alive connection per
process. It is fork-safe and needs no extra package, and a process using it
is about half the size of one using a gRPC client, with a third of the threads
(smbd forks one process per client; bench/etcd_client_choice.py measures both).

Key layout, for database ``spec.name`` and option ``prefix`` (default
``dbwrap_py``)::

    <prefix>/<basename>@<hash>/d/<key>   a record (raw key bytes: etcd keys are bytes)
    <prefix>/<basename>@<hash>/l/<key>   the record's lock, on the holder's lease
    <prefix>/<basename>@<hash>/t         the transaction lock (persistent databases)
    <prefix>/<basename>@<hash>/s         sequence number key, rewritten by every write
    <prefix>/<basename>@<hash>/o/<owner> one per open of a volatile database, on a lease

``<hash>`` is 16 hex digits of BLAKE2b over the full path, so the same path
names the same database on every host sharing the cluster, and two
directories holding ``locking.tdb`` do not collide. Each sub-prefix differs
in its first byte, so a range read of ``d/`` never returns a lock key.

Record locks: the lock key is created by a transaction comparing its
create_revision to 0, attached to a per-process lease that a keepalive thread
refreshes every TTL/3. A crashed holder's locks vanish with its lease
(TTL to TTL + 0.5 s: etcd's lessor checks every 500 ms). A waiter watches the
lock key for its deletion, bounded by ``op_timeout``.

Fencing: every write under a record lock is one etcd transaction comparing
the lock key's create_revision with the one this holder got. A holder whose
lease lapsed (paused, partitioned) fails that compare and gets FencedOut, even
if another process took the lock since, so a stale holder never overwrites.

Round trips: lock_get = 1 (create lock key + read record, one txn),
put_unlock = 1 (compare, write, bump seqnum key, delete lock key), get = 1,
put/remove/unlock = 1 each. ``round_trips`` counts them per adapter.

Transactions (persistent databases): the transaction lock ``t`` is taken like
a record lock; record lockers also compare ``t`` absent, and the start waits
until no other process holds a record lock, so a transaction excludes every
other writer as tdb's allrecord lock does. Writes are buffered (reads see
them) and committed as one etcd transaction fenced on ``t``; etcd's
--max-txn-ops (128 by default) bounds the records written per transaction.

TDB_CLEAR_IF_FIRST: a volatile database is wiped when it is opened while no
process anywhere has it open. Each open puts an opener key on its process's
lease, and the first-opener test is the same transaction as the wipe
(compare: no key in ``o/``). A crashed opener counts until its lease lapses.

seqnum: the mod_revision of the ``s`` key, which every write transaction of
this database rewrites: one extra operation inside the same transaction (no
extra round trip), and it changes on every committed write of this database
and on nothing else.

Fork: every process gets its own connection, lease and keepalive thread on
first use; state inherited through fork() is dropped unused, never closed.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import select
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from dbwrap_py.adapter import Adapter, Capabilities, DatabaseSpec
from dbwrap_py.errors import (
    AccessDenied,
    ConfigError,
    Corruption,
    DbwrapError,
    FencedOut,
    InvalidParameter,
    LockConflict,
    NotSupported,
    Timeout,
    Unavailable,
)
from dbwrap_py.options import Options

DEFAULT_PREFIX = "dbwrap_py"
DEFAULT_LEASE_TTL = 10
DEFAULT_OP_TIMEOUT = 10.0
DEFAULT_PAGE_SIZE = 500
#: etcd refuses requests over --max-request-bytes (1.5 MiB by default; a
#: 1,536,000-byte value still fits, 1,572,864 does not); 1 MiB leaves room for
#: the key, the seqnum key and JSON framing
MAX_VALUE_SIZE = 1024 * 1024
#: etcd's lessor revokes expired leases on a 500 ms tick
LESSOR_TICK = 0.5

# gRPC status codes, as the gateway reports them in {"code": N}
_DEADLINE_EXCEEDED = 4
_NOT_FOUND = 5
_PERMISSION_DENIED = 7
_RESOURCE_EXHAUSTED = 8
_OUT_OF_RANGE = 11
_UNAVAILABLE = 14
_UNAUTHENTICATED = 16
_INVALID_ARGUMENT = 3


class _LeaseGone(DbwrapError):
    """etcd no longer knows the lease (it expired); get a new one and retry."""


class _Compacted(DbwrapError):
    """A pinned revision was compacted away during a paged scan."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


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
    password: str | None

    @classmethod
    def from_options(cls, options: Options) -> "_Config":
        ca_file = options.get_str("ca_file", "") or None
        cert_file = options.get_str("cert_file", "") or None
        key_file = options.get_str("key_file", "") or None
        user = options.get_str("user", "") or None
        password = options.get_str("password", "") or None
        for name, path in (("ca_file", ca_file), ("cert_file", cert_file), ("key_file", key_file)):
            if path is not None and not os.path.isfile(path):
                raise ConfigError(f"option {name}={path!r}: no such file")
        if (cert_file is None) != (key_file is None):
            raise ConfigError("options cert_file and key_file go together")
        if (user is None) != (password is None):
            raise ConfigError("options user and password go together")
        tls_default = ca_file is not None or cert_file is not None
        raw = options.get_list("endpoints", [])
        if not raw:
            raise ConfigError("option endpoints is required (host:port[,host:port...])")
        endpoints = tuple(_parse_endpoint(item, tls_default) for item in raw)
        return cls(
            endpoints=endpoints,
            lease_ttl=options.get_int("lease_ttl", DEFAULT_LEASE_TTL, minimum=1),
            op_timeout=_positive(options.get_float("op_timeout", DEFAULT_OP_TIMEOUT), "op_timeout"),
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
        self._reader = sock.makefile("rb")
        self._host = f"{endpoint.host}:{endpoint.port}".encode()
        #: the server will close after this reply: do not reuse the connection
        self.server_closes = False

    def settimeout(self, seconds: float) -> None:
        self.sock.settimeout(seconds)

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
        line = self._line()
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise ConnectionError(f"not an HTTP reply: {line[:80]!r}")
        headers: dict[bytes, bytes] = {}
        while True:
            line = self._line()
            if line in (b"\r\n", b"\n"):
                break
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        if headers.get(b"connection", b"").lower() == b"close":
            self.server_closes = True
        return int(parts[1]), headers

    def read_body(self, headers: Mapping[bytes, bytes]) -> bytes:
        if b"content-length" in headers:
            return self._exactly(int(headers[b"content-length"]))
        if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            parts = []
            while chunk := self.read_chunk():
                parts.append(chunk)
            return b"".join(parts)
        self.server_closes = True
        return self._reader.read()

    def read_chunk(self) -> bytes:
        """The next chunk of a chunked body; b"" after the last."""
        try:
            size = int(self._line().split(b";")[0], 16)
        except ValueError:
            raise ConnectionError("bad chunk size in etcd's reply") from None
        if size == 0:
            while self._line() not in (b"\r\n", b"\n"):  # trailers
                pass
            return b""
        data = self._exactly(size)
        self._exactly(2)  # the chunk's CRLF
        return data

    def _line(self) -> bytes:
        line = self._reader.readline(65537)
        if not line.endswith(b"\n"):
            raise ConnectionError("etcd closed the connection")
        return line

    def _exactly(self, size: int) -> bytes:
        data = self._reader.read(size)
        if len(data) < size:
            raise ConnectionError("etcd closed the connection mid-reply")
        return data


class _Transport:
    """One keep-alive HTTP connection to one endpoint at a time, failing over.

    A request is retried on another endpoint only when it cannot have been
    applied (no connection), or when it is safe to repeat (``idempotent``).
    Every request ends within its deadline: Timeout if the server is silent,
    Unavailable if no endpoint answers.
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
            conn.send(path, json.dumps(body).encode(), self._token)
            status, _ = conn.read_head()
            if status != 200:
                raise ConnectionError(f"etcd answered {path} with HTTP {status}")
            return conn
        except BaseException:
            conn.close()
            raise

    def call(self, path: str, body: Mapping[str, Any], deadline: float, idempotent: bool) -> dict[str, Any]:
        payload = json.dumps(body).encode()
        refused: list[str] = []
        reauthenticated = False
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if refused:
                    raise Unavailable(f"no etcd endpoint reachable: {'; '.join(refused[-3:])}")
                raise Timeout(f"etcd did not answer {path} in time")
            endpoint = self.config.endpoints[self._current]
            try:
                conn = self._connection(endpoint, deadline)
            except OSError as exc:  # nothing was sent
                refused.append(f"{endpoint}: {exc}")
                self._rotate()
                if len(refused) % len(self.config.endpoints) == 0:
                    time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
                continue
            try:
                conn.settimeout(remaining)
                conn.send(path, payload, self._token)
                status, headers = conn.read_head()
                data = conn.read_body(headers)
            except (socket.timeout, TimeoutError):
                self.close()
                raise Timeout(f"etcd at {endpoint} did not answer {path} within the timeout") from None
            except OSError as exc:
                # The request may have reached etcd: repeat only what is safe to repeat.
                self.close()
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
            if status == 200:
                return json.loads(data)
            code, message = _error_of(data, status)
            if code == _UNAVAILABLE and "no leader" in message:
                # refused before it was proposed: safe to repeat once a leader is elected
                refused.append(f"{endpoint}: {message}")
                if len(self.config.endpoints) > 1:
                    self._rotate()
                time.sleep(min(0.02, max(0.0, deadline - time.monotonic())))
                continue
            if code == _UNAUTHENTICATED and self.config.user and not reauthenticated:
                self._token = None  # tokens expire (5 min by default); log in again once
                self.close()
                reauthenticated = True
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
        conn = _HttpConnection(endpoint, max(0.001, deadline - time.monotonic()), self._ssl)
        if self.config.user and self._token is None:
            try:
                self._authenticate(conn)
            except BaseException:
                conn.close()
                raise
        self._conn = conn
        return conn

    def _authenticate(self, conn: _HttpConnection) -> None:
        body = json.dumps({"name": self.config.user, "password": self.config.password}).encode()
        conn.send("/v3/auth/authenticate", body, None)
        status, headers = conn.read_head()
        data = conn.read_body(headers)
        if status != 200:
            _, message = _error_of(data, status)
            raise AccessDenied(f"etcd refused user {self.config.user!r}: {message}")
        self._token = json.loads(data)["token"]


def _error_of(data: bytes, status: int) -> tuple[int, str]:
    try:
        parsed = json.loads(data)
        return int(parsed.get("code", 0)), str(parsed.get("message") or parsed.get("error"))
    except (ValueError, AttributeError):
        return (_UNAVAILABLE if status >= 500 else 0), f"HTTP {status}: {data[:200]!r}"


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
    if code in (_PERMISSION_DENIED, _UNAUTHENTICATED):
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
    thread with its own connection. The thread sleeps between refreshes: it
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
        self._openers: dict[bytes, None] = {}  # opener keys to put again under a new lease
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def lease(self, deadline: float, count: "_Counter") -> int:
        """The live lease, granted now if there is none (or it has lapsed)."""
        with self._mutex:
            if self._lease_id is not None and time.monotonic() < self._expires_at:
                return self._lease_id
            return self._grant(self.transport, deadline, count)

    def lease_lost(self, lease_id: int) -> None:
        with self._mutex:
            if self._lease_id == lease_id:
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

    def _grant(self, transport: _Transport, deadline: float, count: "_Counter") -> int:
        sent = time.monotonic()
        count.add()
        reply = transport.call("/v3/lease/grant", {"TTL": str(self.config.lease_ttl)}, deadline, idempotent=True)
        lease_id = int(reply["ID"])
        self._lease_ttl = int(reply.get("TTL", self.config.lease_ttl))  # etcd may raise a TTL below its minimum
        self._lease_id = lease_id
        self._expires_at = sent + self._lease_ttl
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
            interval = self._lease_ttl / 3
            with self._mutex:
                lease_id = self._lease_id
            if lease_id is None:
                continue
            sent = time.monotonic()
            try:
                counter.add()
                reply = transport.call(
                    "/v3/lease/keepalive", {"ID": str(lease_id)}, sent + interval, idempotent=True
                )
                ttl = int(reply.get("result", {}).get("TTL", 0))
                with self._mutex:
                    if self._lease_id != lease_id:
                        continue
                    if ttl > 0:
                        self._expires_at = sent + ttl
                    elif self._openers:  # lapsed: put the opener keys back at once
                        self._grant(transport, time.monotonic() + self.config.op_timeout, counter)
                    else:
                        self._lease_id = None  # the next lock grants a new one
            except DbwrapError:
                interval = max(0.05, self._lease_ttl / 10)  # retry sooner while etcd is away
        transport.close()


class _Counter:
    """Adds one to an integer attribute: the round-trip counts."""

    __slots__ = ("owner", "name")

    def __init__(self, owner: object, name: str) -> None:
        self.owner = owner
        self.name = name

    def add(self) -> None:
        setattr(self.owner, self.name, getattr(self.owner, self.name) + 1)


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


# -- the adapter ------------------------------------------------------------


class _Transaction:
    def __init__(self, revision: int) -> None:
        self.revision = revision  # create_revision of our transaction lock key
        self.writes: dict[bytes, bytes | None] = {}  # None: delete


class EtcdAdapter(Adapter):
    """One Samba database in an etcd cluster (see the module docstring)."""

    capabilities = Capabilities(
        transactions=True,
        multi_process=True,
        lock_release_seconds=DEFAULT_LEASE_TTL + LESSOR_TICK,
        max_value_size=MAX_VALUE_SIZE,
        notes=(
            "record locks live on a lease: a dead holder's locks go after lease_ttl, not at once",
            "a transaction writes at most etcd's --max-txn-ops records (128 by default)",
            "lock_release_seconds is for the default lease_ttl; declared_capabilities(options) "
            "and an open adapter's capabilities give it for the configured one",
        ),
    )
    option_names = (
        "endpoints",
        "prefix",
        "lease_ttl",
        "op_timeout",
        "page_size",
        "ca_file",
        "cert_file",
        "key_file",
        "user",
        "password",
    )

    def __init__(self, spec: DatabaseSpec, options: Options) -> None:
        super().__init__(spec, options)
        self.config = _Config.from_options(options)
        self.page_size = options.get_int("page_size", DEFAULT_PAGE_SIZE, minimum=1)
        prefix = options.get_str("prefix", DEFAULT_PREFIX).strip("/")
        if not prefix:
            raise ConfigError("option prefix must not be empty")
        self.capabilities = self.declared_capabilities(options)
        digest = hashlib.blake2b(spec.name.encode(), digest_size=8).hexdigest()
        self.base = f"{prefix}/{spec.basename}@{digest}/".encode()
        self._data = self.base + b"d/"
        self._data_end = _prefix_end(self._data)
        self._locks_prefix = self.base + b"l/"
        self._txn_key = self.base + b"t"
        self._seq_key = self.base + b"s"
        self._openers_prefix = self.base + b"o/"
        #: requests this adapter sent (the keepalive thread's are in the session)
        self.round_trips = 0
        self._count = _Counter(self, "round_trips")
        self._pid = -1
        self._session: _Session | None = None
        self._owner = b""
        self._opener_key: bytes | None = None
        self._held: dict[bytes, int] = {}  # key -> create_revision of our lock key; 0: lost
        self._txn: _Transaction | None = None
        self._closed = False
        if not spec.persistent:
            self._process()  # a volatile database may need wiping now, before anyone reads it

    # -- the process we run in ----------------------------------------------

    def _process(self) -> _Session:
        """This process's session; the first call in a process sets it up."""
        session = self._session
        if session is not None and self._pid == os.getpid():
            return session
        if self._closed:
            raise Unavailable("the database is closed")
        self._pid = os.getpid()
        session = self._session = _session_for(self.config)
        session.users += 1
        self._owner = f"{socket.gethostname()}:{self._pid}:{uuid.uuid4().hex[:12]}".encode()
        if not self.spec.persistent:
            self._register_opener(session)
        return session

    def _register_opener(self, session: _Session) -> None:
        """Put our opener key; wipe first if nobody else has the database open."""
        key = self._openers_prefix + self._owner
        deadline = self._deadline()
        lease_id = session.lease(deadline, self._count)
        put_opener = {"request_put": {"key": _b64(key), "lease": str(lease_id)}}
        self._txn_call(
            {
                "compare": [self._compare_create(self._openers_prefix, 0, range_end=_prefix_end(self._openers_prefix))],
                "success": [self._delete_range_op(), self._bump_op(), put_opener],
                "failure": [put_opener],
            },
            deadline,
            idempotent=True,
        )
        self._opener_key = key
        session.add_opener(key)

    def _deadline(self) -> float:
        return time.monotonic() + self.config.op_timeout

    def _call(self, path: str, body: Mapping[str, Any], deadline: float, idempotent: bool) -> dict[str, Any]:
        session = self._process()
        self.round_trips += 1
        return session.transport.call(path, body, deadline, idempotent)

    def _txn_call(self, body: Mapping[str, Any], deadline: float, idempotent: bool) -> dict[str, Any]:
        return self._call("/v3/kv/txn", body, deadline, idempotent)

    # -- request pieces -------------------------------------------------------

    @staticmethod
    def _compare_create(key: bytes, revision: int, range_end: bytes | None = None) -> dict[str, Any]:
        compare = {"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": str(revision)}
        if range_end is not None:
            compare["range_end"] = _b64(range_end)
        return compare

    def _bump_op(self) -> dict[str, Any]:
        return {"request_put": {"key": _b64(self._seq_key)}}

    def _delete_range_op(self) -> dict[str, Any]:
        return {"request_delete_range": {"key": _b64(self._data), "range_end": _b64(self._data_end)}}

    def _range_op(self, key: bytes) -> dict[str, Any]:
        return {"request_range": {"key": _b64(key)}}

    @staticmethod
    def _first_value(response: Mapping[str, Any]) -> bytes | None:
        kvs = response.get("response_range", {}).get("kvs")
        return _unb64(kvs[0].get("value")) if kvs else None

    # -- records ------------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        txn = self._txn
        if txn is not None and key in txn.writes:
            return txn.writes[key]
        reply = self._call("/v3/kv/range", {"key": _b64(self._data + key)}, self._deadline(), idempotent=True)
        kvs = reply.get("kvs")
        return _unb64(kvs[0].get("value")) if kvs else None

    def exists(self, key: bytes) -> bool:
        txn = self._txn
        if txn is not None and key in txn.writes:
            return txn.writes[key] is not None
        body = {"key": _b64(self._data + key), "count_only": True}
        reply = self._call("/v3/kv/range", body, self._deadline(), idempotent=True)
        return int(reply.get("count", 0)) > 0

    def lock(self, key: bytes) -> None:
        self._acquire(key, read=False)

    def lock_get(self, key: bytes) -> bytes | None:
        return self._acquire(key, read=True)

    def unlock(self, key: bytes) -> None:
        revision = self._held.pop(key, 0)
        if revision <= 0:
            return  # taken under our transaction lock, or already lost
        lock_key = self._locks_prefix + key
        try:
            self._txn_call(
                {
                    "compare": [self._compare_create(lock_key, revision)],
                    "success": [{"request_delete_range": {"key": _b64(lock_key)}}],
                },
                self._deadline(),
                idempotent=True,  # a repeat finds the key gone: the same outcome
            )
        except (Timeout, Unavailable):
            pass  # the lease takes the lock key with it; nothing to undo

    def put(self, key: bytes, value: bytes) -> None:
        if self._txn is not None:
            self._txn.writes[key] = bytes(value)
            return
        self._fenced_write(key, [{"request_put": {"key": _b64(self._data + key), "value": _b64(value)}}])

    def remove(self, key: bytes) -> bool:
        if self._txn is not None:
            existed = self.exists(key)
            self._txn.writes[key] = None
            return existed
        reply = self._fenced_write(
            key, [{"request_delete_range": {"key": _b64(self._data + key)}}], idempotent=False
        )
        return int(reply["responses"][0]["response_delete_range"].get("deleted", 0)) > 0

    def put_unlock(self, key: bytes, value: bytes) -> None:
        if self._txn is not None or self._held.get(key, 0) <= 0:
            try:
                self.put(key, value)
            finally:
                self.unlock(key)
            return
        revision = self._held.pop(key)
        lock_key = self._locks_prefix + key
        reply = self._txn_call(
            {
                "compare": [self._compare_create(lock_key, revision)],
                "success": [
                    {"request_put": {"key": _b64(self._data + key), "value": _b64(value)}},
                    self._bump_op(),
                    {"request_delete_range": {"key": _b64(lock_key)}},
                ],
            },
            self._deadline(),
            idempotent=False,  # a repeat after success would see the lock gone and report FencedOut
        )
        if not reply.get("succeeded"):
            raise FencedOut(f"lost the lock on {key!r} (lease expired) before writing it")

    def _fenced_write(
        self, key: bytes, ops: list[dict[str, Any]], idempotent: bool = True
    ) -> dict[str, Any]:
        """Run ``ops`` plus the seqnum bump iff our lock on ``key`` is still the one we took."""
        revision = self._held.get(key)
        if revision is None:
            raise LockConflict(f"write to {key!r} without holding its record lock")
        if revision <= 0:
            raise FencedOut(f"lost the lock on {key!r} (lease expired)")
        reply = self._txn_call(
            {
                "compare": [self._compare_create(self._locks_prefix + key, revision)],
                "success": [*ops, self._bump_op()],
            },
            self._deadline(),
            idempotent,
        )
        if not reply.get("succeeded"):
            self._held[key] = 0
            raise FencedOut(f"lost the lock on {key!r} (lease expired) before writing it")
        return reply

    def _acquire(self, key: bytes, read: bool) -> bytes | None:
        """Create our lock key (and read the record) in one txn; wait while others hold it."""
        if self._txn is not None:
            # our transaction lock already excludes every other writer
            self._held[key] = -1
            return self.get(key) if read else None
        session = self._process()
        lock_key = self._locks_prefix + key
        deadline = self._deadline()
        while True:
            lease_id = session.lease(deadline, self._count)
            compare = [self._compare_create(lock_key, 0)]
            failure = [self._range_op(lock_key)]
            if self.spec.persistent:  # a running transaction excludes record lockers
                compare.append(self._compare_create(self._txn_key, 0))
                failure.append(self._range_op(self._txn_key))
            success: list[dict[str, Any]] = [
                {"request_put": {"key": _b64(lock_key), "value": _b64(self._owner), "lease": str(lease_id)}}
            ]
            if read:
                success.append(self._range_op(self._data + key))
            try:
                # a repeated request finds our own owner value: see below
                reply = self._txn_call({"compare": compare, "success": success, "failure": failure}, deadline, True)
            except _LeaseGone:
                session.lease_lost(lease_id)
                continue
            responses = reply.get("responses", [])
            if reply.get("succeeded"):
                self._held[key] = int(responses[0]["response_put"]["header"]["revision"])
                return self._first_value(responses[1]) if read else None
            holder = responses[0].get("response_range", {}).get("kvs")
            if holder and _unb64(holder[0].get("value")) == self._owner:
                # our earlier attempt was applied but its reply was lost
                self._held[key] = int(holder[0]["create_revision"])
                try:
                    return self.get(key) if read else None
                except BaseException:
                    self.unlock(key)
                    raise
            blocker = lock_key if holder else self._txn_key
            self._wait_deleted(blocker, int(reply["header"]["revision"]) + 1, deadline)
            if time.monotonic() >= deadline:
                raise Timeout(f"record lock on {key!r} not granted within {self.config.op_timeout:g} s")

    def _wait_deleted(self, key: bytes, start_revision: int, deadline: float) -> None:
        """Return when ``key`` is deleted at or after ``start_revision``, or at ``deadline``."""
        session = self._process()
        body = {"create_request": {"key": _b64(key), "start_revision": str(start_revision), "filters": ["NOPUT"]}}
        self.round_trips += 1
        try:
            conn = session.transport.open_stream("/v3/watch", body, deadline)
        except OSError:
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
        except (OSError, ValueError):
            return
        finally:
            conn.close()

    # -- scans --------------------------------------------------------------

    def scan(self) -> Iterator[tuple[bytes, bytes]]:
        txn = self._txn
        if txn is None:
            yield from self._scan_etcd()
            return
        pending = dict(txn.writes)
        for key, value in self._scan_etcd():
            if key in pending:
                newer = pending.pop(key)
                if newer is not None:
                    yield key, newer
            else:
                yield key, value
        for key, newer in pending.items():
            if newer is not None:
                yield key, newer

    def _scan_etcd(self) -> Iterator[tuple[bytes, bytes]]:
        """Paged range reads pinned to the first page's revision.

        Should compaction overtake a long scan, it goes on from the last key
        at the current revision: like a tdb traverse, it then sees concurrent
        writes, but still every key once.
        """
        start = self._data
        revision = 0
        skip = len(self._data)
        while True:
            body: dict[str, Any] = {
                "key": _b64(start),
                "range_end": _b64(self._data_end),
                "limit": str(self.page_size),
            }
            if revision:
                body["revision"] = str(revision)
            try:
                reply = self._call("/v3/kv/range", body, self._deadline(), idempotent=True)
            except _Compacted:
                revision = 0
                continue
            if not revision:
                revision = int(reply["header"]["revision"])
            kvs = reply.get("kvs", [])
            for kv in kvs:
                key = _unb64(kv["key"])
                yield key[skip:], _unb64(kv.get("value"))
            if not reply.get("more") or not kvs:
                return
            start = _unb64(kvs[-1]["key"]) + b"\0"

    # -- database-wide ------------------------------------------------------

    def seqnum(self) -> int:
        reply = self._call("/v3/kv/range", {"key": _b64(self._seq_key)}, self._deadline(), idempotent=True)
        kvs = reply.get("kvs")
        return int(kvs[0]["mod_revision"]) if kvs else 0

    def wipe(self) -> None:
        if self._txn is not None:
            for key, _ in list(self.scan()):
                self._txn.writes[key] = None
            return
        self._txn_call({"success": [self._delete_range_op(), self._bump_op()]}, self._deadline(), idempotent=True)

    def check(self) -> None:
        """Every record readable, and every lock key on a lease (else it would never go)."""
        for _ in self._scan_etcd():
            pass
        for prefix in (self._locks_prefix, self._openers_prefix):
            body = {"key": _b64(prefix), "range_end": _b64(_prefix_end(prefix)), "keys_only": True}
            reply = self._call("/v3/kv/range", body, self._deadline(), idempotent=True)
            for kv in reply.get("kvs", []):
                if int(kv.get("lease", 0)) == 0:
                    raise Corruption(f"{_unb64(kv['key'])!r} has no lease and would never be released")

    def db_id(self) -> bytes:
        return self.base

    # -- transactions -------------------------------------------------------

    def transaction_start(self, nonblock: bool = False) -> None:
        if self._txn is not None:
            raise NotSupported("a transaction is already running")
        session = self._process()
        deadline = self._deadline()
        while True:
            lease_id = session.lease(deadline, self._count)
            put = {"request_put": {"key": _b64(self._txn_key), "value": _b64(self._owner), "lease": str(lease_id)}}
            try:
                reply = self._txn_call(
                    {
                        "compare": [self._compare_create(self._txn_key, 0)],
                        "success": [put],
                        "failure": [self._range_op(self._txn_key)],
                    },
                    deadline,
                    idempotent=True,
                )
            except _LeaseGone:
                session.lease_lost(lease_id)
                continue
            responses = reply.get("responses", [])
            if reply.get("succeeded"):
                revision = int(responses[0]["response_put"]["header"]["revision"])
                break
            holder = responses[0].get("response_range", {}).get("kvs")
            if holder and _unb64(holder[0].get("value")) == self._owner:
                revision = int(holder[0]["create_revision"])  # our repeated request
                break
            if nonblock:
                raise LockConflict("another process holds the transaction lock")
            self._wait_deleted(self._txn_key, int(reply["header"]["revision"]) + 1, deadline)
            if time.monotonic() >= deadline:
                raise Timeout(f"transaction lock not granted within {self.config.op_timeout:g} s")
        try:
            self._wait_for_record_lockers(deadline, nonblock)
        except BaseException:
            self._release_txn_lock(revision)
            raise
        self._txn = _Transaction(revision)

    def _wait_for_record_lockers(self, deadline: float, nonblock: bool) -> None:
        """Wait until no other process holds a record lock (none can take one now)."""
        body = {"key": _b64(self._locks_prefix), "range_end": _b64(_prefix_end(self._locks_prefix))}
        pause = 0.001
        while True:
            reply = self._call("/v3/kv/range", body, deadline, idempotent=True)
            if all(_unb64(kv.get("value")) == self._owner for kv in reply.get("kvs", [])):
                return
            if nonblock:
                raise LockConflict("other processes hold record locks")
            if time.monotonic() + pause >= deadline:
                raise Timeout(f"record locks still held after {self.config.op_timeout:g} s")
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def transaction_commit(self) -> None:
        txn = self._txn
        if txn is None:
            raise NotSupported("transaction_commit without a transaction")
        self._txn = None
        ops: list[dict[str, Any]] = []
        for key, value in txn.writes.items():
            data_key = _b64(self._data + key)
            if value is None:
                ops.append({"request_delete_range": {"key": data_key}})
            else:
                ops.append({"request_put": {"key": data_key, "value": _b64(value)}})
        if ops:
            ops.append(self._bump_op())
        ops.append({"request_delete_range": {"key": _b64(self._txn_key)}})
        try:
            reply = self._txn_call(
                {"compare": [self._compare_create(self._txn_key, txn.revision)], "success": ops},
                self._deadline(),
                idempotent=False,
            )
        except BaseException:
            self._release_txn_lock(txn.revision)
            raise
        if not reply.get("succeeded"):
            raise FencedOut("lost the transaction lock (lease expired) before commit; nothing was written")

    def transaction_cancel(self) -> None:
        txn = self._txn
        if txn is None:
            raise NotSupported("transaction_cancel without a transaction")
        self._txn = None
        self._release_txn_lock(txn.revision)

    def _release_txn_lock(self, revision: int) -> None:
        try:
            self._txn_call(
                {
                    "compare": [self._compare_create(self._txn_key, revision)],
                    "success": [{"request_delete_range": {"key": _b64(self._txn_key)}}],
                },
                self._deadline(),
                idempotent=True,
            )
        except (Timeout, Unavailable):
            pass  # the lease takes it

    # -- process lifecycle --------------------------------------------------

    def after_fork(self) -> None:
        # Locks, the transaction and the connection belong to the parent.
        self._session = None
        self._pid = -1
        self._held.clear()
        self._txn = None
        self._opener_key = None

    def close(self) -> None:
        if self._closed:
            return
        session = self._session if self._pid == os.getpid() else None
        if session is not None:
            try:
                if self._opener_key is not None:
                    session.remove_opener(self._opener_key)
                    self._call("/v3/kv/deleterange", {"key": _b64(self._opener_key)}, self._deadline(), True)
            except DbwrapError:
                pass  # the lease takes it
            session.users -= 1
            if session.users <= 0:
                session.close()
                if _sessions.get(self.config) is session:
                    del _sessions[self.config]
        self._closed = True
        self._session = None

    # -- for the conformance suite and the benchmarks -------------------------

    @classmethod
    def declared_capabilities(cls, options: Mapping[str, str]) -> Capabilities:
        """lock_release_seconds follows the configured lease_ttl."""
        ttl = Options(dict(options)).get_int("lease_ttl", DEFAULT_LEASE_TTL, minimum=1)
        return dataclasses.replace(cls.capabilities, lock_release_seconds=ttl + LESSOR_TICK)

    @classmethod
    def throwaway_server(cls, options: Mapping[str, str]) -> AbstractContextManager[dict[str, str]] | None:
        if options.get("endpoints"):
            return None
        return _throwaway_etcd()


@contextmanager
def _throwaway_etcd() -> Iterator[dict[str, str]]:
    from dbwrap_py.servers.etcd import EtcdCluster

    with EtcdCluster(nodes=1) as cluster:
        yield {"endpoints": cluster.endpoints}


ADAPTER = EtcdAdapter
