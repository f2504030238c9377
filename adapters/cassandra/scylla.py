"""scylla: the cassandra adapter in its ScyllaDB dialect (``dbwrap_py:module =
scylla``, the same as ``cassandra`` with ``dialect = scylla``).

No ScyllaDB server can be had on the machine this is built on (not from
Debian, PyPI or Maven), so this dialect is tested against Apache Cassandra
only: what runs there is scylla-driver with the adapter. The branches that
need a ScyllaDB server are written from its documentation and have never
run; each says so.

What the dialect changes:

* **The driver**: scylla-driver, which opens a connection per shard of each
  node (shard-aware port) and sends a statement to the shard that owns its
  partition, and routes LWTs to the partition's replicas in a fixed order, so
  concurrent Paxos rounds on one partition meet at one coordinator
  (``PreparedStatement.is_lwt``). It installs the same ``cassandra`` package
  as cassandra-driver, so it lives in its own venv (``.venv-scylla``, setup.py
  extra ``scylla``); the bridge embeds the venv that runs ``dbwrap-py``, or
  the one ``dbwrap_py:venv`` names.
* **A ScyllaDB server** (known when scylla-driver learns its shards; never
  seen here):
  - it returns the old row from every conditional statement, applied or not
    (ScyllaDB docs, "How does ScyllaDB LWT differ from Apache Cassandra?"),
    so a take reads the record in the same round trip without guessing it;
  - it refuses LWTs in a keyspace that uses tablets (ScyllaDB docs,
    "Lightweight Transactions"), so the keyspace is made with tablets off.
"""

from __future__ import annotations

from dbwrap_py.adapters.cassandra.adapter import CassandraAdapter


class ScyllaAdapter(CassandraAdapter):
    dialect = "scylla"


ADAPTER = ScyllaAdapter
