"""etcd v3: Samba databases as key ranges in an etcd cluster, record locks on leases.

The etcd client (the JSON gateway transport, the per-process session with its
lease and keepalive thread) is in ``client.py``.

Key layout: ``keys.py`` (records and locks sit under their bucket).

Record locks: the lock key is created by a transaction comparing its
create_revision (and, for a volatile database, the bucket claim's) to 0,
attached to a per-process lease that a keepalive thread
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

Node cache (``node_cache``, volatile databases): the node cache framework
(dbwrap_py.nodecache) sits in front of this adapter; ``ownership.py`` is
this adapter's side of its protocol. Here, a record a node owns (its lock key
names the node, or its bucket is claimed) is asked for when this process
wants it, and an unlocked read of such a record takes the lock (the node
writes the record back) rather than read a stale copy.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from dbwrap_py.adapter import Adapter, Capabilities, DatabaseSpec
from dbwrap_py.adapters.etcd.client import (
    DEFAULT_LEASE_TTL,
    DEFAULT_OP_TIMEOUT,  # unused here: re-exported beside this module's other defaults
    _b64,
    _Compacted,
    _Config,
    _Counter,
    _LeaseGone,
    _Session,
    _session_for,
    _sessions,
    _unb64,
)
from dbwrap_py.adapters.etcd.keys import DatabaseKeys, marker_node, prefix_end, request
from dbwrap_py.adapters.etcd.ownership import EtcdNodeStore, EtcdOwnership, first_kv
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
from dbwrap_py.nodecache.layout import bucket_of
from dbwrap_py.options import PASSWORD_OPTIONS, Options

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
        *PASSWORD_OPTIONS,
    )

    def __init__(self, spec: DatabaseSpec, options: Options) -> None:
        super().__init__(spec, options)
        self.config = _Config.from_options(options)
        self.page_size = options.get_int("page_size", DEFAULT_PAGE_SIZE, minimum=1)
        prefix = options.get_str("prefix", DEFAULT_PREFIX).strip("/")
        if not prefix:
            raise ConfigError("option prefix must not be empty")
        self.capabilities = self.declared_capabilities(options)
        self.keys = DatabaseKeys(prefix.encode(), spec.cluster_name.encode())
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
        #: revision of this volatile database's last CLEAR_IF_FIRST wipe
        self.wipe_revision = 0
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
        k = self.keys
        key = k.openers_prefix + self._owner
        deadline = self._deadline()
        lease_id = session.lease(deadline, self._count)
        put_opener = {"request_put": {"key": _b64(key), "lease": str(lease_id)}}
        # nobody has it open, so the only locks and claims are nodes' ownerships
        wipes = [{"request_delete_range": {"key": _b64(p), "range_end": _b64(prefix_end(p))}}
                 for p in (k.data_prefix, k.locks_prefix, k.buckets_prefix, k.detached_prefix)]
        reply = self._txn_call(
            {
                "compare": [self._compare_create(k.openers_prefix, 0, range_end=prefix_end(k.openers_prefix))],
                "success": [*wipes, self._bump_op(), {"request_put": {"key": _b64(k.wiped)}}, put_opener],
                "failure": [put_opener, self._range_op(k.wiped)],
            },
            deadline,
            idempotent=True,
        )
        if reply.get("succeeded"):
            self.wipe_revision = int(reply["header"]["revision"])
        else:
            wiped = first_kv(reply["responses"][1])
            self.wipe_revision = int(wiped["mod_revision"]) if wiped else 0
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
        return {"request_put": {"key": _b64(self.keys.seq)}}

    def _delete_range_op(self) -> dict[str, Any]:
        data = self.keys.data_prefix
        return {"request_delete_range": {"key": _b64(data), "range_end": _b64(prefix_end(data))}}

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
        if self.spec.persistent or key in self._held:
            return self._read_data(key)
        # volatile: a node may own the record, and then its copy is the newer
        k = self.keys
        reply = self._txn_call(
            {
                "compare": [self._compare_create(k.lock(key), 0),
                            self._compare_create(k.bucket(bucket_of(key)), 0)],
                "success": [self._range_op(k.data(key))],
                "failure": [self._range_op(k.lock(key)), self._range_op(k.bucket(bucket_of(key))),
                            self._range_op(k.detached(key)), self._range_op(k.data(key))],
            },
            self._deadline(),
            idempotent=True,
        )
        responses = reply.get("responses", [])
        if not reply.get("succeeded") and self._node_owned(responses):
            self._process()
            value, revision = self._take_lock(key, True)
            self._release_lock_key(k.lock(key), revision)
            return value
        return self._first_value(responses[-1])

    @staticmethod
    def _node_owned(responses: list[Mapping[str, Any]]) -> bool:
        """From a failed read's [lock, bucket, detached, ...] ranges: does a node own it?"""
        holder, claim, detached = (first_kv(responses[i]) for i in range(3))
        if holder is not None:
            return marker_node(_unb64(holder.get("value"))) is not None
        return claim is not None and detached is None

    def _read_data(self, key: bytes) -> bytes | None:
        reply = self._call("/v3/kv/range", {"key": _b64(self.keys.data(key))}, self._deadline(), idempotent=True)
        kvs = reply.get("kvs")
        return _unb64(kvs[0].get("value")) if kvs else None

    def exists(self, key: bytes) -> bool:
        txn = self._txn
        if txn is not None and key in txn.writes:
            return txn.writes[key] is not None
        if not self.spec.persistent:
            return self.get(key) is not None
        body = {"key": _b64(self.keys.data(key)), "count_only": True}
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
        self._release_lock_key(self.keys.lock(key), revision)

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
        if self._txn is not None:
            self._txn.writes[key] = bytes(value)
            return
        self._fenced_write(key, [{"request_put": {"key": _b64(self.keys.data(key)), "value": _b64(value)}}])

    def remove(self, key: bytes) -> bool:
        if self._txn is not None:
            existed = self.exists(key)
            self._txn.writes[key] = None
            return existed
        reply = self._fenced_write(
            key, [{"request_delete_range": {"key": _b64(self.keys.data(key))}}], idempotent=False
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
        lock_key = self.keys.lock(key)
        reply = self._txn_call(
            {
                "compare": [self._compare_create(lock_key, revision)],
                "success": [
                    {"request_put": {"key": _b64(self.keys.data(key)), "value": _b64(value)}},
                    self._bump_op(),
                    {"request_delete_range": {"key": _b64(lock_key)}},
                ],
                "failure": [self._range_op(lock_key)],
            },
            self._deadline(),
            idempotent=False,  # a repeat after success would see the lock gone and report FencedOut
        )
        if not reply.get("succeeded"):
            raise FencedOut(f"lost the lock on {key!r} before writing it: {self._fence_cause(reply)}")

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
                "compare": [self._compare_create(self.keys.lock(key), revision)],
                "success": [*ops, self._bump_op()],
                "failure": [self._range_op(self.keys.lock(key))],
            },
            self._deadline(),
            idempotent,
        )
        if not reply.get("succeeded"):
            self._held[key] = 0
            raise FencedOut(f"lost the lock on {key!r} before writing it: {self._fence_cause(reply)}")
        return reply

    def _fence_cause(self, reply: Mapping[str, Any]) -> str:
        """Why a write fenced on one of our locks failed, from the failure
        branch's read of that lock key: the log line that tells a lapsed
        lease (a slow store, a stalled process) from a stolen lock."""
        try:
            holder = first_kv((reply.get("responses") or [{}])[0])
        except (AttributeError, IndexError, KeyError, TypeError):
            return f"etcd's reply does not say why; {self._process().lease_report()}"
        if holder is None:
            return f"its key is gone with our lease; {self._process().lease_report()}"
        return (f"{_unb64(holder.get('value')).decode(errors='replace')} holds it now "
                f"(ours lapsed: {self._process().lease_report()})")

    def _acquire(self, key: bytes, read: bool) -> bytes | None:
        """Take our record lock (and read the record) in one txn; wait while others hold it."""
        if self._txn is not None:
            # our transaction lock already excludes every other writer
            self._held[key] = -1
            return self.get(key) if read else None
        self._process()  # sets self._owner in a new process
        value, self._held[key] = self._take_lock(key, read)
        return value

    def _take_lock(self, key: bytes, read: bool) -> tuple[bytes | None, int]:
        """Create the lock key on our process lease; return (the record if
        ``read``, the key's create_revision). Waits while another process
        holds it; a node that owns the record (by its lock key or its
        bucket) is asked to hand it over first."""
        session = self._process()
        k = self.keys
        lock_key = k.lock(key)
        deadline = self._deadline()
        detached_revision = 0
        asked: bytes | None = None
        while True:
            lease_id = session.lease(deadline, self._count)
            compare = [self._compare_create(lock_key, 0)]
            failure = [self._range_op(lock_key)]
            if self.spec.persistent:  # a running transaction excludes record lockers
                compare.append(self._compare_create(k.txn, 0))
                failure.append(self._range_op(k.txn))
            else:  # a node's claim on the bucket owns the record, unless it is detached
                bucket = k.bucket(bucket_of(key))
                compare.append(self._compare_create(k.detached(key), detached_revision) if detached_revision
                               else self._compare_create(bucket, 0))
                failure += [self._range_op(bucket), self._range_op(k.detached(key))]
            success: list[dict[str, Any]] = [
                {"request_put": {"key": _b64(lock_key), "value": _b64(self._owner), "lease": str(lease_id)}}
            ]
            if read:
                success.append(self._range_op(k.data(key)))
            try:
                # a repeated request finds our own holder value: see below
                reply = self._txn_call({"compare": compare, "success": success, "failure": failure}, deadline, True)
            except _LeaseGone:
                session.lease_lost(lease_id)
                continue
            responses = reply.get("responses", [])
            if reply.get("succeeded"):
                revision = int(responses[0]["response_put"]["header"]["revision"])
                return (self._first_value(responses[1]) if read else None), revision
            holder = first_kv(responses[0])
            if holder is not None:
                holder_is = _unb64(holder.get("value"))
                if holder_is == self._owner:  # our earlier attempt was applied, its reply lost
                    revision = int(holder["create_revision"])
                    try:
                        return (self._read_data(key) if read else None), revision
                    except BaseException:
                        self._release_lock_key(lock_key, revision)
                        raise
                owner = marker_node(holder_is)
                ask = None
                if owner is not None and owner != asked:  # sent once the watch is in place
                    ask = functools.partial(self._request_release, owner, key, session, deadline)
                    asked = owner
                self._wait_deleted(lock_key, int(reply["header"]["revision"]) + 1, deadline, ask)
            elif self.spec.persistent:
                self._wait_deleted(k.txn, int(reply["header"]["revision"]) + 1, deadline)
            else:
                claim, detached = first_kv(responses[1]), first_kv(responses[2])
                detached_revision = int(detached["create_revision"]) if detached is not None else 0
                owner = marker_node(_unb64(claim.get("value"))) if claim is not None else None
                if detached is None and owner is not None:
                    if owner != asked:
                        self._request_release(owner, key, session, deadline)
                        asked = owner
                    time.sleep(0.002)  # until the node detaches the key from its bucket
            if time.monotonic() >= deadline:
                raise Timeout(f"record lock on {key!r} not granted within {self.config.op_timeout:g} s")

    def _request_release(self, node: bytes, key: bytes, session: _Session, deadline: float) -> None:
        """Ask ``node``'s agent to write the record back and give it up."""
        lease_id = session.lease(deadline, self._count)
        body = {"key": _b64(request(self.keys.prefix, node, self.keys.db, key)), "lease": str(lease_id)}
        try:
            self._call("/v3/kv/put", body, deadline, idempotent=True)
        except _LeaseGone:
            session.lease_lost(lease_id)  # the wait, and the next loop, go on

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
        data = self.keys.data_prefix
        start = data
        revision = 0
        while True:
            body: dict[str, Any] = {
                "key": _b64(start),
                "range_end": _b64(prefix_end(data)),
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
                yield self.keys.record_key(_unb64(kv["key"]), data), _unb64(kv.get("value"))
            if not reply.get("more") or not kvs:
                return
            start = _unb64(kvs[-1]["key"]) + b"\0"

    # -- database-wide ------------------------------------------------------

    def seqnum(self) -> int:
        reply = self._call("/v3/kv/range", {"key": _b64(self.keys.seq)}, self._deadline(), idempotent=True)
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
        for prefix in (self.keys.locks_prefix, self.keys.openers_prefix, self.keys.buckets_prefix,
                       self.keys.detached_prefix):
            body = {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix)), "keys_only": True}
            reply = self._call("/v3/kv/range", body, self._deadline(), idempotent=True)
            for kv in reply.get("kvs", []):
                if int(kv.get("lease", 0)) == 0:
                    raise Corruption(f"{_unb64(kv['key'])!r} has no lease and would never be released")

    def db_id(self) -> bytes:
        return self.keys.base

    # -- transactions -------------------------------------------------------

    def transaction_start(self, nonblock: bool = False) -> None:
        if self._txn is not None:
            raise NotSupported("a transaction is already running")
        session = self._process()
        deadline = self._deadline()
        while True:
            lease_id = session.lease(deadline, self._count)
            put = {"request_put": {"key": _b64(self.keys.txn), "value": _b64(self._owner), "lease": str(lease_id)}}
            try:
                reply = self._txn_call(
                    {
                        "compare": [self._compare_create(self.keys.txn, 0)],
                        "success": [put],
                        "failure": [self._range_op(self.keys.txn)],
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
            self._wait_deleted(self.keys.txn, int(reply["header"]["revision"]) + 1, deadline)
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
        locks = self.keys.locks_prefix
        body = {"key": _b64(locks), "range_end": _b64(prefix_end(locks))}
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
            data_key = _b64(self.keys.data(key))
            if value is None:
                ops.append({"request_delete_range": {"key": data_key}})
            else:
                ops.append({"request_put": {"key": data_key, "value": _b64(value)}})
        if ops:
            ops.append(self._bump_op())
        ops.append({"request_delete_range": {"key": _b64(self.keys.txn)}})
        try:
            reply = self._txn_call(
                {"compare": [self._compare_create(self.keys.txn, txn.revision)], "success": ops,
                 "failure": [self._range_op(self.keys.txn)]},
                self._deadline(),
                idempotent=False,
            )
        except BaseException:
            self._release_txn_lock(txn.revision)
            raise
        if not reply.get("succeeded"):
            raise FencedOut(f"lost the transaction lock before commit, nothing was written: {self._fence_cause(reply)}")

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
                    "compare": [self._compare_create(self.keys.txn, revision)],
                    "success": [{"request_delete_range": {"key": _b64(self.keys.txn)}}],
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

    # -- what it declares ------------------------------------------------------

    @classmethod
    def declared_capabilities(cls, options: Mapping[str, str]) -> Capabilities:
        """lock_release_seconds follows the configured lease_ttl."""
        ttl = Options(dict(options)).get_int("lease_ttl", DEFAULT_LEASE_TTL, minimum=1)
        return dataclasses.replace(cls.capabilities, lock_release_seconds=ttl + LESSOR_TICK)

    # -- the node cache (dbwrap_py.nodecache.protocol) ------------------------

    @classmethod
    def node_store(cls, options: Options) -> EtcdNodeStore:
        """The node agent's connection (``dbwrap-py node-agent --adapter etcd``)."""
        prefix = options.get_str("prefix", DEFAULT_PREFIX).strip("/").encode()
        return EtcdNodeStore(_Config.from_options(options), prefix)

    @property
    def node_cache_id(self) -> bytes:
        return self.keys.db

    def ownership(self) -> EtcdOwnership:
        """This database's ownership operations, on this process's connection."""
        def call(path: str, body: Mapping[str, Any], idempotent: bool) -> dict[str, Any]:
            return self._call(path, body, self._deadline(), idempotent)

        return EtcdOwnership(call, self.keys, self.config.op_timeout)


ADAPTER = EtcdAdapter
