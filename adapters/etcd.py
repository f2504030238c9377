"""etcd v3: Samba databases as key ranges in an etcd cluster, record locks on leases.

The etcd client (the JSON gateway transport, the per-process session with its
lease and keepalive thread) is in ``_etcd_client``.

Key layout, for database ``spec.name`` and option ``prefix`` (default
``dbwrap_py``)::

    <prefix>/<basename>@<hash>/d/<key>   a record (raw key bytes: etcd keys are bytes)
    <prefix>/<basename>@<hash>/l/<key>   the record's lock, on the holder's lease
    <prefix>/<basename>@<hash>/t         the transaction lock (persistent databases)
    <prefix>/<basename>@<hash>/s         sequence number key, rewritten by every write
    <prefix>/<basename>@<hash>/o/<owner> one per open of a volatile database, on a lease
    <prefix>/<basename>@<hash>/w         rewritten by each TDB_CLEAR_IF_FIRST wipe
    <prefix>/_nodes/<node>[/r/<lock key>] node agents, and release requests to them

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

Node cache (option ``node_cache``, volatile databases): records owned by the
node and kept in a local tdb, migrated between nodes on demand, as ctdb
does. The design is in ``_etcd_node``; here, a lock key whose value names a
node gets a release request when we wait for it, and an unlocked read of a
record a node owns takes the lock (so the node writes it back) rather than
read a stale copy.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from dbwrap_py.adapter import Adapter, Capabilities, DatabaseSpec
from dbwrap_py.adapters._etcd_node import NodeCache, NotLive, marker_node, request_prefix
from dbwrap_py.adapters._etcd_client import (
    DEFAULT_LEASE_TTL,
    DEFAULT_OP_TIMEOUT,  # unused here: re-exported beside this module's other defaults
    _b64,
    _Compacted,
    _Config,
    _Counter,
    _LeaseGone,
    _prefix_end,
    _Session,
    _session_for,
    _sessions,
    _unb64,
)
from dbwrap_py.errors import (
    ConfigError,
    Corruption,
    DbwrapError,
    FencedOut,
    LockConflict,
    NotSupported,
    Timeout,
    Unavailable,
)
from dbwrap_py.options import Options

DEFAULT_PREFIX = "dbwrap_py"
DEFAULT_PAGE_SIZE = 500
#: etcd refuses requests over --max-request-bytes (1.5 MiB by default; a
#: 1,536,000-byte value still fits, 1,572,864 does not); 1 MiB leaves room for
#: the key, the seqnum key and JSON framing
MAX_VALUE_SIZE = 1024 * 1024
#: etcd's lessor revokes expired leases on a 500 ms tick
LESSOR_TICK = 0.5


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
        "node_cache",
        "node_cache_dir",
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
        self._prefix = prefix.encode()
        db_base = f"{spec.basename}@{digest}".encode()
        self.base = self._prefix + b"/" + db_base + b"/"
        self._data = self.base + b"d/"
        self._data_end = _prefix_end(self._data)
        self._locks_prefix = self.base + b"l/"
        self._txn_key = self.base + b"t"
        self._seq_key = self.base + b"s"
        self._openers_prefix = self.base + b"o/"
        self._wipe_key = self.base + b"w"
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
        self._node: NodeCache | None = None
        if options.get_bool("node_cache", False) and not spec.persistent:
            cache_dir = options.get_str("node_cache_dir", "") or os.path.join(
                os.path.dirname(os.path.abspath(spec.name)), "etcd-node-cache")
            os.makedirs(cache_dir, mode=0o755, exist_ok=True)  # as Samba's lock directory
            self._node = NodeCache(cache_dir, db_base, self._migrate_in, spec.mode)
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
        delete_locks = {"request_delete_range": {"key": _b64(self._locks_prefix),
                                                 "range_end": _b64(_prefix_end(self._locks_prefix))}}
        reply = self._txn_call(
            {
                "compare": [self._compare_create(self._openers_prefix, 0, range_end=_prefix_end(self._openers_prefix))],
                # nobody has it open, so the only lock keys are nodes' ownerships
                "success": [self._delete_range_op(), delete_locks, self._bump_op(),
                            {"request_put": {"key": _b64(self._wipe_key)}}, put_opener],
                "failure": [put_opener, self._range_op(self._wipe_key)],
            },
            deadline,
            idempotent=True,
        )
        if self._node is not None:
            if reply.get("succeeded"):
                wiped = int(reply["header"]["revision"])
            else:
                kvs = reply["responses"][1].get("response_range", {}).get("kvs")
                wiped = int(kvs[0]["mod_revision"]) if kvs else 0
            self._node.wipe_revision = wiped
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

    def _cache(self) -> NodeCache | None:
        """The node cache, if configured and its agent's lease is live."""
        node = self._node
        return node if node is not None and node.live() else None

    def get(self, key: bytes) -> bytes | None:
        node = self._node
        if node is not None:
            try:
                return node.get(key)
            except NotLive:
                pass  # no agent: etcd's copy, or the owning node's
        return self._get_etcd(key)

    def _get_etcd(self, key: bytes) -> bytes | None:
        txn = self._txn
        if txn is not None and key in txn.writes:
            return txn.writes[key]
        if self.spec.persistent or key in self._held:
            return self._read_data(key)
        # volatile: a node may own the record, and then its copy is the newer
        lock_key = self._locks_prefix + key
        reply = self._txn_call(
            {
                "compare": [self._compare_create(lock_key, 0)],
                "success": [self._range_op(self._data + key)],
                "failure": [self._range_op(lock_key), self._range_op(self._data + key)],
            },
            self._deadline(),
            idempotent=True,
        )
        responses = reply.get("responses", [])
        if not reply.get("succeeded"):
            holder = responses[0].get("response_range", {}).get("kvs")
            if holder and marker_node(_unb64(holder[0].get("value"))) is not None:
                self._process()
                value, revision = self._take_lock(key, True, self._owner, node_lease=0)
                self._release_lock_key(lock_key, revision)
                return value
        return self._first_value(responses[-1])

    def _read_data(self, key: bytes) -> bytes | None:
        reply = self._call("/v3/kv/range", {"key": _b64(self._data + key)}, self._deadline(), idempotent=True)
        kvs = reply.get("kvs")
        return _unb64(kvs[0].get("value")) if kvs else None

    def exists(self, key: bytes) -> bool:
        node = self._node
        if node is not None:
            try:
                return node.get(key) is not None
            except NotLive:
                pass
        txn = self._txn
        if txn is not None and key in txn.writes:
            return txn.writes[key] is not None
        if not self.spec.persistent:
            return self._get_etcd(key) is not None
        body = {"key": _b64(self._data + key), "count_only": True}
        reply = self._call("/v3/kv/range", body, self._deadline(), idempotent=True)
        return int(reply.get("count", 0)) > 0

    def lock(self, key: bytes) -> None:
        self._lock(key, read=False)

    def lock_get(self, key: bytes) -> bytes | None:
        return self._lock(key, read=True)

    def _lock(self, key: bytes, read: bool) -> bytes | None:
        node = self._node
        if node is not None:
            try:
                return node.lock_get(key)  # local: reading costs nothing more
            except NotLive:
                pass  # no live agent: lock in etcd
        return self._acquire(key, read)

    def unlock(self, key: bytes) -> None:
        node = self._node
        if node is not None and key in node.held:
            node.unlock(key)
            return
        revision = self._held.pop(key, 0)
        if revision <= 0:
            return  # taken under our transaction lock, or already lost
        self._release_lock_key(self._locks_prefix + key, revision)

    def _release_lock_key(self, lock_key: bytes, revision: int) -> None:
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
        node = self._node
        if node is not None and key in node.held:
            node.put(key, value)
            return
        if self._txn is not None:
            self._txn.writes[key] = bytes(value)
            return
        self._fenced_write(key, [{"request_put": {"key": _b64(self._data + key), "value": _b64(value)}}])

    def remove(self, key: bytes) -> bool:
        node = self._node
        if node is not None and key in node.held:
            return node.remove(key)
        if self._txn is not None:
            existed = self.exists(key)
            self._txn.writes[key] = None
            return existed
        reply = self._fenced_write(
            key, [{"request_delete_range": {"key": _b64(self._data + key)}}], idempotent=False
        )
        return int(reply["responses"][0]["response_delete_range"].get("deleted", 0)) > 0

    def put_unlock(self, key: bytes, value: bytes) -> None:
        # keys held through the node cache are never in _held either
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
        """Take our record lock (and read the record) in one txn; wait while others hold it."""
        if self._txn is not None:
            # our transaction lock already excludes every other writer
            self._held[key] = -1
            return self._get_etcd(key) if read else None
        self._process()  # sets self._owner in a new process
        value, self._held[key] = self._take_lock(key, read, self._owner, node_lease=0)
        return value

    def _migrate_in(self, key: bytes, lease_id: int, marker: bytes) -> tuple[bytes | None, int]:
        """Take ``key``'s lock key for this node (the node cache's migration)."""
        return self._take_lock(key, True, marker, node_lease=lease_id)

    def _take_lock(self, key: bytes, read: bool, holder_value: bytes, node_lease: int) -> tuple[bytes | None, int]:
        """Create the lock key with ``holder_value``, on our process lease or on
        ``node_lease``; return (the record if ``read``, the key's create_revision)."""
        session = self._process()
        lock_key = self._locks_prefix + key
        deadline = self._deadline()
        while True:
            lease_id = node_lease or session.lease(deadline, self._count)
            compare = [self._compare_create(lock_key, 0)]
            failure = [self._range_op(lock_key)]
            if self.spec.persistent:  # a running transaction excludes record lockers
                compare.append(self._compare_create(self._txn_key, 0))
                failure.append(self._range_op(self._txn_key))
            success: list[dict[str, Any]] = [
                {"request_put": {"key": _b64(lock_key), "value": _b64(holder_value), "lease": str(lease_id)}}
            ]
            if read:
                success.append(self._range_op(self._data + key))
            try:
                # a repeated request finds our own holder value: see below
                reply = self._txn_call({"compare": compare, "success": success, "failure": failure}, deadline, True)
            except _LeaseGone:
                if node_lease:
                    raise FencedOut("the node agent's lease is gone") from None
                session.lease_lost(lease_id)
                continue
            responses = reply.get("responses", [])
            if reply.get("succeeded"):
                revision = int(responses[0]["response_put"]["header"]["revision"])
                return (self._first_value(responses[1]) if read else None), revision
            holder = responses[0].get("response_range", {}).get("kvs")
            holder_is = _unb64(holder[0].get("value")) if holder else b""
            if holder and holder_is == holder_value:
                # our earlier attempt was applied but its reply was lost, or
                # (node cache) our node owns the record but has no local copy
                revision = int(holder[0]["create_revision"])
                try:
                    return (self._read_data(key) if read else None), revision
                except BaseException:
                    if not node_lease:
                        self._release_lock_key(lock_key, revision)
                    raise
            owner_node = marker_node(holder_is)
            request: Callable[[], None] | None = None
            if owner_node is not None:  # sent once the watch is in place
                request = functools.partial(self._request_release, owner_node, lock_key, session, deadline)
            blocker = lock_key if holder else self._txn_key
            self._wait_deleted(blocker, int(reply["header"]["revision"]) + 1, deadline, request)
            if time.monotonic() >= deadline:
                raise Timeout(f"record lock on {key!r} not granted within {self.config.op_timeout:g} s")

    def _request_release(self, node: bytes, lock_key: bytes, session: _Session, deadline: float) -> None:
        """Ask ``node``'s agent to write the record back and let its lock key go."""
        request = request_prefix(self._prefix, node) + lock_key
        lease_id = session.lease(deadline, self._count)
        try:
            self._call("/v3/kv/put", {"key": _b64(request), "lease": str(lease_id)}, deadline, idempotent=True)
        except _LeaseGone:
            session.lease_lost(lease_id)  # the wait below, and the next loop, go on

    def _wait_deleted(
        self, key: bytes, start_revision: int, deadline: float, once_watching: Callable[[], None] | None = None
    ) -> None:
        """Return when ``key`` is deleted at or after ``start_revision``, or at ``deadline``.

        ``once_watching`` runs when etcd has created the watch: what it
        causes is then seen at once. (A watch created at a revision already
        past is caught up by etcd's 100 ms sync loop instead.)
        """
        session = self._process()
        body = {"create_request": {"key": _b64(key), "start_revision": str(start_revision), "filters": ["NOPUT"]}}
        self.round_trips += 1
        try:
            conn = session.transport.open_stream("/v3/watch", body, deadline)
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

    # -- scans --------------------------------------------------------------

    def scan(self) -> Iterator[tuple[bytes, bytes]]:
        node = self._cache()
        if node is not None:
            yield from self._scan_with_cache(node)
            return
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

    def _scan_with_cache(self, node: NodeCache) -> Iterator[tuple[bytes, bytes]]:
        """etcd's records, where this node owns one its own copy instead."""
        owned = dict(node.owned())
        for key, value in self._scan_etcd():
            if key not in owned:
                yield key, value
        for key, newer in owned.items():
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
        node = self._cache()
        if node is not None:
            return node.seqnum()
        reply = self._call("/v3/kv/range", {"key": _b64(self._seq_key)}, self._deadline(), idempotent=True)
        kvs = reply.get("kvs")
        return int(kvs[0]["mod_revision"]) if kvs else 0

    def wipe(self) -> None:
        if self._txn is not None:
            for key, _ in list(self.scan()):
                self._txn.writes[key] = None
            return
        self._txn_call({"success": [self._delete_range_op(), self._bump_op()]}, self._deadline(), idempotent=True)
        if self._node is not None:
            self._node.wipe()

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
        if self._node is not None:
            self._node.after_fork()

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
        if self._node is not None:
            self._node.close()

    # -- for the conformance suite and the benchmarks -------------------------

    @classmethod
    def declared_capabilities(cls, options: Mapping[str, str]) -> Capabilities:
        """lock_release_seconds follows the configured lease_ttl; with the
        node cache, a dead process's locks are local chainlocks, gone at once."""
        parsed = Options(dict(options))
        ttl = parsed.get_int("lease_ttl", DEFAULT_LEASE_TTL, minimum=1)
        caps = dataclasses.replace(cls.capabilities, lock_release_seconds=ttl + LESSOR_TICK)
        if parsed.get_bool("node_cache", False):
            caps = dataclasses.replace(caps, lock_release_seconds=0.0, notes=(
                *caps.notes,
                "node_cache: volatile databases live on the node that uses them (migrated like ctdb's); "
                "a dead node agent's unwritten-back records are lost after lease_ttl",
            ))
        return caps

    @classmethod
    def throwaway_server(cls, options: Mapping[str, str]) -> AbstractContextManager[dict[str, str]] | None:
        if options.get("endpoints"):
            return None
        return _throwaway_etcd(options)


@contextmanager
def _throwaway_etcd(options: Mapping[str, str]) -> Iterator[dict[str, str]]:
    """A one-node etcd; with node_cache, a node agent on a temporary cache dir too."""
    from dbwrap_py.servers.etcd import EtcdCluster
    from dbwrap_py.servers.etcd_agent import NodeAgentProcess

    with EtcdCluster(nodes=1) as cluster:
        reach = {"endpoints": cluster.endpoints}
        if not Options(dict(options)).get_bool("node_cache", False) or options.get("node_cache_dir"):
            yield reach
            return
        agent_options = {k: v for k, v in options.items() if k in NodeAgentProcess.passed_options}
        with NodeAgentProcess({**agent_options, **reach}) as agent:
            yield {**reach, "node_cache_dir": str(agent.cache_dir)}


ADAPTER = EtcdAdapter
