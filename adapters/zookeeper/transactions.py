"""The zookeeper adapter's transactions (persistent databases): ``t``, an
ephemeral transaction lock (with its fence ``f/t.<token>``) that record
lockers' multis create and delete, so they fail while it exists; writes are
buffered, and committed in one multi that deletes the fence first."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable

from kazoo.exceptions import NoNodeError

from dbwrap_py.adapters.zookeeper.client import Op, Session, record_ops, until
from dbwrap_py.errors import FencedOut, Unavailable
from dbwrap_py.leased import Keep


class Transactions:
    """For ZooKeeperAdapter: its ``zk``, ``root``, ``seq``, ``_path`` and ``_tokens``."""

    zk: Session
    root: str
    seq: str
    op_timeout: float
    _tokens: dict[bytes, int]
    _path: Callable[..., str]
    #: (the transaction lock's token, the writes buffered) while one is open
    _txn: tuple[int, dict[bytes, bytes | None]] | None = None

    def _buffered(self, key: bytes, value: bytes | None | Keep) -> bool:
        """Inside a transaction, a write goes only into its buffer (our transaction lock fences it)."""
        if self._txn is not None and not isinstance(value, Keep):
            self._txn[1][key] = value
        return self._txn is not None

    def transaction_start(self, nonblock: bool = False) -> None:
        token = secrets.randbits(63)
        take: list[Op] = [("create", f"{self.root}/t", b"", True), ("create", f"{self.root}/f/t.{token}", b"", True)]
        until(lambda: self.zk.multi(take) is None, self.op_timeout, nonblock, "the transaction lock")
        try:  # record lockers are excluded now: wait for those already in
            mine = {f"k{k.hex()}" for k in self._tokens}
            until(lambda: set(self.zk.children(f"{self.root}/l")) <= mine, self.op_timeout, nonblock,
                  "record locks")
        except BaseException:
            self._release(token)
            raise
        self._txn = (token, {})

    def transaction_commit(self) -> None:
        (token, writes), self._txn = self._txn or (0, {}), None
        try:
            present = self.zk.get_many([self._path("d", k) for k in writes])  # stable: writers wait
            ops: list[Op] = [("delete", f"{self.root}/f/t.{token}"), ("delete", f"{self.root}/t")]
            for (key, value), old in zip(writes.items(), present):
                ops += record_ops(self._path("d", key), value, old is not None)
            failed = self.zk.multi([*ops, ("set", self.seq, b"")] if writes else ops)
        except BaseException:
            self._release(token)
            raise
        if failed is not None:
            self._release(token)
            if failed[0] < 2 and isinstance(failed[1], NoNodeError):
                raise FencedOut("zookeeper: the transaction lock went with its session; nothing was written")
            raise Unavailable(f"zookeeper: transaction refused, nothing written: {failed[1]!r}")

    def transaction_cancel(self) -> None:
        (token, _), self._txn = self._txn or (0, {}), None
        self._release(token)

    def _release(self, token: int) -> None:
        with contextlib.suppress(Unavailable):  # else it goes with the session
            self.zk.multi([("delete", f"{self.root}/f/t.{token}"), ("delete", f"{self.root}/t")])

