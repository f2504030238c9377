"""Which adapters the benchmarks run, and their options."""

from dbwrap_py.bench.targets import landed_adapters, parse_adapters, split_options


def test_split_options_per_adapter_and_for_all():
    options = split_options(["etcd:endpoints=127.0.0.1:2379", "timeout=5",
                             "locking.tdb:lease=2"], ["etcd", "sqlite"])
    assert options == {
        "etcd": {"endpoints": "127.0.0.1:2379", "timeout": "5", "locking.tdb:lease": "2"},
        "sqlite": {"timeout": "5", "locking.tdb:lease": "2"},
    }


def test_adapter_specific_option_wins_over_the_general_one():
    options = split_options(["timeout=5", "sqlite:timeout=9"], ["sqlite", "tdb"])
    assert options == {"sqlite": {"timeout": "9"}, "tdb": {"timeout": "5"}}


def test_parse_adapters_drops_native_and_auto_lists_landed_ones():
    assert parse_adapters("tdb, native,sqlite") == ["tdb", "sqlite"]
    landed = landed_adapters()
    assert landed[0] == "tdb" and "memory" in landed
    shared = parse_adapters("auto", multi_process_only=True)
    assert "memory" not in shared and "tdb" in shared
