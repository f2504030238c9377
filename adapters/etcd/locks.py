"""The etcd adapter's record locks: the lease primitives of dbwrap_py.leased
over lock keys (``l/<bb>/<key>``, valued the holder's owner name, on its
process lease).

A take is one etcd transaction: create the lock key if nobody holds it (and
for a persistent database no transaction lock ``t`` is held; for a volatile
one no node claims the record's bucket, unless the key is detached from it)
and read the record. Every write under the lock compares the key's
create_revision with the one we got (kept per token) and rewrites the
seqnum key, in the same transaction; a refused one raises FencedOut naming
the cause (our key gone with our lease, or who holds it now). A refused take
says what to wait for: a watch on the lock key (etcd deletes it with a dead
holder's lease too) or on ``t``, until op_timeout; a node that owns the
record is asked, once, to hand it over, and the tries go on, ``DETACH_WAIT``
apart, until it detaches the key from its bucket.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from dbwrap_py.adapter import DatabaseSpec
from dbwrap_py.adapters.etcd.client import _b64, _Counter, _LeaseGone, _Session, _unb64, _wait_deleted
from dbwrap_py.adapters.etcd.keys import DatabaseKeys, marker_node, request
from dbwrap_py.adapters.etcd.ownership import compare_create, delete_op, first_kv, first_value, put_op, range_op
from dbwrap_py.errors import FencedOut, Timeout, Unavailable
from dbwrap_py.leased import KEEP, Keep
from dbwrap_py.nodecache.layout import bucket_of
from dbwrap_py.retry import Backoff

Ops = list[dict[str, Any]]
#: between two tries at a record a node owns, until the node detaches it
#: from its bucket (a watch, the other wait, lasts until the lock goes)
DETACH_WAIT = Backoff(first=0.002, cap=0.032)


@dataclasses.dataclass
class Tries:
    """The tries of one record lock's take (one token): what the last refusal
    said to wait for, and what carries from one try to the next."""

    key: bytes
    token: int
    deadline: float
    detached_revision: int = 0  # the key's detachment from a claimed bucket, once seen
    asked: bytes | None = None  # the node asked to hand the record over
    wait: Callable[[float], None] = lambda pause: None  # given the backoff's pause


class RecordLocks:
    """For EtcdAdapter: its requests, ``spec``, ``keys`` and ``_owner``."""

    spec: DatabaseSpec
    keys: DatabaseKeys
    round_trips: int
    _owner: bytes
    _count: _Counter
    _revisions: dict[int, int]  # token -> create_revision of its lock key (the fence)
    _tries: Tries | None = None
    lock_wait: ClassVar[Backoff] = DETACH_WAIT  # the framework's retry_until pauses (dbwrap_py.leased)
    _process: Callable[[], _Session]
    _call: Callable[..., dict[str, Any]]
    _txn_call: Callable[..., dict[str, Any]]
    _deadline: Callable[[], float]
    _read_data: Callable[[bytes], bytes | None]

    # -- the lease primitives ---------------------------------------------------------

    def take_lease(self, key: bytes, token: int, seconds: float, read: bool) -> tuple[bool, bytes | None]:
        """One try at ``key``'s lock key, on the process lease (its TTL, not ``seconds``)."""
        k = self.keys
        tries = self._tries
        if tries is None or (tries.key, tries.token) != (key, token):
            tries = self._tries = Tries(key, token, self._deadline())
        if self.spec.persistent:  # a running transaction excludes record lockers
            compare, failure = [compare_create(k.lock(key), 0), compare_create(k.txn, 0)], [range_op(k.txn)]
        else:  # a node's claim on the bucket owns the record, unless it is detached
            bucket = k.bucket(bucket_of(key))
            compare = [compare_create(k.lock(key), 0),
                       compare_create(k.detached(key), tries.detached_revision) if tries.detached_revision
                       else compare_create(bucket, 0)]
            failure = [range_op(bucket), range_op(k.detached(key))]
        success = [range_op(k.data(key))] if read else []
        reply, revision = self._take_key(k.lock(key), compare, success, failure, tries.deadline)
        if revision is None:
            tries.wait = self._what_to_wait_for(tries, reply)
            return False, None
        self._tries = None
        try:  # unless our earlier try was applied and its reply lost, the record came with the lock
            value = None
            if read:
                value = first_value(reply["responses"][1]) if reply.get("succeeded") else self._read_data(key)
        except BaseException:
            self._release(k.lock(key), revision)
            raise
        self._revisions[token] = revision
        return True, value

    def wait_for_release(self, key: bytes, pause: float) -> None:
        """What the last refusal said to wait for (a watch ends at op_timeout)."""
        tries = self._tries
        if tries is None or tries.key != key:
            time.sleep(pause)
            return
        tries.wait(pause)

    def fenced_write(self, key: bytes, token: int, value: bytes | None) -> bool:
        self._fenced(key, token, [self._write_op(key, value)], idempotent=value is not None)
        return True

    def end_lease(self, key: bytes, token: int, value: bytes | None | Keep = KEEP) -> bool:
        if isinstance(value, Keep):
            self._release(self.keys.lock(key), self._revisions.pop(token, -1))
            return True
        try:  # not idempotent: a repeat after success would see the lock gone and report FencedOut
            self._fenced(key, token, [self._write_op(key, value), delete_op(self.keys.lock(key))], idempotent=False)
        finally:
            self._revisions.pop(token, None)
        return True

    # -- lock keys --------------------------------------------------------------------

    def _write_op(self, key: bytes, value: bytes | None) -> dict[str, Any]:
        return delete_op(self.keys.data(key)) if value is None else put_op(self.keys.data(key), value)

    def _take_key(self, key: bytes, compare: Ops, success: Ops, failure: Ops,
                  deadline: float) -> tuple[dict[str, Any], int | None]:
        """Create ``key`` on our lease, valued our owner name, if ``compare``
        holds (one txn; ``success`` and ``failure`` follow the put or the
        read of ``key``): (etcd's reply, the key's create_revision if ours)."""
        session = self._process()
        while True:
            lease_id = session.lease(deadline, self._count)
            put = put_op(key, self._owner, lease_id)
            try:  # a repeated request finds our own owner name: ours then
                reply = self._txn_call({"compare": compare, "success": [put, *success],
                                        "failure": [range_op(key), *failure]}, deadline, True)
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

    def _fenced(self, key: bytes, token: int, ops: Ops, idempotent: bool) -> dict[str, Any]:
        """Run ``ops`` and the seqnum bump iff ``token``'s lock key on ``key`` is still there."""
        lock_key = self.keys.lock(key)
        reply = self._txn_call({"compare": [compare_create(lock_key, self._revisions.get(token, -1))],
                                "success": [*ops, put_op(self.keys.seq)], "failure": [range_op(lock_key)]},
                               self._deadline(), idempotent)
        if not reply.get("succeeded"):  # the framework's message would not say why
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

    # -- waiting for a lock ---------------------------------------------------------------

    def _what_to_wait_for(self, tries: Tries, reply: Mapping[str, Any]) -> Callable[[float], None]:
        """What to do with the pause before the next try (``DETACH_WAIT``'s,
        never past op_timeout): a watch ignores it and lasts until the lock goes."""
        k = self.keys
        after = int(reply["header"]["revision"]) + 1
        holder = first_kv(reply["responses"][0])
        if holder is not None:  # the node is asked once the watch is in place
            ask = self._ask_once(tries, marker_node(_unb64(holder.get("value"))))
            return functools.partial(self._watch_for, k.lock(tries.key), after, tries.deadline, ask)
        if self.spec.persistent:
            return functools.partial(self._watch_for, k.txn, after, tries.deadline, None)
        claim, detached = (first_kv(response) for response in reply["responses"][1:3])
        tries.detached_revision = int(detached["create_revision"]) if detached is not None else 0
        owner = marker_node(_unb64(claim.get("value"))) if claim is not None else None
        if detached is not None or owner is None:
            return lambda pause: None  # detached (or no longer claimed) since: again at once
        ask = self._ask_once(tries, owner)

        def until_detached(pause: float) -> None:
            if ask is not None:
                ask()
            time.sleep(pause)  # the node detaches the key from its bucket meanwhile

        return until_detached

    def _ask_once(self, tries: Tries, node: bytes | None) -> Callable[[], None] | None:
        """What asks ``node`` (None: no node) to hand the record over, if not asked yet."""
        if node is None or node == tries.asked:
            return None
        tries.asked = node
        return functools.partial(self._request_release, node, tries.key, tries.deadline)

    def _request_release(self, node: bytes, key: bytes, deadline: float) -> None:
        """Ask ``node``'s agent to write the record back and give it up."""
        session = self._process()
        lease_id = session.lease(deadline, self._count)
        body = {"key": _b64(request(self.keys.prefix, node, self.keys.db, key)), "lease": str(lease_id)}
        try:
            self._call("/v3/kv/put", body, deadline, idempotent=True)
        except _LeaseGone:
            session.lease_lost(lease_id)  # the wait, and the next try, go on

    def _watch_for(self, key: bytes, after: int, deadline: float, once_watching: Callable[[], None] | None,
                   pause: float) -> None:
        """``_watch``, as the wait between two tries: the pause is not needed."""
        self._watch(key, after, deadline, once_watching)

    def _watch(self, key: bytes, after: int, deadline: float, once_watching: Callable[[], None] | None) -> None:
        """Until ``key`` is deleted at revision ``after`` or later, or ``deadline``."""
        self.round_trips += 1
        _wait_deleted(self._process().transport, key, after, deadline, once_watching)
