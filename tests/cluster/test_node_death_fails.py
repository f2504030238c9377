"""The node-death check fails where it must: a cluster whose node agents
hold a dead node's records for 60 s does not free them within the 2 s lease
the check holds it to. (A module of its own, so its cluster does not run
beside test_node_death.py's.)"""

from __future__ import annotations

import pytest

from node_death import records_freed


def test_records_held_past_the_lease_fail_the_check(crash_outliving_its_lease):
    with pytest.raises(AssertionError, match="node 1's records still keep the survivors out"):
        records_freed(crash_outliving_its_lease)
