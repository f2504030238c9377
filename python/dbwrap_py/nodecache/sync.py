"""A traverse that sees every node's records: their owners write them through first.

In write-back mode (``node_cache = yes``) a record's newest value may be only
on the node that owns it; the store has it as last written back. ctdb's
traverse asks every node. Here ``CachedAdapter.scan``, before it reads the
store, asks each other node that owns records of the database
(``Ownership.owners``) to write them through, and waits for the answers.

The question goes by the release-request channel as it is (the owner's
watch or poll of its requests, a request held on the requester's lease): a
request for a key of its own that starts with ``SYNC_MARK``. The owner's
agent, seeing the mark, writes every record of the database the node owns
through and keeps them (``NodeCache.write_through_owned``, the rules of
write-through), then removes the request: the answer the traverse waits for
(``Ownership.request_waiting``). A record key starting with the mark would
be taken for such a request; the mark is chosen so that none does.

The wait is bounded (``node_cache_sync_timeout`` seconds): a dead or slow
owner's records are seen as last written back, and one line on stderr says
so. Cost: with no other node owning records of the database, the question
who owns (``owners``: one round trip on most stores, a few on rados and
cassandra); else a request to each owner and a poll of each until it is
served, and on the owner a round trip per record it owns (none when nothing
changed since its last answer).
"""

from __future__ import annotations

import os
import secrets
import sys
import time

from dbwrap_py.errors import NotSupported
from dbwrap_py.nodecache.protocol import Ownership

SYNC_MARK = b"\0dbwrap_py:write-through\0"
#: how long a traverse waits for the owners where the option does not say
DEFAULT_TIMEOUT = 5.0
#: how often it looks whether they have answered (a round trip per owner)
POLL_SECONDS = 0.01
_unsupported_said: set[str] = set()  # once per adapter and process


def sync_key(node: bytes) -> bytes:
    """A request key of this traverse's own: each waits for its own answer."""
    return SYNC_MARK + node + b":" + secrets.token_hex(8).encode()


def is_sync_key(key: bytes) -> bool:
    return key.startswith(SYNC_MARK)


def log(db_id: bytes, text: str) -> None:
    print(f"dbwrap_py[{os.getpid()}]: database {db_id.decode('utf-8', 'replace')}, traverse: {text}",
          file=sys.stderr, flush=True)


def owners_write_through(ownership: Ownership, db_id: bytes, node: bytes, lease: int,
                         timeout: float) -> None:
    """Ask every other node owning records of the database to write them
    through, and wait for them at most ``timeout`` seconds."""
    if not lease:
        log(db_id, "no live node lease to ask the other nodes with; their records as last written back")
        return
    try:
        owners = ownership.owners() - {node}
    except NotSupported as exc:
        if type(ownership).__name__ not in _unsupported_said:
            _unsupported_said.add(type(ownership).__name__)
            log(db_id, f"{exc}: other nodes' records as last written back")
        return
    if not owners:
        return
    key = sync_key(node)
    for owner in owners:
        ownership.request_release(key, owner, lease)
    deadline = time.monotonic() + timeout
    waiting = set(owners)
    while True:
        waiting = {owner for owner in waiting if ownership.request_waiting(key, owner, lease)}
        if not waiting:
            return
        if time.monotonic() >= deadline:
            names = ", ".join(sorted(owner.decode("utf-8", "replace") for owner in waiting))
            log(db_id, f"node(s) {names} did not write their records through within {timeout:g} s "
                       "(dead or slow); their records as last written back")
            return
        time.sleep(POLL_SECONDS)
