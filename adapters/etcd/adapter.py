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
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from dbwrap_py.adapter import Capabilities, DatabaseSpec
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
    _wait_deleted,
)
from dbwrap_py.adapters.etcd.keys import DatabaseKeys, marker_node, prefix_end, request
from dbwrap_py.adapters.etcd.ownership import (
    EtcdNodeStore,
    EtcdOwnership,
    compare_create,
    delete_op,
    first_kv,
    first_value,
    put_op,
    range_op,
)
from dbwrap_py.errors import ConfigError, Corruption, DbwrapError, FencedOut, LockConflict, Timeout, Unavailable
from dbwrap_py.leased import KEEP, Keep, LeaseSource
from dbwrap_py.nodecache.layout import bucket_of
from dbwrap_py.options import PASSWORD_OPTIONS, Options
from dbwrap_py.transactions import TransactionalLeasedAdapter, Writes

DEFAULT_PREFIX = "dbwrap_py"
DEFAULT_PAGE_SIZE = 500
#: etcd refuses requests over --max-request-bytes (1.5 MiB by default; a
#: 1,536,000-byte value still fits, 1,572,864 does not); 1 MiB leaves room for
#: the key, the seqnum key and JSON framing
MAX_VALUE_SIZE = 1024 * 1024
#: etcd's lessor revokes expired leases on a 500 ms tick
LESSOR_TICK = 0.5


@dataclasses.dataclass
class _Tries:
    """The tries of one record lock's take (one token): what the last refusal
    said to wait for, and what carries from one try to the next."""

    key: bytes
    token: int
    deadline: float
    detached_revision: int = 0  # the key's detachment from a claimed bucket, once seen
    asked: bytes | None = None  # the node asked to hand the record over
    wait: Callable[[], None] = lambda: None


class EtcdAdapter(TransactionalLeasedAdapter):
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
    option_names = ("endpoints", "prefix", "lease_ttl", "op_timeout", "page_size", "ca_file", "cert_file",
                    "key_file", "user", *PASSWORD_OPTIONS)
    lease_source = LeaseSource.SERVER_TTL
    lease_slack = LESSOR_TICK
    default_lease = float(DEFAULT_LEASE_TTL)

    @classmethod
    def lease_for(cls, options: Mapping[str, str]) -> float:
        """The process lease's TTL (option lease_ttl, whole seconds)."""
        return float(Options(dict(options)).get_int("lease_ttl", DEFAULT_LEASE_TTL, minimum=1))

    def __init__(self, spec: DatabaseSpec, options: Options) -> None:
        super().__init__(spec, options)
        self.config = _Config.from_options(options)
        self.op_timeout = self.config.op_timeout  # etcd's default, not the framework's
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
        self._revisions: dict[int, int] = {}  # token -> create_revision of its lock key (the fence)
        self._tries: _Tries | None = None
        self._transaction_seen = 0  # the revision at which the transaction lock last refused us
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
        put_opener = put_op(key, lease=session.lease(deadline, self._count))
        # nobody has it open, so the only locks and claims are nodes' ownerships
        wipes = [delete_op(p, prefix_end(p)) for p in (k.data_prefix, k.locks_prefix, k.buckets_prefix,
                                                       k.detached_prefix)]
        reply = self._txn_call({"compare": [compare_create(k.openers_prefix, 0, prefix_end(k.openers_prefix))],
                                "success": [*wipes, put_op(k.seq), put_op(k.wiped), put_opener],
                                "failure": [put_opener, range_op(k.wiped)]}, deadline, idempotent=True)
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

    def _take_key(self, key: bytes, compare: list[dict[str, Any]], success: list[dict[str, Any]],
                  failure: list[dict[str, Any]]) -> tuple[dict[str, Any], int | None]:
        """Create ``key`` on our lease, valued our owner name, if ``compare``
        holds (one txn; ``success`` and ``failure`` follow the put or the
        read of ``key``): (etcd's reply, the key's create_revision if ours)."""
        session = self._process()
        while True:
            lease_id = session.lease(self._deadline(), self._count)
            put = put_op(key, self._owner, lease_id)
            try:  # a repeated request finds our own owner name: ours then
                reply = self._txn_call({"compare": compare, "success": [put, *success],
                                        "failure": [range_op(key), *failure]}, self._deadline(), True)
            except _LeaseGone:
                session.lease_lost(lease_id)
                continue
            if reply.get("succeeded"):
                return reply, int(reply["responses"][0]["response_put"]["header"]["revision"])
            holder = first_kv(reply["responses"][0])
            mine = holder is not None and _unb64(holder.get("value")) == self._owner
            return reply, int(holder["create_revision"]) if mine else None

    def _release(self, key: bytes, revision: int) -> None:
        """Delete our lock key ``key`` if it is still the one we made."""
        try:  # a repeat finds the key gone: the same outcome
            self._txn_call({"compare": [compare_create(key, revision)], "success": [delete_op(key)]},
                           self._deadline(), idempotent=True)
        except (Timeout, Unavailable):
            pass  # the lease takes it; nothing to undo

    def _fenced(self, key: bytes, token: int, ops: list[dict[str, Any]], idempotent: bool) -> dict[str, Any]:
        """Run ``ops`` and the seqnum bump iff ``token``'s lock key on ``key`` is still there."""
        lock_key = self.keys.lock(key)
        reply = self._txn_call({"compare": [compare_create(lock_key, self._revisions.get(token, -1))],
                                "success": [*ops, put_op(self.keys.seq)], "failure": [range_op(lock_key)]},
                               self._deadline(), idempotent)
        if not reply.get("succeeded"):
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

    # -- the lease primitives (dbwrap_py.leased); the lease is the process's ------

    def take_lease(self, key: bytes, token: int, seconds: float, read: bool) -> tuple[bool, bytes | None]:
        """One try at ``key``'s lock key; a node that owns the record (by its
        lock key or its bucket) is asked to hand it over while we wait."""
        k = self.keys
        tries = self._tries
        if tries is None or (tries.key, tries.token) != (key, token):
            tries = self._tries = _Tries(key, token, self._deadline())
        if self.spec.persistent:  # a running transaction excludes record lockers
            compare, failure = [compare_create(k.lock(key), 0), compare_create(k.txn, 0)], [range_op(k.txn)]
        else:  # a node's claim on the bucket owns the record, unless it is detached
            bucket = k.bucket(bucket_of(key))
            compare = [compare_create(k.lock(key), 0),
                       compare_create(k.detached(key), tries.detached_revision) if tries.detached_revision
                       else compare_create(bucket, 0)]
            failure = [range_op(bucket), range_op(k.detached(key))]
        reply, revision = self._take_key(k.lock(key), compare, [range_op(k.data(key))] if read else [], failure)
        if revision is None:
            tries.wait = self._what_to_wait_for(tries, reply)
            return False, None
        self._tries = None
        try:  # unless our earlier try was applied and its reply lost, the record came with the lock
            value = (first_value(reply["responses"][1]) if reply.get("succeeded") else self._read_data(key)) \
                if read else None
        except BaseException:
            self._release(k.lock(key), revision)
            raise
        self._revisions[token] = revision
        return True, value

    def _what_to_wait_for(self, tries: _Tries, reply: Mapping[str, Any]) -> Callable[[], None]:
        k = self.keys
        session = self._process()
        after = int(reply["header"]["revision"]) + 1
        holder = first_kv(reply["responses"][0])
        if holder is not None:  # the node is asked once the watch is in place
            ask = self._ask_once(tries, marker_node(_unb64(holder.get("value"))), session)
            return functools.partial(self._watch, k.lock(tries.key), after, tries.deadline, ask)
        if self.spec.persistent:
            return functools.partial(self._watch, k.txn, after, tries.deadline, None)
        claim, detached = (first_kv(response) for response in reply["responses"][1:3])
        tries.detached_revision = int(detached["create_revision"]) if detached is not None else 0
        owner = marker_node(_unb64(claim.get("value"))) if claim is not None else None
        if detached is not None or owner is None:
            return lambda: None  # detached (or no longer claimed) since: again at once
        ask = self._ask_once(tries, owner, session)

        def until_detached() -> None:
            if ask is not None:
                ask()
            time.sleep(0.002)  # until the node detaches the key from its bucket

        return until_detached

    def _ask_once(self, tries: _Tries, node: bytes | None, session: _Session) -> Callable[[], None] | None:
        """What asks ``node`` (None: no node) to hand the record over, if not asked yet."""
        if node is None or node == tries.asked:
            return None
        tries.asked = node
        return functools.partial(self._request_release, node, tries.key, session, tries.deadline)

    def _request_release(self, node: bytes, key: bytes, session: _Session, deadline: float) -> None:
        """Ask ``node``'s agent to write the record back and give it up."""
        lease_id = session.lease(deadline, self._count)
        body = {"key": _b64(request(self.keys.prefix, node, self.keys.db, key)), "lease": str(lease_id)}
        try:
            self._call("/v3/kv/put", body, deadline, idempotent=True)
        except _LeaseGone:
            session.lease_lost(lease_id)  # the wait, and the next try, go on

    def _watch(self, key: bytes, after: int, deadline: float, once_watching: Callable[[], None] | None) -> None:
        self.round_trips += 1
        _wait_deleted(self._process().transport, key, after, deadline, once_watching)

    def wait_for_release(self, key: bytes, pause: float) -> None:
        """What the last refusal said: a watch on the lock key (etcd deletes it
        with a dead holder's lease too) until op_timeout, or a short pause."""
        tries = self._tries
        if tries is None or tries.key != key:
            time.sleep(pause)
            return
        tries.wait()

    def fenced_write(self, key: bytes, token: int, value: bytes | None) -> bool:
        ops = [delete_op(self.keys.data(key)) if value is None else put_op(self.keys.data(key), value)]
        self._fenced(key, token, ops, idempotent=value is not None)
        return True

    def end_lease(self, key: bytes, token: int, value: bytes | None | Keep = KEEP) -> bool:
        if isinstance(value, Keep):
            self._release(self.keys.lock(key), self._revisions.pop(token, -1))
            return True
        write = delete_op(self.keys.data(key)) if value is None else put_op(self.keys.data(key), value)
        try:  # not idempotent: a repeat after success would see the lock gone and report FencedOut
            self._fenced(key, token, [write, delete_op(self.keys.lock(key))], idempotent=False)
        finally:
            self._revisions.pop(token, None)
        return True

    def remove(self, key: bytes) -> bool:
        """Outside a transaction, one round trip: etcd's delete says whether the record was there."""
        if self._transaction is not None:
            return super().remove(key)
        reply = self._fenced(key, self._token(key), [delete_op(self.keys.data(key))], idempotent=False)
        return int(reply["responses"][0]["response_delete_range"].get("deleted", 0)) > 0

    # -- records ------------------------------------------------------------

    def read_record(self, key: bytes) -> bytes | None:
        if self.spec.persistent or key in self._tokens:
            return self._read_data(key)
        # volatile: a node may own the record, and then its copy is the newer
        k = self.keys
        mine = [compare_create(k.lock(key), 0), compare_create(k.bucket(bucket_of(key)), 0)]
        reply = self._txn_call({"compare": mine, "success": [range_op(k.data(key))],
                                "failure": [range_op(k.lock(key)), range_op(k.bucket(bucket_of(key))),
                                            range_op(k.detached(key)), range_op(k.data(key))]},
                               self._deadline(), idempotent=True)
        responses = reply.get("responses", [])
        if not reply.get("succeeded") and self._node_owned(responses):
            return self.read_from_its_node(key)
        return first_value(responses[-1])

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

    # -- the transaction lock (dbwrap_py.transactions) -----------------------------

    def take_transaction_lock(self, token: int, seconds: float) -> bool:
        reply, revision = self._take_key(self.keys.txn, [compare_create(self.keys.txn, 0)], [], [])
        if revision is None:
            self._transaction_seen = int(reply["header"]["revision"])
            return False
        self._revisions[token] = revision
        return True

    def wait_for_transaction_lock(self, pause: float, left: float) -> None:
        self._watch(self.keys.txn, self._transaction_seen + 1, time.monotonic() + left, None)

    def wait_for_record_lockers(self, token: int, nonblock: bool, deadline: float) -> None:
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

    def commit_transaction(self, token: int, writes: Writes) -> bool:
        """One etcd txn fenced on the transaction lock key (etcd's --max-txn-ops bounds it)."""
        data = self.keys.data
        ops = [delete_op(data(key)) if value is None else put_op(data(key), value) for key, value in writes.items()]
        ops += [put_op(self.keys.seq)] if ops else []
        compare = [compare_create(self.keys.txn, self._revisions.get(token, -1))]
        try:
            reply = self._txn_call({"compare": compare, "success": [*ops, delete_op(self.keys.txn)],
                                    "failure": [range_op(self.keys.txn)]}, self._deadline(), idempotent=False)
        except BaseException:
            self.release_transaction_lock(token)
            raise
        self._revisions.pop(token, None)
        if not reply.get("succeeded"):
            raise FencedOut(f"lost the transaction lock before commit, nothing was written: {self._fence_cause(reply)}")
        return True

    def release_transaction_lock(self, token: int) -> None:
        self._release(self.keys.txn, self._revisions.pop(token, -1))

    # -- process lifecycle --------------------------------------------------

    def after_fork(self) -> None:
        super().after_fork()  # our locks and transaction are the parent's
        self._session = None  # and so is the connection
        self._pid = -1
        self._revisions.clear()
        self._tries = None
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
