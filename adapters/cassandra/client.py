"""What the cassandra adapter needs of the DataStax Python driver: one
session per process, statements prepared once, errors mapped, and LWTs whose
outcome is reported as known or unknown, never guessed.

Session: a ``Cluster`` and its ``Session`` are made on first use in each
process, keyed by the connection settings, in ``dbwrap_py.sessions``'s
per-process registry. A forked child never touches its parent's (the
driver's reactor thread is not in the child, so a request on it would wait
forever): the registry drops them in the child, which makes its own.

Unknown outcomes: an LWT that times out at the coordinator (WriteTimeout
with write type CAS), that Cassandra reports as "CAS operation result is
unknown" (protocol v5 error 0x1700, which this driver does not name), or
that the driver gave up waiting for (OperationTimedOut, the request was
sent) may or may not have been applied. ``Client.lwt`` raises
``OutcomeUnknown`` for them; the adapter reads the row back at SERIAL
consistency, which finishes any Paxos round in flight, and decides from
what it finds.

The leading underscore keeps the registry from listing this as an adapter;
adapters/cassandra/adapter.py is its only user.
"""

from __future__ import annotations

import dataclasses
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from dbwrap_py.errors import AccessDenied, ConfigError, DbwrapError, InvalidParameter, Timeout, Unavailable
from dbwrap_py.options import PASSWORD_OPTIONS, Option, Options, password_of
from dbwrap_py.retry import Backoff
from dbwrap_py.sessions import Sessions

#: Cassandra's native protocol port
DEFAULT_PORT = 9042
#: the protocol version Cassandra 5.0 speaks; naming it avoids the driver's downgrade dance
PROTOCOL_VERSION = 5
#: seconds a write's receipt outlives it: well past the SERIAL read that resolves its outcome
RECEIPT_TTL = 300
#: rows per page when reading a whole database
PAGE_ROWS = 1000
#: error code of "CAS operation result is unknown" (native protocol v5, CAS_WRITE_UNKNOWN)
CAS_WRITE_UNKNOWN = 0x1700
CONSISTENCIES = ("ANY", "ONE", "TWO", "THREE", "QUORUM", "ALL", "LOCAL_QUORUM", "EACH_QUORUM",
                 "LOCAL_ONE")
SERIAL_CONSISTENCIES = ("SERIAL", "LOCAL_SERIAL")
#: the options ClientConfig reads (the adapter's and the node agent's)
CLIENT_OPTIONS = (
    Option("contact_points", list, ["127.0.0.1"], help="HOST or HOST:PORT, comma or space separated"),
    Option("keyspace", str, "dbwrap_py", help="letters, digits and _, at most 48"),
    Option("replication_factor", int, 1, minimum=1, help="the keyspace's, when this creates it"),
    Option("consistency", str, "QUORUM", help="the consistency of reads and plain writes"),
    Option("serial_consistency", str, "SERIAL", help="SERIAL or LOCAL_SERIAL"),
    Option("user", str, "", help="the Cassandra user (with a password)"),
    *PASSWORD_OPTIONS,
    Option("tls_ca", str, "", help="CA certificate file (TLS)"),
    Option("tls_cert", str, "", help="client certificate file (TLS)"),
    Option("tls_key", str, "", help="client key file (TLS, with tls_cert)"),
    Option("tls_check_hostname", bool, True, help="no: check only the CA, not the name"),
    Option("dialect", str, None, help="cassandra or scylla (default: the adapter's)"),
)
OPTION_NAMES = tuple(option.name for option in CLIENT_OPTIONS)
#: cassandra: cassandra-driver; scylla: scylla-driver (shard-aware), ScyllaDB's LWT rules when the server is one
DIALECTS = ("cassandra", "scylla")
#: between two tries of an LWT that lost its Paxos round to contention: clients
#: retrying in step keep one Paxos instance contended, the holder's release
#: included (measured: 8 openers on 3 nodes timed out at a fixed 20 ms)
CONTENDED = Backoff(first=0.01, cap=0.25)


def stored_key(key: bytes) -> bytes:
    """The stored key: a blob key may not be empty in Cassandra, a Samba key may."""
    return b"/" + key


class OutcomeUnknown(DbwrapError):
    """An LWT that may or may not have been applied; the caller reads back."""


@dataclasses.dataclass(frozen=True)
class ClientConfig:
    """What identifies a connection; one session per process per config.

    TLS files are read when the database is opened: smbd's children run as
    the user they serve and may not be able to read them later.
    """

    contact_points: tuple[tuple[str, int], ...]
    keyspace: str
    replication_factor: int
    consistency: str
    serial_consistency: str
    op_timeout: float
    dialect: str = "cassandra"
    user: str = ""
    password: str = dataclasses.field(default="", repr=False)
    tls: ssl.SSLContext | None = dataclasses.field(default=None, compare=False, repr=False)

    @classmethod
    def from_options(cls, options: Options, op_timeout: float, dialect: str = "cassandra") -> "ClientConfig":
        options, points = Options(dict(options), CLIENT_OPTIONS), []
        for point in options.value("contact_points"):
            host, _, port = point.strip().rpartition(":") if ":" in point else (point.strip(), "", "")
            try:
                points.append((host or point.strip(), int(port) if port else DEFAULT_PORT))
            except ValueError:
                raise ConfigError(f"contact_points: {point!r} is not HOST or HOST:PORT") from None
        keyspace = options.value("keyspace")
        if not keyspace.replace("_", "").isalnum() or len(keyspace) > 48:
            raise ConfigError(f"keyspace = {keyspace!r}: letters, digits and _, at most 48")
        consistency = options.value("consistency").upper()
        if consistency not in CONSISTENCIES:
            raise ConfigError(f"consistency = {consistency!r}: one of {', '.join(CONSISTENCIES)}")
        serial = options.value("serial_consistency").upper()
        if serial not in SERIAL_CONSISTENCIES:
            raise ConfigError(f"serial_consistency = {serial!r}: SERIAL or LOCAL_SERIAL")
        dialect = (dialect if options.value("dialect") is None else options.value("dialect")).lower()
        if dialect not in DIALECTS:
            raise ConfigError(f"dialect = {dialect!r}: cassandra or scylla")
        if dialect == "scylla" and not scylla_driver():
            raise ConfigError("dialect = scylla needs scylla-driver, which cannot share a venv with "
                              "cassandra-driver: use .venv-scylla (make venv-scylla)")
        tls = _tls_context(options)
        user, password = options.value("user"), password_of(options, tls=tls is not None)
        if bool(user) != bool(password):
            raise ConfigError("give user and password (or password_file) together")
        return cls(tuple(points), keyspace, options.value("replication_factor"),
                   consistency, serial, op_timeout, dialect, user, password, tls)


def scylla_driver() -> bool:
    """Is the installed ``cassandra`` package scylla-driver (both install it)?"""
    from cassandra.cluster import Cluster

    return hasattr(Cluster, "is_shard_aware")


def _tls_context(options: Options) -> ssl.SSLContext | None:
    ca, cert, key = (options.value(name) for name in ("tls_ca", "tls_cert", "tls_key"))
    if not (ca or cert):
        return None
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca or None)
        if cert:
            context.load_cert_chain(cert, key or None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"TLS: {exc}") from exc
    # the server's certificate must name the contact point (an address needs
    # an IP SAN); tls_check_hostname = no keeps only the CA check
    context.check_hostname = options.value("tls_check_hostname")
    return context


def mapped(exc: Exception, what: str) -> DbwrapError:
    """A driver exception as the framework's typed exception."""
    from cassandra import AuthenticationFailed, InvalidRequest, OperationTimedOut, Unauthorized
    from cassandra import Timeout as ServerTimeout
    from cassandra import Unavailable as ServerUnavailable
    from cassandra.cluster import NoHostAvailable

    if isinstance(exc, DbwrapError):
        return exc
    if isinstance(exc, (OperationTimedOut, ServerTimeout)):
        return Timeout(f"{what}: {type(exc).__name__}: {exc}")
    if isinstance(exc, (Unauthorized, AuthenticationFailed)):
        return AccessDenied(f"{what}: {exc}")
    if isinstance(exc, NoHostAvailable):
        causes = "; ".join(f"{host}: {cause}" for host, cause in exc.errors.items()) or str(exc)
        if any(isinstance(c, AuthenticationFailed) for c in exc.errors.values()):
            return AccessDenied(f"{what}: {causes}")
        return Unavailable(f"{what}: no Cassandra node answered ({causes})")
    if isinstance(exc, ServerUnavailable):
        return Unavailable(f"{what}: too few replicas alive ({exc})")
    if isinstance(exc, InvalidRequest):
        return InvalidParameter(f"{what}: Cassandra refused the statement: {exc}")
    return Unavailable(f"{what}: {type(exc).__name__}: {exc}")


def outcome_unknown(exc: Exception) -> bool:
    """The LWT may have been applied: see the module docstring."""
    from cassandra import OperationTimedOut, WriteTimeout
    from cassandra.policies import WriteType
    from cassandra.protocol import ErrorMessage

    if isinstance(exc, WriteTimeout):
        return exc.write_type in (WriteType.CAS, "CAS")
    if isinstance(exc, ErrorMessage):
        return getattr(exc, "code", None) == CAS_WRITE_UNKNOWN or "result is unknown" in str(exc)
    return isinstance(exc, OperationTimedOut)


class _Session:
    """One process's Cluster and Session for one config, and its prepared statements."""

    def __init__(self, config: ClientConfig) -> None:
        from cassandra import ConsistencyLevel
        from cassandra.auth import PlainTextAuthProvider
        from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
        from cassandra.policies import RoundRobinPolicy, TokenAwarePolicy

        profile = ExecutionProfile(
            load_balancing_policy=TokenAwarePolicy(RoundRobinPolicy()),
            consistency_level=getattr(ConsistencyLevel, config.consistency),
            serial_consistency_level=getattr(ConsistencyLevel, config.serial_consistency),
            request_timeout=config.op_timeout)
        self.cluster = Cluster(
            contact_points=[host for host, _ in config.contact_points], port=config.contact_points[0][1],
            protocol_version=PROTOCOL_VERSION, execution_profiles={EXEC_PROFILE_DEFAULT: profile},
            auth_provider=PlainTextAuthProvider(config.user, config.password) if config.user else None,
            ssl_context=config.tls, connect_timeout=max(config.op_timeout, 1.0),
            control_connection_timeout=max(config.op_timeout, 1.0),
            schema_metadata_enabled=False)  # smbd's children need token routing, not the schema
        self.session = self.cluster.connect()
        #: only scylla-driver on a ScyllaDB server learns the server's shards
        self.scylla_server = config.dialect == "scylla" and bool(self.cluster.is_shard_aware())
        self.serial = getattr(ConsistencyLevel, config.serial_consistency)
        self._prepared: dict[str, Any] = {}
        self._lock = threading.Lock()

    def prepared(self, cql: str) -> Any:
        statement = self._prepared.get(cql)
        if statement is None:
            with self._lock:
                statement = self._prepared.get(cql) or self.session.prepare(cql)
                self._prepared[cql] = statement
        return statement


_SESSIONS: Sessions[_Session] = Sessions("cassandra")


def session_for(config: ClientConfig) -> _Session:
    """This process's session for ``config``; a parent's is dropped unused."""
    return _SESSIONS.client_for(config, lambda: _connect(config))


def _connect(config: ClientConfig) -> _Session:
    try:
        return _Session(config)
    except Exception as exc:
        raise mapped(exc, "connect") from exc


class Client:
    """One open database's statements on its process's session, counted."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self.round_trips = 0  # requests this client waited for, one at a time or together
        self.requests = 0
        #: tests only: called with a statement's name before it is sent; it may
        #: raise (the request never left) or return True to raise OutcomeUnknown
        #: after it was applied
        self.fault: Callable[[str], bool] | None = None

    @property
    def _session(self) -> _Session:
        return session_for(self.config)

    def _bound(self, cql: str, args: Sequence[Any], serial_read: bool = False) -> Any:
        bound = self._session.prepared(cql).bind(args)
        if serial_read:  # a read at SERIAL: it finishes any Paxos round in flight first
            bound.consistency_level = self._session.serial
        return bound

    def run(self, what: str, cql: str, args: Sequence[Any] = (), serial: bool = False,
            idempotent: bool = True) -> list[Any]:
        """A statement's rows (all pages); ``serial``: read at serial
        consistency. A server-side timeout of an idempotent statement (a busy
        replica) is tried again until op_timeout."""
        from cassandra import Timeout as ServerTimeout

        deadline = time.monotonic() + self.config.op_timeout
        while True:
            self.round_trips += 1
            self.requests += 1
            left = max(deadline - time.monotonic(), 0.001)
            try:
                return list(self._session.session.execute(self._bound(cql, args, serial), timeout=left))
            except ServerTimeout as exc:
                if not idempotent or time.monotonic() >= deadline - 0.01:
                    raise mapped(exc, what) from exc
            except Exception as exc:
                raise mapped(exc, what) from exc

    def pages(self, what: str, cql: str, args: Sequence[Any] = ()) -> list[Any]:
        """Every row, read a page at a time (each page a round trip)."""
        statement = self._bound(cql, args)
        statement.fetch_size = PAGE_ROWS
        try:
            result = self._session.session.execute(statement)
            rows, pages = list(result.current_rows), 1
            while result.has_more_pages:
                result.fetch_next_page()
                rows.extend(result.current_rows)
                pages += 1
        except Exception as exc:
            raise mapped(exc, what) from exc
        self.round_trips += pages
        self.requests += pages
        return rows

    def lwt(self, what: str, cql: str, args: Sequence[Any], timeout: float | None = None) -> tuple[bool, Any]:
        """A conditional statement: (applied, the row it returned). Raises
        OutcomeUnknown when it may or may not have been applied (also when
        no answer came within ``timeout``, default op_timeout)."""
        return self._conditional(what, lambda: self._bound(cql, args), timeout)

    def applied(self, what: str, cql: str, args: Sequence[Any], unknown: Callable[[], bool]) -> bool:
        """Whether a conditional statement was applied; when its outcome is
        unknown, ``unknown()`` says (a read at SERIAL, or a lock's TTL ends it)."""
        try:
            return self.lwt(what, cql, args)[0]
        except OutcomeUnknown:
            return unknown()

    def batch(self, what: str, statements: Sequence[tuple[str, Sequence[Any]]]) -> tuple[bool, Any]:
        """A conditional single-partition batch: (applied, the row returned)."""
        from cassandra.query import BatchStatement, BatchType

        def build() -> Any:
            batch = BatchStatement(batch_type=BatchType.LOGGED)
            for cql, args in statements:
                batch.add(self._session.prepared(cql), args)
            return batch

        return self._conditional(what, build)

    def _conditional(self, what: str, build: Callable[[], Any], timeout: float | None = None) -> tuple[bool, Any]:
        self.round_trips += 1
        self.requests += 1
        apply_then_fail = self.fault(what) if self.fault is not None else False
        try:
            row = self._session.session.execute(build(), **({"timeout": timeout} if timeout else {})).one()
        except Exception as exc:
            if outcome_unknown(exc):
                raise OutcomeUnknown(f"{what}: {type(exc).__name__}: {exc}") from exc
            raise mapped(exc, what) from exc
        if apply_then_fail:
            raise OutcomeUnknown(f"{what}: injected after it was applied")
        return bool(row[0]), row


#: seconds a schema statement may take at least, whatever op_timeout: a
#: schema change waits for the replicas to agree, and took over 1 s on a
#: loaded 2-core machine (CI: an op_timeout=1 open failed in CREATE TABLE)
SCHEMA_TIMEOUT = 10.0


def ensure_schema(config: ClientConfig, statements: Sequence[str], done: set[ClientConfig],
                  added: Sequence[tuple[str, str, str]] = ()) -> None:
    """The keyspace and tables, once per process per config (IF NOT EXISTS),
    then each column of ``added`` ((table, column, CQL type): one a later
    release added to a table an earlier one made) that the table lacks."""
    if config in done:
        return
    session = session_for(config).session
    timeout = max(config.op_timeout, SCHEMA_TIMEOUT)
    replication = f"{{'class': 'SimpleStrategy', 'replication_factor': {config.replication_factor}}}"
    if session_for(config).scylla_server:  # ScyllaDB refuses LWTs in a keyspace with tablets
        replication += " AND tablets = {'enabled': false}"
    try:
        session.execute(f"CREATE KEYSPACE IF NOT EXISTS {config.keyspace} WITH replication = {replication}",
                        timeout=timeout)
        for cql in statements:
            session.execute(cql.format(ks=config.keyspace), timeout=timeout)
        for table, column, cql_type in added:
            _add_column(session, config.keyspace, table, column, cql_type, timeout)
    except Exception as exc:
        raise mapped(exc, "schema") from exc
    done.add(config)


def _columns(session: Any, keyspace: str, table: str, timeout: float) -> set[str]:
    rows = session.execute("SELECT column_name FROM system_schema.columns "
                           "WHERE keyspace_name = %s AND table_name = %s", (keyspace, table), timeout=timeout)
    return {row.column_name for row in rows}


def _add_column(session: Any, keyspace: str, table: str, column: str, cql_type: str, timeout: float) -> None:
    """ALTER TABLE ... ADD unless the column is there; another process
    adding it at the same moment is not an error (CQL has no ADD IF NOT
    EXISTS before Cassandra 5.0, nor in ScyllaDB)."""
    if column in _columns(session, keyspace, table, timeout):
        return
    try:
        session.execute(f"ALTER TABLE {keyspace}.{table} ADD {column} {cql_type}", timeout=timeout)
    except Exception:
        if column not in _columns(session, keyspace, table, timeout):
            raise


def close_all() -> None:
    """Shut down this process's sessions (tests; smbd's processes just exit)."""
    _SESSIONS.close_all(lambda found: found.cluster.shutdown())

