"""The scylla dialect. No ScyllaDB server can be had here: against Apache
Cassandra, in the scylla-driver venv (make venv-scylla), it must behave as
the cassandra dialect, with scylla-driver underneath; in the main venv
(cassandra-driver) it must refuse to open, saying why."""

from __future__ import annotations

import pytest

pytest.importorskip("cassandra")

from dbwrap_py.adapter import TDB_CLEAR_IF_FIRST, DatabaseSpec  # noqa: E402
from dbwrap_py.adapters.cassandra import client as cc  # noqa: E402
from dbwrap_py.adapters.cassandra.scylla import ScyllaAdapter  # noqa: E402
from dbwrap_py.errors import ConfigError  # noqa: E402
from dbwrap_py.options import Options  # noqa: E402

pytestmark = pytest.mark.server


def test_without_scylla_driver_the_dialect_refuses_to_open(tmp_path):
    if cc.scylla_driver():
        pytest.skip("this venv has scylla-driver")
    with pytest.raises(ConfigError, match="scylla-driver"):
        ScyllaAdapter(DatabaseSpec(str(tmp_path / "t.tdb")), Options({"contact_points": "127.0.0.1:1"}))


def test_with_scylla_driver_on_cassandra_the_dialect_works_as_cassandra(tmp_path):
    if not cc.scylla_driver():
        pytest.skip("needs scylla-driver: .venv-scylla/bin/python -m pytest (make venv-scylla)")
    from dbwrap_py.testing.servers.cassandra import CassandraCluster

    with CassandraCluster(nodes=1) as cluster:
        db = ScyllaAdapter(DatabaseSpec(str(tmp_path / "t.tdb"), tdb_flags=TDB_CLEAR_IF_FIRST),
                           Options(cluster.options()))
        session = cc.session_for(db.config)
        # Cassandra sends no shard information: shard awareness and the old-row take stay off
        assert not session.cluster.is_shard_aware()
        assert not session.scylla_server and not db.old_row
        before = db.round_trips
        assert db.lock_get(b"k") is None
        db.put_unlock(b"k", b"v")
        assert db.get(b"k") == b"v"
        assert db.round_trips - before == 3
        db.close()
        cc.close_all()
