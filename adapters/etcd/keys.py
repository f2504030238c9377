"""The etcd adapter's key layout, in one place.

For option ``prefix`` (default ``dbwrap_py``), with ``<db>`` =
``DatabaseSpec.cluster_name`` (``<basename>@<hash of the absolute path>``,
or with ``cluster_name = file`` the basename) and ``<bb>`` the record's bucket
(two hex digits, dbwrap_py.nodecache.layout.bucket_of)::

    <prefix>/<db>/d/<bb>/<key>   a record (raw key bytes: etcd keys are bytes)
    <prefix>/<db>/l/<bb>/<key>   the record's lock, on its holder's lease
    <prefix>/<db>/b/<bb>         a node's claim on the bucket, on its node lease
    <prefix>/<db>/x/<bb>/<key>   a key of a claimed bucket detached from it
    <prefix>/<db>/t              the transaction lock (persistent databases)
    <prefix>/<db>/s              sequence number key, rewritten by every write
    <prefix>/<db>/o/<owner>      one per open of a volatile database, on a lease
    <prefix>/<db>/w              rewritten by each TDB_CLEAR_IF_FIRST wipe
    <prefix>/_nodes/<node>       a node agent's registration, on its node lease
    <prefix>/_nodes/<node>/r/<db>/<key>   a release request to the node, on
                                          the requester's lease

Records and locks sit under their bucket, so "nothing of bucket bb is
locked or detached" is one range compare in a claim. Each sub-prefix of a
database differs in its first byte, so a range read of ``d/`` never returns
a lock key.
"""

from __future__ import annotations

from dbwrap_py.nodecache.layout import bucket_of
from dbwrap_py.options import Options

DEFAULT_PREFIX = "dbwrap_py"
#: the lock key value of a node owning a record or bucket: node:<name>:<lease hex>
NODE_MARK = b"node:"


def prefix_option(options: Options) -> bytes:
    """Option ``prefix``, its slashes stripped (``DEFAULT_PREFIX`` when not given)."""
    return options.get_str("prefix", DEFAULT_PREFIX).strip("/").encode()


def prefix_end(prefix: bytes) -> bytes:
    """The first key after every key that starts with ``prefix``."""
    end = bytearray(prefix)
    while end and end[-1] == 0xFF:
        end.pop()
    if not end:
        return b"\0"
    end[-1] += 1
    return bytes(end)


def node_marker(node: bytes, lease_id: int) -> bytes:
    return NODE_MARK + node + b":%x" % lease_id


def marker_node(marker: bytes) -> bytes | None:
    """The node named by a lock or claim value, or None if a process holds it."""
    if not marker.startswith(NODE_MARK):
        return None
    return marker[len(NODE_MARK):].rpartition(b":")[0] or None


def _bb(number: int) -> bytes:
    return b"%02x/" % number


class DatabaseKeys:
    """The keys of one database."""

    def __init__(self, prefix: bytes, db: bytes) -> None:
        self.prefix = prefix
        self.db = db
        self.base = prefix + b"/" + db + b"/"
        self.data_prefix = self.base + b"d/"
        self.locks_prefix = self.base + b"l/"
        self.buckets_prefix = self.base + b"b/"
        self.detached_prefix = self.base + b"x/"
        self.txn = self.base + b"t"
        self.seq = self.base + b"s"
        self.openers_prefix = self.base + b"o/"
        self.wiped = self.base + b"w"

    def data(self, key: bytes) -> bytes:
        return self.data_prefix + _bb(bucket_of(key)) + key

    def lock(self, key: bytes) -> bytes:
        return self.locks_prefix + _bb(bucket_of(key)) + key

    def detached(self, key: bytes) -> bytes:
        return self.detached_prefix + _bb(bucket_of(key)) + key

    def bucket(self, number: int) -> bytes:
        return self.buckets_prefix + _bb(number)[:-1]

    def bucket_data(self, number: int) -> bytes:
        return self.data_prefix + _bb(number)

    def bucket_locks(self, number: int) -> bytes:
        return self.locks_prefix + _bb(number)

    def bucket_detached(self, number: int) -> bytes:
        return self.detached_prefix + _bb(number)

    @staticmethod
    def record_key(data_key: bytes, data_prefix: bytes) -> bytes:
        """The record's key in a data key (after ``d/<bb>/``)."""
        return data_key[len(data_prefix) + 3:]


def nodes_prefix(prefix: bytes) -> bytes:
    return prefix + b"/_nodes/"


def registration(prefix: bytes, node: bytes) -> bytes:
    return nodes_prefix(prefix) + node


def requests_prefix(prefix: bytes, node: bytes) -> bytes:
    return nodes_prefix(prefix) + node + b"/r/"


def request(prefix: bytes, node: bytes, db: bytes, key: bytes) -> bytes:
    return requests_prefix(prefix, node) + db + b"/" + key


def parse_request(prefix: bytes, node: bytes, request_key: bytes) -> tuple[bytes, bytes] | None:
    """(db, key) of a request key; None if it is not one."""
    head = requests_prefix(prefix, node)
    if not request_key.startswith(head):
        return None
    db, sep, key = request_key[len(head):].partition(b"/")
    return (db, key) if sep and db else None
