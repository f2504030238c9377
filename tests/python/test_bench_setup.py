"""Which adapters the benchmarks run, and their options."""

from contextlib import ExitStack

from dbwrap_py.bench.targets import (display_name, landed_adapters, over_transports, parse_adapters,
                                     split_options)


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


def test_make_bench_takes_every_networked_adapter_with_a_throwaway_server():
    """make bench runs --adapters auto: the servers' adapters are in it, so
    its ratio table has a column for each (their servers start only when run)."""
    shared = parse_adapters("auto", multi_process_only=True)
    assert {"etcd", "rados", "cassandra", "zookeeper"} <= set(shared)


def test_a_proxy_result_says_fast_path_only_where_smbd_reaches_a_write_back_cache():
    proxy = {"transport": "proxy"}
    assert display_name("etcd", {**proxy, "node_cache": "yes"}) == "etcd via proxy, fast path"
    assert display_name("etcd", {**proxy, "node_cache": "yes", "proxy_fastpath": "no"}) == "etcd via proxy"
    assert display_name("etcd", {**proxy, "node_cache": "write-through"}) == "etcd via proxy"
    assert display_name("tdb", proxy) == "tdb via proxy"
    assert display_name("etcd", {"node_cache": "yes"}) == "etcd"


def test_the_proxy_transport_turns_the_fast_path_off_and_proxy_fastpath_on():
    with ExitStack() as stack:  # a named socket: no throwaway daemon is started
        runs = over_transports(stack, {"sqlite": {"proxy_socket": "/nonexistent"}},
                               ["inproc", "proxy", "proxy-fastpath"], say=print)
    assert [(o["transport"], o.get("proxy_fastpath")) for _, o in runs] == [
        ("inproc", None), ("proxy", "no"), ("proxy", "yes")]
