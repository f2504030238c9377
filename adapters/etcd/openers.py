"""The etcd adapter's side of TDB_CLEAR_IF_FIRST's openers: the primitives
``dbwrap_py.openers`` asks of a store, for one volatile database.

An opener is a key under the database's ``o/`` on this process's lease, so a
killed opener's goes with its lease. The test (no key under ``o/``), the
wipe and the registration are one etcd transaction: the store needs no open
lock (``open_atomically``). The session (``client.py``) puts the keys back
on its new lease if the old one lapsed, so the service never renews them
(``ttl`` None).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dbwrap_py.adapters.etcd.client import _b64, _Session
from dbwrap_py.adapters.etcd.keys import DatabaseKeys, prefix_end
from dbwrap_py.adapters.etcd.ownership import compare_create, delete_op, first_kv, put_op, range_op

#: a call on the adapter's connection: path, body, idempotent -> reply
Call = Callable[[str, Mapping[str, Any], bool], dict[str, Any]]


class EtcdOpeners:
    """One volatile database's openers; ``wipe_revision``: the revision of
    its last CLEAR_IF_FIRST wipe, as the open found or made it."""

    ttl: float | None = None

    def __init__(self, keys: DatabaseKeys, session: _Session, lease: Callable[[], int], call: Call,
                 owner: bytes) -> None:
        self.keys, self.session, self.lease, self.call, self.owner = keys, session, lease, call, owner
        self.wipe_revision = 0

    def __repr__(self) -> str:
        return f"etcd openers of {self.keys.base!r}"

    def key(self, opener: int) -> bytes:
        """An opener's key: its host, pid and a unique part name it (etcdctl get --prefix shows who)."""
        return self.keys.openers_prefix + self.owner + b":%x" % opener

    def open_atomically(self, opener: int, clear_if_first: bool) -> bool:
        k, key = self.keys, self.key(opener)
        put_opener = put_op(key, lease=self.lease())
        if clear_if_first:
            # nobody has it open, so the only locks and claims are nodes' ownerships
            wipes = [delete_op(p, prefix_end(p)) for p in (k.data_prefix, k.locks_prefix, k.buckets_prefix,
                                                           k.detached_prefix)]
            body = {"compare": [compare_create(k.openers_prefix, 0, prefix_end(k.openers_prefix))],
                    "success": [*wipes, put_op(k.seq), put_op(k.wiped), put_opener],
                    "failure": [put_opener, range_op(k.wiped)]}
        else:
            body = {"success": [put_opener, range_op(k.wiped)]}
        reply = self.call("/v3/kv/txn", body, True)
        first = clear_if_first and bool(reply.get("succeeded"))
        if first:
            self.wipe_revision = int(reply["header"]["revision"])
        else:
            wiped = first_kv(reply["responses"][1])
            self.wipe_revision = int(wiped["mod_revision"]) if wiped else 0
        self.session.add_opener(key)
        return first

    def register(self, opener: int) -> None:
        key = self.key(opener)
        self.call("/v3/kv/put", {"key": _b64(key), "lease": str(self.lease())}, True)
        self.session.add_opener(key)

    def unregister(self, opener: int) -> None:
        key = self.key(opener)
        self.session.remove_opener(key)
        self.call("/v3/kv/deleterange", {"key": _b64(key)}, True)
