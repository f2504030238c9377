"""The node cache in front of an adapter: ``CachedAdapter``.

``open_database`` puts one in front of an adapter that implements the
protocol (``node_store``) when a volatile database is opened with
``node_cache = write-back`` (or ``yes``) or ``write-through``. When an
agent serves the node cache directory at open, every record operation goes
through the node's cache; else they go to the adapter directly. The adapter
itself never branches on the cache.

Options, read here and not by the adapter:

* ``node_cache``: ``no`` (default), ``yes`` / ``write-back`` (stores stay on
  the node until the record moves, as in ctdb), ``write-through`` (every
  store reaches the backend before the unlock returns, so the record
  survives the node);
* ``node_cache_dir``: the node agent's directory (default: next to the
  database, ``node-cache``);
* ``node_cache_sync_timeout``: how many seconds a write-back cache's
  traverse waits for the other nodes to write their records through
  (``sync.py``; default 5).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping

from dbwrap_py.adapter import Adapter, Capabilities
from dbwrap_py.errors import ConfigError, NotSupported
from dbwrap_py.nodecache.cache import WRITE_BACK, WRITE_THROUGH, NodeCache, check_cache_dir
from dbwrap_py.nodecache.state import NodeState
from dbwrap_py.nodecache.sync import DEFAULT_TIMEOUT, owners_write_through
from dbwrap_py.options import Option, Options

OPTIONS_SCHEMA = (
    Option("node_cache", str, "no", help="no, write-back (yes) or write-through"),
    Option("node_cache_dir", str, "", help="the node's cache directory (default: node-cache beside the database)"),
    Option("node_cache_sync_timeout", float, DEFAULT_TIMEOUT, minimum=0.0,
           help="seconds a write-through sync may take"),
)
OPTION_NAMES = tuple(option.name for option in OPTIONS_SCHEMA)
_MODES = {"yes": WRITE_BACK, "true": WRITE_BACK, "on": WRITE_BACK, "1": WRITE_BACK,
          WRITE_BACK: WRITE_BACK, WRITE_THROUGH: WRITE_THROUGH}
_OFF = {"no", "false", "off", "0", ""}


def supports_node_cache(cls: type[Adapter]) -> bool:
    return getattr(cls, "node_store", None) is not None


def node_cache_mode(options: Options) -> str | None:
    """write-back, write-through, or None for no node cache."""
    text = options.get_str("node_cache", "no").lower()
    if text in _OFF:
        return None
    if text not in _MODES:
        raise ConfigError(f"node_cache = {text!r}: use no, write-back (yes) or write-through")
    return _MODES[text]


def declared_capabilities(cls: type[Adapter], options: Mapping[str, str]) -> Capabilities:
    """What ``cls`` declares for ``options``, with the node cache's part: a
    cached database's record locks are local chainlocks, gone with their
    holder at once (no lease to outlive, so nothing to fence)."""
    caps = cls.declared_capabilities(options)
    if not supports_node_cache(cls) or node_cache_mode(Options(dict(options))) is None:
        return caps
    mode = node_cache_mode(Options(dict(options)))
    return dataclasses.replace(caps, lock_release_seconds=0.0, notes=(
        *caps.notes, f"node_cache = {mode}: volatile databases live on the node that uses them "
                     "(moved like ctdb's); their record locks are the node's local chainlocks"))


def cache_dir(options: Options, database: str) -> str:
    return options.get_str("node_cache_dir", "") or os.path.join(
        os.path.dirname(os.path.abspath(database)), "node-cache")


def ready_cache_dir(options: Options, database: str) -> str:
    """``cache_dir``, made if missing (0755, as Samba's lock directory) and
    checked (``check_cache_dir``). Before the adapter opens: a refused
    directory leaves the store as it was (a volatile database's first open
    wipes it)."""
    directory = cache_dir(options, database)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    check_cache_dir(directory)
    return directory


def serving_node(directory: str) -> bytes | None:
    """The name of the node whose agent serves ``directory`` now
    (``DatabaseSpec.node``); None when none does, or it is draining or its
    lease is not surely alive."""
    state = NodeState(directory)
    try:
        if not state.configured():
            return None
        lease, name = state.current()
        return name if lease else None
    finally:
        state.close()


class NoWriteBackCache(NotSupported):
    """The database has no write-back node cache: smbd's fast path asks
    every database it opens (the option is on by default), so this is a
    normal answer, not an error worth a log line."""

    routine = True


def write_back_cache(adapter: Adapter) -> NodeCache:
    """The node cache a process may do owned records in itself (the proxy's
    fast path); NotSupported, saying why, for any other database."""
    if not isinstance(adapter, CachedAdapter):
        raise NoWriteBackCache(f"not a write-back node cache (adapter {type(adapter).__name__}, "
                               "no node_cache)")
    if adapter.cache is None:
        raise NotSupported("no node agent served the cache directory at open")
    if adapter.cache.write_through:
        raise NoWriteBackCache("not a write-back node cache (node_cache = write-through)")
    return adapter.cache


class CachedAdapter(Adapter):
    """``inner``'s records on the node that uses them (see the module docstring).

    Whether the cache is used is decided when the database opens: an agent
    serves the cache directory, or not. The bridge picks its table of record
    operations at open too, and in write-back mode the cache offers its own
    (``native_records``: the owned records in C, no GIL). Should the agent
    stop later, having handed everything back, calls wait for a new one and
    then fail with Unavailable: stop smbd before the agent, as ctdb wants.
    """

    def __init__(self, inner: Adapter, mode: str, directory: str) -> None:
        """``directory``: from ``ready_cache_dir``, made and checked."""
        super().__init__(inner.spec, inner.options)
        self.inner = inner
        self.cache: NodeCache | None = None
        self.sync_timeout = inner.options.get_float("node_cache_sync_timeout", DEFAULT_TIMEOUT, minimum=0.0)
        if NodeState(directory).configured():
            ownership = inner.ownership()
            self.cache = NodeCache(directory, inner.node_cache_id, ownership, mode, inner.spec.mode,
                                   ownership.op_timeout)
            self.cache.wipe_revision = inner.wipe_revision
            if mode == WRITE_BACK:
                self.native_records = self.cache.records.native_records
        self.capabilities = Capabilities(
            transactions=False,
            multi_process=inner.capabilities.multi_process,
            lock_release_seconds=0.0 if self.cache is not None else inner.capabilities.lock_release_seconds,
            max_value_size=inner.capabilities.max_value_size,
            notes=(*inner.capabilities.notes,
                   f"node_cache = {mode}: records live on the node that uses them (moved like ctdb's)"
                   if self.cache is not None else
                   "node_cache: no node agent served the cache directory at open: the store directly"),
        )

    # -- records ----------------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        return self.cache.get(key) if self.cache is not None else self.inner.get(key)

    def exists(self, key: bytes) -> bool:
        return self.get(key) is not None

    def lock(self, key: bytes) -> None:
        self.lock_get(key)

    def lock_get(self, key: bytes) -> bytes | None:
        return self.cache.lock_get(key) if self.cache is not None else self.inner.lock_get(key)

    def unlock(self, key: bytes) -> None:
        if self.cache is not None:
            self.cache.unlock(key)
        else:
            self.inner.unlock(key)

    def put(self, key: bytes, value: bytes) -> None:
        if self.cache is not None:
            self.cache.put(key, value)
        else:
            self.inner.put(key, value)

    def remove(self, key: bytes) -> bool:
        return self.cache.remove(key) if self.cache is not None else self.inner.remove(key)

    def put_unlock(self, key: bytes, value: bytes) -> None:
        if self.cache is None:
            self.inner.put_unlock(key, value)
            return
        try:
            self.cache.put(key, value)
        finally:
            self.cache.unlock(key)

    def write_through(self, key: bytes) -> None:
        if self.cache is not None:
            self.cache.write_through_held(key)

    def scan(self) -> Iterator[tuple[bytes, bytes]]:
        """The store's records, where the node owns one its own copy instead.
        In write-back mode the other nodes owning records write them through
        first, as far as they answer in time (sync.py)."""
        if self.cache is None:
            yield from self.inner.scan()
            return
        if not self.cache.write_through:
            owners_write_through(self.cache.ownership, self.cache.db_id, self.cache.state.node_name(),
                                 self.cache.state.lease(), self.sync_timeout)
        owned = dict(self.cache.owned())
        for key, value in self.inner.scan():
            if key not in owned:
                yield key, value
        for key, value in owned.items():
            if value is not None:
                yield key, value

    # -- the database ---------------------------------------------------------------

    def seqnum(self) -> int:
        return self.cache.seqnum() if self.cache is not None else self.inner.seqnum()

    def wipe(self) -> None:
        self.inner.wipe()
        if self.cache is not None:
            self.cache.wipe()

    def check(self) -> None:
        self.inner.check()

    def db_id(self) -> bytes:
        return self.inner.db_id()

    def lock_renewal_seconds(self) -> float | None:
        return self.inner.lock_renewal_seconds()  # records the node owns are locked in its tdb

    def keep_locks_alive(self) -> None:
        self.inner.keep_locks_alive()

    def after_fork(self) -> None:
        self.inner.after_fork()
        if self.cache is not None:
            self.cache.after_fork()

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            if self.cache is not None:
                self.cache.close()
