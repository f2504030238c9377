"""The zookeeper adapter's store steps for the framework's transactions
(``dbwrap_py.transactions``, persistent databases): ``t``, an ephemeral
transaction lock (with its fence ``f/t.<token>``) that record lockers'
multis create and delete, so they fail while it exists; the commit is one
multi that deletes the fence first, so it fails once the lock went with
its session."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from kazoo.exceptions import NoNodeError

from dbwrap_py.adapters.zookeeper.client import Op, Session, record_ops, until
from dbwrap_py.errors import Unavailable


class TransactionSteps:
    """For ZooKeeperAdapter: its ``zk``, ``root``, ``seq``, ``_path`` and ``_tokens``."""

    zk: Session
    root: str
    seq: str
    _tokens: dict[bytes, int]
    _path: Callable[..., str]

    def _lock_paths(self, token: int) -> tuple[str, str]:
        """The transaction lock: our fence, and the lock node beside it."""
        return f"{self.root}/f/t.{token}", f"{self.root}/t"

    def _take_lock_ops(self, token: int) -> list[Op]:
        return [("create", path, b"", True) for path in self._lock_paths(token)]

    def _release_lock_ops(self, token: int) -> list[Op]:
        return [("delete", path) for path in self._lock_paths(token)]

    def _no_transaction_ops(self) -> list[Op]:
        """What a record locker's multi begins with: it fails while ``t`` exists."""
        return [("create", f"{self.root}/t", b"", False), ("delete", f"{self.root}/t")]

    def take_transaction_lock(self, token: int, seconds: float) -> bool:
        return self.zk.multi(self._take_lock_ops(token)) is None

    def wait_for_record_lockers(self, token: int, nonblock: bool, deadline: float) -> None:
        mine = {f"k{k.hex()}" for k in self._tokens}
        until(lambda: set(self.zk.children(f"{self.root}/l")) <= mine, max(0.0, deadline - time.monotonic()),
              nonblock, "record locks")

    def commit_transaction(self, token: int, writes: dict[bytes, bytes | None]) -> bool:
        try:
            present = self.zk.get_many([self._path("d", k) for k in writes])  # stable: writers wait
            ops = self._release_lock_ops(token)
            for (key, value), old in zip(writes.items(), present):
                ops += record_ops(self._path("d", key), value, old is not None)
            failed = self.zk.multi([*ops, ("set", self.seq, b"")] if writes else ops)
        except BaseException:
            self.release_transaction_lock(token)
            raise
        if failed is None:
            return True
        self.release_transaction_lock(token)
        if failed[0] < 2 and isinstance(failed[1], NoNodeError):
            return False  # the lock went with its session: nothing was written
        raise Unavailable(f"zookeeper: transaction refused, nothing written: {failed[1]!r}")

    def release_transaction_lock(self, token: int) -> None:
        with contextlib.suppress(Unavailable):  # else it goes with the session
            self.zk.multi(self._release_lock_ops(token))
