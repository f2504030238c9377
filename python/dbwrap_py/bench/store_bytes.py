"""What a throwaway backend holds, in bytes, read from the store itself
(benchmarks only: `make bench-ca-cluster`'s bytes per persistent open).

Everything the store holds counts, whichever adapter or node wrote it:
records, their copies, and the adapters' own keys (record locks, node
leases, bucket claims, openers), because that is what the store keeps for
them. Not counted: the store's own overhead (etcd's revisions and bbolt
pages, an OSD's object metadata, Cassandra's row and cell headers). One
copy: a store of several replicas keeps as many.

* etcd: every key and value (one range over the whole key space);
* rados: every object of the pool: its data, omap keys and values, xattrs;
* cassandra: every row of the keyspace's tables, each column as the driver
  returns it (bytes and text by length, numbers 8 bytes, UUIDs 16).
"""

from __future__ import annotations

import base64
import json
import urllib.request
import uuid
from collections.abc import Callable, Mapping

from dbwrap_py.options import Options


def etcd_bytes(options: Mapping[str, str]) -> int:
    endpoint = options["endpoints"].split(",")[0]
    if "://" not in endpoint:
        endpoint = f"http://{endpoint}"
    everything = base64.b64encode(b"\0").decode()
    request = urllib.request.Request(f"{endpoint}/v3/kv/range",
                                     json.dumps({"key": everything, "range_end": everything}).encode())
    with urllib.request.urlopen(request, timeout=30) as reply:
        kvs = json.load(reply).get("kvs", [])
    return sum(len(base64.b64decode(kv["key"])) + len(base64.b64decode(kv.get("value", ""))) for kv in kvs)


def rados_bytes(options: Mapping[str, str]) -> int:
    import rados

    from dbwrap_py.adapters.rados.client import ClientConfig

    config = ClientConfig.from_options(options, 10.0)
    client = config.connect()
    try:
        ioctx = client.open_ioctx(config.pool)
        try:
            ioctx.set_namespace(rados.LIBRADOS_ALL_NSPACES)
            objects = [(obj.nspace, obj.key) for obj in ioctx.list_objects()]
            total = 0
            for nspace, key in objects:
                ioctx.set_namespace(nspace)
                total += len(key) + ioctx.stat(key)[0]
                total += sum(len(name) + len(value) for name, value in ioctx.get_xattrs(key))
                total += _omap_bytes(ioctx, key)
            return total
        finally:
            ioctx.close()
    finally:
        client.shutdown()


def _omap_bytes(ioctx, key: str, page: int = 1000) -> int:
    import rados

    total, after = 0, ""
    while True:
        with rados.ReadOpCtx() as op:
            entries, _ = ioctx.get_omap_vals(op, after, "", page)
            ioctx.operate_read_op(op, key)
            got = [(k, v) for k, v in entries]
        total += sum(len(k) + len(v or b"") for k, v in got)
        if len(got) < page:
            return total
        after = got[-1][0]


def _cell_bytes(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, (bytes, bytearray, str)):
        return len(value)
    if isinstance(value, uuid.UUID):
        return 16
    if isinstance(value, (int, float, bool)):
        return 8
    if isinstance(value, (list, tuple, set, frozenset)):
        return sum(_cell_bytes(v) for v in value)
    if isinstance(value, Mapping):
        return sum(_cell_bytes(k) + _cell_bytes(v) for k, v in value.items())
    return len(str(value))


def cassandra_bytes(options: Mapping[str, str]) -> int:
    from dbwrap_py.adapters.cassandra.client import ClientConfig, session_for

    config = ClientConfig.from_options(Options(dict(options)), 30.0)
    session = session_for(config).session
    tables = [row.table_name for row in session.execute(
        "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s", (config.keyspace,))]
    return sum(_cell_bytes(tuple(row)) for table in tables
               for row in session.execute(f"SELECT * FROM {config.keyspace}.{table}"))


#: by adapter
COUNTERS: dict[str, Callable[[Mapping[str, str]], int]] = {
    "etcd": etcd_bytes, "rados": rados_bytes, "cassandra": cassandra_bytes,
}


def store_bytes(adapter: str, options: Mapping[str, str]) -> int:
    """Everything the adapter's store holds (see above); KeyError for an adapter not here."""
    return COUNTERS[adapter](options)
