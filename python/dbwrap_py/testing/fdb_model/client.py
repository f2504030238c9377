"""The client of the model of FoundationDB: the subset of the real ``fdb``
package's API (PyPI ``foundationdb``) that the fdb adapter uses, with the
same names, signatures and error codes, talking to ``server`` instead of a
cluster. A model, not FoundationDB.

What it does as the real client does:

* ``api_version(N)`` once per process, then ``open(cluster_file)`` starts the
  "network", a per-process singleton. A child forked after that cannot use
  it: every call there fails with 2008 network_not_setup (the real client
  would hang: its network thread does not survive fork).
* Transactions read at one read version, read their own writes, track
  read- and write-conflict ranges (``snapshot`` reads add none) and commit
  optimistically; ``on_error`` retries the retryable codes with backoff, up
  to the retry limit, and re-raises the rest; ``transactional`` is the same
  retry loop as a decorator.
* Limits: keys over 10,000 bytes raise 2102 key_too_large and values over
  100,000 bytes 2103 value_too_large (at set time), a commit over
  10,000,000 bytes 2101 transaction_too_large; the transaction timeout
  option gives 1031 transaction_timed_out.
* ``watch`` returns a future that becomes ready when the key's value changes
  after the transaction commits.

The cluster file names the server: its content is ``<description>@unix:<socket path>``
or ``<description>@tcp:<IPv4 address>:<port>`` (``_wire.parse_cluster_text``);
anything else fails with 2104 connection_string_invalid naming the file.
Every connection is a unix socket or TCP with TCP_NODELAY (``_wire.connect``).
"""

from __future__ import annotations

import functools
import inspect
import io
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from dbwrap_py.testing.fdb_model import _wire
from dbwrap_py.testing.fdb_model.server import _add_le

LATEST_API_VERSION = 730
KEY_SIZE_LIMIT = 10_000
VALUE_SIZE_LIMIT = 100_000
TRANSACTION_SIZE_LIMIT = 10_000_000

_DESCRIPTIONS = {
    1007: "Transaction is too old to perform reads or be committed",
    1020: "Transaction not committed due to conflict with another transaction",
    1021: "Transaction may or may not have committed",
    1025: "Operation aborted because the transaction was cancelled",
    1031: "Operation aborted because the transaction timed out",
    1101: "Asynchronous operation cancelled",
    2000: "Invalid API call",
    2008: "Network not setup (the FoundationDB model: started in another process before fork)",
    2101: "Transaction exceeds byte limit",
    2102: "Key length exceeds limit",
    2103: "Value length exceeds limit",
    2104: "Connection string invalid",
    2201: "API version may be set only once",
    1100: "Operation failed",
}
#: codes on_error retries: not_committed, transaction_too_old, future_version,
#: commit_unknown_result, process_behind, database_locked, tag_throttled
RETRYABLE = frozenset({1020, 1007, 1009, 1021, 1037, 1038, 1213})
MAYBE_COMMITTED = frozenset({1021})


class FDBError(Exception):
    """An error from FoundationDB (here: from the model), with its ``code``."""

    def __init__(self, code: int, detail: str = "") -> None:
        super().__init__(code)
        self.code = code
        self.description = _DESCRIPTIONS.get(code, "Unknown error")
        #: the model's own addition, e.g. which cluster file was wrong and why
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.description} ({self.code})" + (f": {self.detail}" if self.detail else "")


class _Predicates:
    """``fdb.predicates``: what on_error would do with an error."""

    @staticmethod
    def retryable(error: FDBError) -> bool:
        return error.code in RETRYABLE

    @staticmethod
    def maybe_committed(error: FDBError) -> bool:
        return error.code in MAYBE_COMMITTED

    @staticmethod
    def retryable_not_committed(error: FDBError) -> bool:
        return error.code in RETRYABLE and error.code not in MAYBE_COMMITTED


predicates = _Predicates()


class KeyValue(NamedTuple):
    key: bytes
    value: bytes


# -- the per-process "network" ------------------------------------------------

_api_version: int | None = None
_network_pid: int | None = None
_databases: dict[str, "Database"] = {}
_local = threading.local()


def api_version(version: int) -> None:
    global _api_version
    if _api_version is not None and _api_version != version:
        raise RuntimeError(f"FDB API already loaded at version {_api_version}")
    if version > LATEST_API_VERSION:
        raise RuntimeError(f"Latest known FDB API version is {LATEST_API_VERSION}")
    _api_version = version


def get_api_version() -> int:
    if _api_version is None:
        raise RuntimeError("API version is not set")
    return _api_version


def is_api_version_selected() -> bool:
    return _api_version is not None


def _server_address(cluster_file: str | None) -> _wire.Address:
    """Where the cluster file says the server listens; 2104 (the real
    client's connection_string_invalid) naming the file when it cannot be
    read or is neither form."""
    path = cluster_file or os.environ.get("FDB_CLUSTER_FILE", "")
    try:
        with io.open(path) as f:  # this module's open() is fdb's
            text = f.read()
    except OSError as exc:
        raise FDBError(2104, f"cannot read the cluster file {path!r}: {exc.strerror or exc}") from exc
    try:
        return _wire.parse_cluster_text(text)
    except ValueError as exc:
        raise FDBError(2104, f"the cluster file {path!r} names no model server: {exc}") from None


def open(cluster_file: str | None = None, event_model: object = None) -> "Database":  # noqa: A001 (fdb's name)
    """Start the network on first use in this process, then the database
    (cached per cluster file, as the real ``fdb.open``)."""
    global _network_pid
    if _api_version is None:
        raise RuntimeError("You must call api_version() before using any fdb methods")
    if _network_pid is None:
        _network_pid = os.getpid()
    key = cluster_file or ""
    if key not in _databases:
        _databases[key] = Database(_server_address(cluster_file))
    return _databases[key]


def _check_process() -> None:
    if _network_pid != os.getpid():
        raise FDBError(2008)


def _call(address: _wire.Address, *request: Any) -> Any:
    """One request on this thread's connection to the server (a watch's
    thread has its own, so a blocked watch holds up no other request)."""
    _check_process()
    conn = getattr(_local, "conns", None)
    if conn is None or conn[0] != os.getpid():
        conn = _local.conns = (os.getpid(), {})
    sock = conn[1].get(address)
    if sock is None:
        try:
            sock = conn[1][address] = _wire.connect(address)
        except OSError as exc:  # a real client would keep retrying; tests want an answer
            raise FDBError(1100, f"no model server at {_shown(address)}: {exc}") from exc
    try:
        _wire.send(sock, request)
        status, result = _wire.receive(sock)
    except (OSError, ConnectionError) as exc:
        conn[1].pop(address, None)
        sock.close()
        raise FDBError(1100) from exc
    if status == "err":
        raise FDBError(result)
    return result


def _shown(address: _wire.Address) -> str:
    return address if isinstance(address, str) else f"{address[0]}:{address[1]}"


# -- futures -------------------------------------------------------------------


class Future:
    """A ready-made or background result with the real Future's methods."""

    def __init__(self, value: Any = None, error: BaseException | None = None, ready: bool = True) -> None:
        self._value = value
        self._error = error
        self._ready = threading.Event()
        self._callbacks: list[Callable[["Future"], None]] = []
        self._lock = threading.Lock()
        if ready:
            self._ready.set()

    def _finish(self, value: Any = None, error: BaseException | None = None) -> None:
        with self._lock:
            if self._ready.is_set():
                return
            self._value, self._error = value, error
            self._ready.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    def wait(self) -> Any:
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self._value

    def is_ready(self) -> bool:
        return self._ready.is_set()

    def block_until_ready(self) -> None:
        self._ready.wait()

    def on_ready(self, callback: Callable[["Future"], None]) -> None:
        with self._lock:
            if not self._ready.is_set():
                self._callbacks.append(callback)
                return
        callback(self)

    def cancel(self) -> None:
        self._finish(error=FDBError(1101))


class Value(Future):
    """``tr.get``'s result, as the real binding's: ``wait()`` returns the
    future itself, not the bytes; ``.value`` is the bytes or None, and
    ``present()`` says which. It compares equal to its bytes."""

    def __init__(self, value: bytes | None) -> None:
        super().__init__(value)
        self.value = value

    def wait(self) -> "Value":  # type: ignore[override]
        return self

    def present(self) -> bool:
        return self.value is not None

    def __bytes__(self) -> bytes:
        if self.value is None:
            raise TypeError("the key is not present")
        return self.value

    def __eq__(self, other: object) -> bool:
        return self.value == (other.value if isinstance(other, Value) else other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self.value)


class _Watch(Future):
    """Ready when the key no longer holds what the watching transaction saw.
    Armed at that transaction's commit; then a thread of its own asks the
    server in slices, so cancel() ends it."""

    def __init__(self, address: _wire.Address, key: bytes) -> None:
        super().__init__(ready=False)
        self._address = address
        self.key = key

    def arm(self, seen: bytes | None, since: int) -> None:
        threading.Thread(target=self._run, args=(seen, since), daemon=True,
                         name="fdb-model-watch").start()

    def _run(self, seen: bytes | None, since: int) -> None:
        while not self.is_ready():
            try:
                if _call(self._address, "watch", self.key, seen, since):
                    self._finish(None)
            except FDBError as exc:
                self._finish(error=exc)


# -- transactions -----------------------------------------------------------------


class _Options:
    def __init__(self, owner: Any) -> None:
        self._owner = owner

    def set_timeout(self, milliseconds: int) -> None:
        self._owner._timeout_ms = int(milliseconds)

    def set_retry_limit(self, limit: int) -> None:
        self._owner._retry_limit = int(limit)

    # Database options apply to each new transaction, as the real ones
    set_transaction_timeout = set_timeout
    set_transaction_retry_limit = set_retry_limit


def _key_after(key: bytes) -> bytes:
    return key + b"\0"


class _Read:
    """The reads of a transaction; ``snapshot`` is the same without conflicts."""

    def __init__(self, tr: "Transaction", snapshot: bool) -> None:
        self._tr = tr
        self._snapshot = snapshot

    def get_read_version(self) -> Future:
        return Future(self._tr._read_version())

    def get(self, key: bytes) -> Value:
        tr = self._tr
        key = bytes(key)
        tr._use()
        if not self._snapshot:
            tr._reads.append((key, _key_after(key)))
        known, value = tr._own_write(key)
        if not known:
            value = _call(tr._address, "get", tr._read_version(), key)
            value = tr._overlay_value(key, value)
        return Value(value)

    def __getitem__(self, key: bytes) -> Value:
        return self.get(key)

    def get_range(self, begin: bytes, end: bytes, limit: int = 0, reverse: bool = False,
                  streaming_mode: object = None) -> list[KeyValue]:
        tr = self._tr
        begin, end = bytes(begin), bytes(end)
        tr._use()
        found = dict(_call(tr._address, "get_range", tr._read_version(), begin, end,
                           0 if tr._touches(begin, end) else limit, reverse))
        for key, value in tr._writes_in(begin, end):
            if value is None:
                found.pop(key, None)
            else:
                found[key] = value
        items = sorted(found.items(), reverse=reverse)
        if limit:
            items = items[:limit]
        if not self._snapshot:
            # what was read: all of it, or up to the last key returned when the limit cut it
            if limit and len(items) == limit:
                last = items[-1][0]
                tr._reads.append((begin, _key_after(last)) if not reverse else (last, end))
            else:
                tr._reads.append((begin, end))
        return [KeyValue(k, v) for k, v in items]

    def get_range_startswith(self, prefix: bytes, *args: Any, **kwargs: Any) -> list[KeyValue]:
        return self.get_range(prefix, _strinc(prefix), *args, **kwargs)


def _strinc(key: bytes) -> bytes:
    key = key.rstrip(b"\xff")
    if not key:
        raise ValueError("Key must contain at least one byte not equal to 0xFF.")
    return key[:-1] + bytes([key[-1] + 1])


class Transaction(_Read):
    """One transaction (see the module docstring for what is modelled)."""

    def __init__(self, db: "Database") -> None:
        super().__init__(self, snapshot=False)
        self._db = db
        self._address = db._address
        self._retries = 0
        self._timeout_ms = db._timeout_ms
        self._retry_limit = db._retry_limit
        self.options = _Options(self)
        self.snapshot = _Read(self, snapshot=True)
        self._started = time.monotonic()  # the timeout runs across on_error's retries, as the real one
        self._fresh()

    def _fresh(self) -> None:
        for _, pending in getattr(self, "_watches", ()):
            pending._finish(error=FDBError(1025))  # never armed: the transaction went away
        self._rv: int | None = None
        self._reads: list[tuple[bytes, bytes]] = []
        self._write_ranges: list[tuple[bytes, bytes]] = []
        self._mutations: list[tuple[Any, ...]] = []
        self._view: dict[bytes, bytes | None] = {}  # our own writes, None: cleared
        self._cleared: list[tuple[bytes, bytes]] = []
        self._unknown: set[bytes] = set()  # atomic adds: only the server knows the result
        self._size = 0
        self._watches: list[tuple[bytes, _Watch]] = []
        self._committed_version = -1
        self._cancelled = False

    def _use(self) -> None:
        if self._cancelled:
            raise FDBError(1025)
        if self._timeout_ms and (time.monotonic() - self._started) * 1000 > self._timeout_ms:
            raise FDBError(1031)

    def _read_version(self) -> int:
        self._use()
        if self._rv is None:
            self._rv = _call(self._address, "grv")
        return self._rv

    def set_read_version(self, version: int) -> None:
        self._rv = version

    # read-your-writes

    def _own_write(self, key: bytes) -> tuple[bool, bytes | None]:
        if key in self._unknown:
            return False, None
        if key in self._view:
            return True, self._view[key]
        if any(b <= key < e for b, e in self._cleared):
            return True, None
        return False, None

    def _overlay_value(self, key: bytes, stored: bytes | None) -> bytes | None:
        if key not in self._unknown:
            return stored
        value = stored
        for mutation in self._mutations:  # replay our adds on the stored value
            if mutation[1] == key and mutation[0] == "add":
                value = _add_le(value, mutation[2])
            elif mutation[1] == key and mutation[0] == "set":
                value = mutation[2]
            elif mutation[1] == key and mutation[0] == "clear":
                value = None
        return value

    def _touches(self, begin: bytes, end: bytes) -> bool:
        return any(begin <= k < end for k in self._view) or any(
            b < end and begin < e for b, e in self._cleared)

    def _writes_in(self, begin: bytes, end: bytes) -> Iterator[tuple[bytes, bytes | None]]:
        for b, e in self._cleared:
            lo, hi = max(b, begin), min(e, end)
            if lo < hi:
                for kv in _call(self._address, "get_range", self._read_version(), lo, hi, 0, False):
                    if kv[0] not in self._view:
                        yield kv[0], None
        for key, value in self._view.items():
            if begin <= key < end:
                yield key, value

    # writes

    def _grow(self, n: int) -> None:
        self._size += n

    def set(self, key: bytes, value: bytes) -> None:
        key, value = bytes(key), bytes(value)
        self._use()
        if len(key) > KEY_SIZE_LIMIT:
            raise FDBError(2102)
        if len(value) > VALUE_SIZE_LIMIT:
            raise FDBError(2103)
        self._mutations.append(("set", key, value))
        self._write_ranges.append((key, _key_after(key)))
        self._view[key] = value
        self._unknown.discard(key)
        self._grow(len(key) * 2 + len(value))

    def __setitem__(self, key: bytes, value: bytes) -> None:
        self.set(key, value)

    def clear(self, key: bytes) -> None:
        key = bytes(key)
        self._use()
        if len(key) > KEY_SIZE_LIMIT:
            raise FDBError(2102)
        self._mutations.append(("clear", key))
        self._write_ranges.append((key, _key_after(key)))
        self._view[key] = None
        self._unknown.discard(key)
        self._grow(len(key) * 2)

    def clear_range(self, begin: bytes, end: bytes) -> None:
        begin, end = bytes(begin), bytes(end)
        self._use()
        if begin >= end:
            return
        self._mutations.append(("clear_range", begin, end))
        self._write_ranges.append((begin, end))
        for key in [k for k in self._view if begin <= k < end]:
            self._view[key] = None
        self._cleared.append((begin, end))
        self._grow(len(begin) + len(end))

    def clear_range_startswith(self, prefix: bytes) -> None:
        self.clear_range(prefix, _strinc(prefix))

    def __delitem__(self, key: bytes) -> None:
        self.clear(key)

    def add(self, key: bytes, param: bytes) -> None:
        """Atomic little-endian add: no read conflict, so adders never collide."""
        key, param = bytes(key), bytes(param)
        self._use()
        if len(key) > KEY_SIZE_LIMIT:
            raise FDBError(2102)
        self._mutations.append(("add", key, param))
        self._write_ranges.append((key, _key_after(key)))
        self._view.pop(key, None)
        self._unknown.add(key)
        self._grow(len(key) * 2 + len(param))

    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None:
        self._reads.append((bytes(begin), bytes(end)))
        self._grow(len(begin) + len(end))

    def add_read_conflict_key(self, key: bytes) -> None:
        self.add_read_conflict_range(key, _key_after(bytes(key)))

    def add_write_conflict_range(self, begin: bytes, end: bytes) -> None:
        self._write_ranges.append((bytes(begin), bytes(end)))
        self._grow(len(begin) + len(end))

    def add_write_conflict_key(self, key: bytes) -> None:
        self.add_write_conflict_range(key, _key_after(bytes(key)))

    def get_approximate_size(self) -> Future:
        return Future(self._size)

    def watch(self, key: bytes) -> Future:
        """Ready when ``key`` changes from what this transaction sees; armed
        when the transaction commits (a watch of an uncommitted one never fires)."""
        key = bytes(key)
        self._use()
        future = _Watch(self._address, key)
        self._watches.append((key, future))
        return future

    def commit(self) -> Future:
        self._use()
        if self._size > TRANSACTION_SIZE_LIMIT:
            raise FDBError(2101)
        if self._mutations or self._write_ranges:
            version = _call(self._address, "commit", self._read_version(), self._reads,
                            self._write_ranges, self._mutations)
            self._committed_version = version
        since = self._committed_version if self._committed_version > 0 else self._read_version()
        watches, self._watches = self._watches, []
        for key, future in watches:
            future.arm(self.snapshot.get(key).value, since)
        return Future(None)

    def get_committed_version(self) -> int:
        return self._committed_version

    def on_error(self, error: FDBError | int) -> Future:
        code = error.code if isinstance(error, FDBError) else int(error)
        if code not in RETRYABLE or (self._retry_limit >= 0 and self._retries >= self._retry_limit):
            raise FDBError(code)
        # the real client's backoff: 10 ms doubling to 1 s, jittered
        delay = min(1.0, 0.01 * (2 ** self._retries)) * random.uniform(0.5, 1.0)
        self._retries += 1
        time.sleep(delay)
        self._fresh()
        return Future(None)

    def reset(self) -> None:
        self._retries = 0
        self._started = time.monotonic()
        self._fresh()

    def cancel(self) -> None:
        self._cancelled = True


class Database:
    """``fdb.open``'s result: makes transactions on the model's server."""

    def __init__(self, address: _wire.Address) -> None:
        self._address = address
        self._timeout_ms = 0
        self._retry_limit = -1
        self.options = _Options(self)

    def create_transaction(self) -> Transaction:
        _check_process()
        return Transaction(self)

    def __getitem__(self, key: bytes) -> Value:
        return _get(self, key)

    def __setitem__(self, key: bytes, value: bytes) -> None:
        _set(self, key, value)


def transactional(func: Callable[..., Any] | None = None, *, parameter: str = "tr") -> Any:
    """``@fdb.transactional``: given a Database, run ``func`` in a new
    transaction, commit, and retry through on_error; given a Transaction,
    just call it (the caller commits)."""

    def decorate(inner: Callable[..., Any]) -> Callable[..., Any]:
        index = inspect.getfullargspec(inner).args.index(parameter)

        @functools.wraps(inner)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            given = args[index] if index < len(args) else kwargs[parameter]
            if isinstance(given, Transaction):
                return inner(*args, **kwargs)
            tr = given.create_transaction()
            args = tuple(tr if i == index else a for i, a in enumerate(args))
            if index >= len(args):
                kwargs[parameter] = tr
            while True:
                try:
                    result = inner(*args, **kwargs)
                    tr.commit().wait()
                    return result
                except FDBError as exc:
                    tr.on_error(exc.code).wait()

        return wrapper

    return decorate(func) if func is not None else decorate


@transactional
def _get(tr: Transaction, key: bytes) -> Value:
    return tr.get(key).wait()


@transactional
def _set(tr: Transaction, key: bytes, value: bytes) -> None:
    tr.set(key, value)


# -- for tests: the server's controls (not part of the fdb API) --------------------


class Control:
    """Fault injection and settings of a running model server."""

    def __init__(self, cluster_file: str) -> None:
        self._address = _server_address(cluster_file)
        self._sock = _wire.connect(self._address)

    def _ask(self, *request: Any) -> Any:
        _wire.send(self._sock, request)
        status, result = _wire.receive(self._sock)
        if status == "err":
            raise FDBError(result)
        return result

    def inject(self, kind: str, count: int = 1, outcome: str = "random") -> None:
        """The next ``count`` commits fail: kind "unknown" (1021, outcome
        applied / dropped / random) or "not_committed" (1020)."""
        self._ask("inject", kind, count, outcome)

    def inject_rate(self, kind: str, probability: float, outcome: str = "random") -> None:
        """From now on each commit fails with ``kind`` with ``probability`` (0 stops it)."""
        self._ask("inject_rate", kind, float(probability), outcome)

    def set_too_old_seconds(self, seconds: float) -> None:
        self._ask("configure", seconds)

    def stats(self) -> dict[str, int]:
        return self._ask("stats")

    def close(self) -> None:
        self._sock.close()
