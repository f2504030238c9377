"""Which tests share a pytest-xdist worker when make test-python runs the
files side by side (``--dist loadgroup``).

Every test is in its file's group, so a file runs on one worker and its
module-scoped server starts once. Every test that runs a Cassandra is in
one group instead, one after the other on one worker: a Cassandra is a JVM
that keeps a core busy while it starts and serves, and several at once on 2
cores starved the node agents of their 2 s leases (measured in a make test
with the files spread over 4 workers: a node lease that lapsed, a record
handed over in 0.72 s where the test allows 0.5, a node agent that took
more than 15 s to come up).
"""

from __future__ import annotations

import pytest


def _runs_cassandra(item: pytest.Item) -> bool:
    if item.path.stem.startswith("test_cassandra") or item.path.stem == "test_scylla_dialect":
        return True
    callspec = getattr(item, "callspec", None)  # test_node_cache's backends, one parameter each
    return callspec is not None and "cassandra" in callspec.params.values()


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group("cassandra" if _runs_cassandra(item) else item.path.stem))
