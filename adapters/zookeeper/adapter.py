"""zookeeper: Samba databases as znodes; record locks are ephemeral znodes of
this process's ZooKeeper session, the lease (docs/adapters/zookeeper.md).

Under ``<prefix>/<cluster_name>/<generation>``: ``d/k<hex key>`` records,
``l/k<hex key>`` locks, ``f/k<hex key>.<token>`` their fences (made with the
lock in one multi, checked by every write under it), ``s`` the seqnum (its
mzxid), ``t`` the transaction lock (``transactions.py``). Kazoo plumbing:
``client.py``. The node cache (volatile databases): ``ownership.py``; a
record lock here is refused while a node owns the record, and that node is
asked to hand it over. TDB_CLEAR_IF_FIRST's openers: ``openers.py``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

from dbwrap_py.adapter import Capabilities, DatabaseSpec
from dbwrap_py.adapters.zookeeper import nodestore
from dbwrap_py.adapters.zookeeper import ownership as nodes
from dbwrap_py.adapters.zookeeper.client import Op, Session, ZkConfig, let_go, session_for
from dbwrap_py.adapters.zookeeper.openers import open_root
from dbwrap_py.adapters.zookeeper.transactions import TransactionSteps
from dbwrap_py.errors import ConfigError
from dbwrap_py.leased import KEEP, OP_TIMEOUT, PREFIX, Keep, LeaseSource
from dbwrap_py.openers import OPENERS, Registration
from dbwrap_py.options import Option, Options
from dbwrap_py.transactions import TransactionalLeasedAdapter

#: ZooKeeper refuses a request over jute.maxbuffer (1 MiB - 1 by default)
MAX_VALUE_SIZE = 1_000_000


class ZooKeeperAdapter(TransactionSteps, TransactionalLeasedAdapter):
    capabilities = Capabilities(transactions=True, max_value_size=MAX_VALUE_SIZE, lock_release_seconds=6.0,
                                notes=("a transaction is one multi: its writes must fit in jute.maxbuffer",))
    options_schema = (
        Option("hosts", str, "", help="host:port,... (required)"), PREFIX,
        Option("session_timeout", float, None, minimum=1.0,
               help="seconds, the session's lease (default: default_lease; whole seconds)"),
        OP_TIMEOUT,
    )
    lease_source = LeaseSource.SERVER_TTL
    lease_slack = 2.0  # the server expires sessions on its tick (tickTime, 2 s by default)
    default_lease = 4.0  # the least a default server (tickTime 2 s) grants

    @classmethod
    def lease_for(cls, options: Mapping[str, str]) -> float:
        seconds = cls.options_of(options).value("session_timeout")
        return float(math.ceil(cls.default_lease if seconds is None else seconds))

    def __init__(self, spec: DatabaseSpec, options: Options) -> None:
        super().__init__(spec, options)
        self.config = ZkConfig(options.value("hosts"), self.lease_seconds, self.op_timeout)
        if not self.config.hosts:
            raise ConfigError("zookeeper: option hosts (host:port,...) is required")
        prefix = options.value("prefix").strip("/")
        self.base = f"/{prefix}/{spec.cluster_name}" if prefix else f"/{spec.cluster_name}"
        self.node_cache_id = spec.cluster_name.encode()
        self.capabilities = self.declared_capabilities(options)
        self._zk: Session | None = None
        self._registration: Registration | None = None  # this opener's, in dbwrap_py.openers
        self._connect(may_wipe=True)

    def _connect(self, may_wipe: bool) -> Session:
        session = session_for(self.config)
        if self._registration is not None and self._registration.covers_child():
            self._zk = session  # an opener through its parent's registration, in its generation
            return session
        try:  # with a node agent, smbd's children are openers through their parent's (openers.py)
            self.root, self._registration = open_root(session, self.base, self.spec.persistent, may_wipe,
                                                      covers_children=self.spec.node is not None)
            self.seq, self.wipe_revision = f"{self.root}/s", nodes.wipe_revision(self.root)
        except BaseException:
            let_go(session)
            raise
        self._zk = session
        return session

    @property
    def zk(self) -> Session:
        return self._zk or self._connect(may_wipe=False)  # first use in a forked child

    def _path(self, kind: str, key: bytes, token: int | None = None) -> str:
        return f"{self.root}/{kind}/k{key.hex()}" + ("" if token is None else f".{token}")

    # -- the lease primitives (dbwrap_py.leased) ---------------------------------

    def take_lease(self, key: bytes, token: int, seconds: float, read: bool) -> tuple[bool, bytes | None]:
        with self.zk.let_go_if_lost(self._path("f", key, token), self._path("l", key)):
            if not self.spec.persistent:  # a node may own it (the node cache): ownership.py asks it
                taken = self.ownership().lock(key, token, None)[0]
            else:  # and no transaction lock may be held (transactions.py)
                taken = self.zk.create_all([*self._no_transaction_ops(), ("create", self._path("l", key), b"", True),
                                            ("create", self._path("f", key, token), b"", True)], "taking a record lock")
            # inside: a read lost after the take lets the lock go, else our live session keeps it
            return taken, self.zk.get_many([self._path("d", key)])[0] if taken and read else None

    def fenced_write(self, key: bytes, token: int, value: bytes | None) -> bool:
        return self.zk.write(self._path("d", key), self.seq, [("check", self._path("f", key, token))], value, True)

    def end_lease(self, key: bytes, token: int, value: bytes | None | Keep = KEEP) -> bool:
        release: list[Op] = [("delete", self._path("f", key, token)), ("delete", self._path("l", key))]
        with self.zk.let_go_if_lost(self._path("f", key, token), self._path("l", key)):
            if isinstance(value, Keep):
                return self.zk.multi(release) is None
            return self.zk.write(self._path("d", key), self.seq, release, value)

    # -- records --------------------------------------------------------------------

    def read_record(self, key: bytes) -> bytes | None:
        if self.spec.persistent or key in self._tokens:
            return self.zk.get_many([self._path("d", key)])[0]
        value, by_node = self.ownership().read(key)
        return self.read_from_its_node(key) if by_node else value

    def scan_records(self) -> Iterator[tuple[bytes, bytes]]:
        names = self.zk.children(f"{self.root}/d")
        values = self.zk.get_many([f"{self.root}/d/{n}" for n in names])
        return iter([(bytes.fromhex(n[1:]), v) for n, v in zip(names, values) if v is not None])

    def seqnum(self) -> int:
        return int(self.zk.stat(self.seq).mzxid)

    def db_id(self) -> bytes:
        return self.base.encode()

    # -- the node cache (ownership.py) --------------------------------------------------

    node_store = nodestore.ZkNodeStore  # the agent's side: node_store(options)

    def ownership(self) -> nodes.ZkOwnership:
        return nodes.ZkOwnership(lambda: self.zk, self.base, self.root, self.op_timeout)

    @property
    def round_trips(self) -> int:
        return self.zk.round_trips

    def after_fork(self) -> None:
        super().after_fork()
        self._zk = None  # the parent's session; its registration stays only if it covers the child
        if self._registration is not None and not self._registration.covers_child():
            self._registration = None  # the parent's (dbwrap_py.openers leaves it to the parent)

    def close(self) -> None:
        if self._zk is not None:
            if self._registration is not None:  # a failed delete is logged: it goes with the session
                OPENERS.leave(self._registration)
                self._registration = None
            let_go(self._zk)
            self._zk = None


ADAPTER = ZooKeeperAdapter
