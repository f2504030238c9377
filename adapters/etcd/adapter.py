"""etcd v3: Samba databases as key ranges in an etcd cluster, record locks on
leases (docs/adapters/etcd.md).

On the framework's leased adapter (dbwrap_py.leased, dbwrap_py.transactions):
a record lock is a key under ``l/`` created on this process's lease (the
session in ``client.py``: one connection, lease and keepalive thread per
process), so a dead holder's locks go with its lease (TTL to TTL + 0.5 s,
etcd's lessor tick). Every write under it is one etcd transaction that
compares the lock key's create_revision with the one we got (kept per
token) and rewrites the seqnum key ``s``, whose mod_revision is the seqnum;
a refused one raises FencedOut naming the cause. A waiter watches the lock
key for its deletion, bounded by op_timeout. Round trips: lock_get,
put_unlock, get, put, remove and unlock one each; ``round_trips`` counts them.
Key layout: ``keys.py``. Transactions (persistent databases): ``transactions.py``.
TDB_CLEAR_IF_FIRST: the openers service (``dbwrap_py.openers``) on
``openers.py``: an opener key on the lease; the first opener's test (no key
in ``o/``) and the wipe are one transaction. The node cache (volatile databases): ``ownership.py``; a
record a node owns (its lock key names the node, or its bucket is claimed)
is asked for while we wait for its lock, and an unlocked read of one takes
the lock (the node writes the record back) rather than read a stale copy.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from dbwrap_py.adapter import TDB_CLEAR_IF_FIRST, Capabilities, DatabaseSpec
from dbwrap_py.adapters.etcd.client import (  # DEFAULT_OP_TIMEOUT: re-exported beside the other defaults
    DEFAULT_LEASE_TTL,
    DEFAULT_OP_TIMEOUT,
    CLIENT_OPTIONS,
    _b64,
    _Compacted,
    _Config,
    _Counter,
    _Session,
    _session_for,
    _sessions,
    _unb64,
)
from dbwrap_py.adapters.etcd.keys import DEFAULT_PREFIX, DatabaseKeys, prefix_end, prefix_option
from dbwrap_py.adapters.etcd.locks import RecordLocks
from dbwrap_py.adapters.etcd.nodestore import agent_store
from dbwrap_py.adapters.etcd.openers import EtcdOpeners
from dbwrap_py.adapters.etcd.ownership import EtcdOwnership, delete_op, put_op
from dbwrap_py.adapters.etcd.transactions import TransactionSteps
from dbwrap_py.errors import ConfigError, Corruption, Unavailable
from dbwrap_py.leased import PREFIX, LeaseSource
from dbwrap_py.openers import OPENERS, Registration
from dbwrap_py.options import Option, Options
from dbwrap_py.transactions import TransactionalLeasedAdapter

DEFAULT_PAGE_SIZE = 500
#: etcd refuses requests over --max-request-bytes (1.5 MiB by default; a
#: 1,536,000-byte value still fits, 1,572,864 does not); 1 MiB leaves room for
#: the key, the seqnum key and JSON framing
MAX_VALUE_SIZE = 1024 * 1024
#: etcd's lessor revokes expired leases on a 500 ms tick
LESSOR_TICK = 0.5


class EtcdAdapter(RecordLocks, TransactionSteps, TransactionalLeasedAdapter):
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
    options_schema = (*CLIENT_OPTIONS, PREFIX.with_default(DEFAULT_PREFIX),
                      Option("page_size", int, DEFAULT_PAGE_SIZE, minimum=1, help="keys per range request"))
    lease_source = LeaseSource.SERVER_TTL
    lease_slack = LESSOR_TICK
    default_lease = float(DEFAULT_LEASE_TTL)

    @classmethod
    def lease_for(cls, options: Mapping[str, str]) -> float:
        """The process lease's TTL (option lease_ttl, whole seconds)."""
        return float(cls.options_of(options).value("lease_ttl"))

    def __init__(self, spec: DatabaseSpec, options: Options) -> None:
        super().__init__(spec, options)
        self.config = _Config.from_options(options)
        self.op_timeout = self.config.op_timeout  # etcd's default, not the framework's
        self.page_size = options.value("page_size")
        prefix = prefix_option(options)
        if not prefix:
            raise ConfigError("option prefix must not be empty")
        self.capabilities = self.declared_capabilities(options)
        self.keys = DatabaseKeys(prefix, spec.cluster_name.encode())
        #: requests this adapter sent (the keepalive thread's are in the session)
        self.round_trips = 0
        self._count = _Counter(self, "round_trips")
        self._pid = -1
        self._session: _Session | None = None
        self._owner = b""
        self._registration: Registration | None = None  # this opener's, in dbwrap_py.openers
        self._revisions: dict[int, int] = {}  # token -> create_revision of its lock key (the fence)
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
        if not self.spec.persistent and self._registration is None:  # kept in a child its parent's covers
            self._join_openers(session)
        return session

    def _join_openers(self, session: _Session) -> None:
        """Join the openers (``openers.py``); the first wipes (TDB_CLEAR_IF_FIRST)."""
        def call(path: str, body: Mapping[str, Any], idempotent: bool) -> dict[str, Any]:
            return self._call(path, body, self._deadline(), idempotent)

        store = EtcdOpeners(self.keys, session, lambda: session.lease(self._deadline(), self._count), call,
                            self._owner)
        self._registration = OPENERS.open(store, bool(self.spec.tdb_flags & TDB_CLEAR_IF_FIRST),
                                          covers_children=self.spec.node is not None)
        self.wipe_revision = store.wipe_revision

    def _deadline(self) -> float:
        return time.monotonic() + self.config.op_timeout

    def _call(self, path: str, body: Mapping[str, Any], deadline: float, idempotent: bool) -> dict[str, Any]:
        session = self._process()
        self.round_trips += 1
        return session.transport.call(path, body, deadline, idempotent)

    def _txn_call(self, body: Mapping[str, Any], deadline: float, idempotent: bool) -> dict[str, Any]:
        return self._call("/v3/kv/txn", body, deadline, idempotent)

    # -- records (the lease primitives are locks.py's) --------------------------------

    def remove(self, key: bytes) -> bool:
        """Outside a transaction, one round trip: etcd's delete says whether the record was there."""
        if self._transaction is not None:
            return super().remove(key)
        reply = self._fenced(key, self._token(key), [delete_op(self.keys.data(key))], idempotent=False)
        return int(reply["responses"][0]["response_delete_range"].get("deleted", 0)) > 0

    def read_record(self, key: bytes) -> bytes | None:
        if self.spec.persistent or key in self._tokens:
            return self._read_data(key)
        value, by_node = self.ownership().read(key)  # a node's copy is the newer
        return self.read_from_its_node(key) if by_node else value

    def _read_data(self, key: bytes) -> bytes | None:
        reply = self._call("/v3/kv/range", {"key": _b64(self.keys.data(key))}, self._deadline(), idempotent=True)
        kvs = reply.get("kvs")
        return _unb64(kvs[0].get("value")) if kvs else None

    def exists(self, key: bytes) -> bool:
        buffered, value = self._transaction.read(key) if self._transaction is not None else (False, None)
        if buffered:
            return value is not None
        if not self.spec.persistent:
            return self.get(key) is not None
        body = {"key": _b64(self.keys.data(key)), "count_only": True}
        reply = self._call("/v3/kv/range", body, self._deadline(), idempotent=True)
        return int(reply.get("count", 0)) > 0

    def scan_records(self) -> Iterator[tuple[bytes, bytes]]:
        """Paged range reads pinned to the first page's revision.

        Should compaction overtake a long scan, it goes on from the last key
        at the current revision: like a tdb traverse, it then sees concurrent
        writes, but still every key once.
        """
        data = self.keys.data_prefix
        start = data
        revision = 0
        while True:
            body: dict[str, Any] = {"key": _b64(start), "range_end": _b64(prefix_end(data)),
                                    "limit": str(self.page_size)}
            if revision:
                body["revision"] = str(revision)
            try:
                reply = self._call("/v3/kv/range", body, self._deadline(), idempotent=True)
            except _Compacted:
                revision = 0
                continue
            revision = revision or int(reply["header"]["revision"])
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

    def wipe_records(self) -> None:
        data = self.keys.data_prefix
        self._txn_call({"success": [delete_op(data, prefix_end(data)), put_op(self.keys.seq)]},
                       self._deadline(), idempotent=True)

    def check(self) -> None:
        """Every record readable, and every lock key on a lease (else it would never go)."""
        for _ in self.scan_records():
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

    # -- process lifecycle --------------------------------------------------

    def after_fork(self) -> None:
        super().after_fork()  # our locks and transaction are the parent's
        self._session = None  # and so is the connection
        self._pid = -1
        self._revisions.clear()
        self._tries = None
        if self._registration is not None and not self._registration.covers_child():
            self._registration = None  # the parent's (dbwrap_py.openers leaves it to the parent)

    def close(self) -> None:
        if self._closed:
            return
        session = self._session if self._pid == os.getpid() else None
        if session is not None:
            if self._registration is not None:
                OPENERS.leave(self._registration)  # a failure is logged: the lease takes it
                self._registration = None
            session.users -= 1
            if session.users <= 0:
                session.close()
                if _sessions.get(self.config) is session:
                    del _sessions[self.config]
        self._closed = True
        self._session = None

    # -- the node cache (dbwrap_py.nodecache.protocol) ------------------------

    node_store = staticmethod(agent_store)  # the agent's side: node_store(options)

    @property
    def node_cache_id(self) -> bytes:
        return self.keys.db

    def ownership(self) -> EtcdOwnership:
        """This database's ownership operations, on this process's connection."""
        def call(path: str, body: Mapping[str, Any], idempotent: bool) -> dict[str, Any]:
            return self._call(path, body, self._deadline(), idempotent)

        return EtcdOwnership(call, self.keys, self.config.op_timeout)


ADAPTER = EtcdAdapter
