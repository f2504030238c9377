"""The etcd adapter's store steps for the framework's transactions
(``dbwrap_py.transactions``, persistent databases): ``t``, the transaction
lock, a key on the process lease like a record lock; record lockers compare
it absent, and the start waits until no other process holds a record lock,
so a transaction excludes every other writer as tdb's allrecord lock does.
The commit is one etcd transaction fenced on ``t``'s create_revision;
etcd's --max-txn-ops (128 by default) bounds the records it writes."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from dbwrap_py.adapters.etcd.client import _b64, _Config, _unb64
from dbwrap_py.adapters.etcd.keys import DatabaseKeys, prefix_end
from dbwrap_py.adapters.etcd.ownership import compare_create, delete_op, put_op, range_op
from dbwrap_py.errors import FencedOut, LockConflict, Timeout
from dbwrap_py.retry import retry_until


class TransactionSteps:
    """For EtcdAdapter: its requests, its ``keys``, ``_owner`` and ``_revisions``."""

    keys: DatabaseKeys
    config: _Config
    _owner: bytes
    _revisions: dict[int, int]  # token -> create_revision of its lock key
    _transaction_seen = 0  # the revision at which the transaction lock last refused us
    _take_key: Callable[..., tuple[dict[str, Any], int | None]]
    _write_op: Callable[[bytes, bytes | None], dict[str, Any]]
    _call: Callable[..., dict[str, Any]]
    _txn_call: Callable[..., dict[str, Any]]
    _watch: Callable[..., None]
    _release: Callable[[bytes, int], None]
    _fence_cause: Callable[[Mapping[str, Any]], str]
    _deadline: Callable[[], float]

    def take_transaction_lock(self, token: int, seconds: float) -> bool:
        reply, revision = self._take_key(self.keys.txn, [compare_create(self.keys.txn, 0)], [], [], self._deadline())
        if revision is None:
            self._transaction_seen = int(reply["header"]["revision"])
            return False
        self._revisions[token] = revision
        return True

    def wait_for_transaction_lock(self, pause: float, left: float) -> None:
        """A watch on ``t`` until it is deleted (with a dead holder's lease too)."""
        self._watch(self.keys.txn, self._transaction_seen + 1, time.monotonic() + left, None)

    def wait_for_record_lockers(self, token: int, nonblock: bool, deadline: float) -> None:
        """Wait until no other process holds a record lock (none can take one now)."""
        locks = self.keys.locks_prefix
        body = {"key": _b64(locks), "range_end": _b64(prefix_end(locks))}
        for _ in retry_until(deadline):  # dbwrap_py.retry's default backoff, 1 ms doubling to 50 ms
            reply = self._call("/v3/kv/range", body, deadline, idempotent=True)
            if all(_unb64(kv.get("value")) == self._owner for kv in reply.get("kvs", [])):
                return
            if nonblock:
                raise LockConflict("other processes hold record locks")
        raise Timeout(f"record locks still held after {self.config.op_timeout:g} s")

    def commit_transaction(self, token: int, writes: dict[bytes, bytes | None]) -> bool:
        txn = self.keys.txn
        ops = [self._write_op(key, value) for key, value in writes.items()]
        ops += [put_op(self.keys.seq)] if ops else []
        compare = [compare_create(txn, self._revisions.get(token, -1))]
        try:
            reply = self._txn_call({"compare": compare, "success": [*ops, delete_op(txn)], "failure": [range_op(txn)]},
                                   self._deadline(), idempotent=False)
        except BaseException:
            self.release_transaction_lock(token)
            raise
        self._revisions.pop(token, None)
        if not reply.get("succeeded"):  # the framework's message would not say why
            raise FencedOut(f"lost the transaction lock before commit, nothing was written: {self._fence_cause(reply)}")
        return True

    def release_transaction_lock(self, token: int) -> None:
        self._release(self.keys.txn, self._revisions.pop(token, -1))
