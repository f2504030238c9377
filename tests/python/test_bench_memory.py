"""bench memory: smaps_rollup, smbd's children, and the gain over native."""

import json

from dbwrap_py.bench.memory import (MemoryRow, ProcessMemory, children_of, daemon_pid, gains,
                                    parent_pid, parse_smaps_rollup, process_memory, summarize, table_lines,
                                    write_json)

ROLLUP = """\
55d1c0a2e000-7ffd5e3f8000 ---p 00000000 00:00 0                          [rollup]
Rss:               24880 kB
Pss:                4702 kB
Pss_Anon:           3120 kB
Shared_Clean:      18000 kB
"""


def test_parse_smaps_rollup_reads_the_kib_fields():
    fields = parse_smaps_rollup(ROLLUP)
    assert fields["Rss"] == 24880 and fields["Pss"] == 4702 and fields["Pss_Anon"] == 3120
    assert "55d1c0a2e000-7ffd5e3f8000 ---p 00000000 00" not in fields


def test_parent_pid_survives_spaces_and_brackets_in_the_name():
    assert parent_pid("4242 (smbd: client [127.0.0.1]) S 4000 4000 4000 0 -1") == 4000


def test_children_and_memory_from_a_proc_folder(tmp_path):
    for pid, ppid in ((10, 1), (11, 10), (12, 10), (13, 11)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (smbd) S {ppid} 1 1 0")
    (tmp_path / "self").mkdir()
    (tmp_path / "12" / "smaps_rollup").write_text(ROLLUP)
    (tmp_path / "12" / "status").write_text("Name:\tsmbd\nThreads:\t7\nSigQ:\t0/1\n")
    assert children_of(10, tmp_path) == {11, 12}
    assert process_memory(12, tmp_path) == ProcessMemory(12, 24880, 4702, threads=7)
    assert process_memory(11, tmp_path) is None


def rows():
    native = summarize("native", 16, [ProcessMemory(1, 15000, 2000), ProcessMemory(2, 15400, 2200, 3)],
                       ProcessMemory(0, 30000, 9000))
    bridged = summarize("bridge+tdb", 16, [ProcessMemory(3, 25000, 4100)], None)
    return [native, bridged]


def test_summarize_means_medians_and_total():
    native, bridged = rows()
    assert native == MemoryRow("native", 16, 2, 15200.0, 15200.0, 2100.0, 2100.0, 4200, 30000, 9000,
                               threads_median=2)
    assert bridged.parent_rss_kib == 0 and bridged.pss_kib_total == 4100


def test_gain_is_per_process_against_native_at_the_same_count():
    (gain,) = gains(rows())
    assert gain == {"backend": "bridge+tdb", "connections": 16, "pss_gain_kib": 2000.0,
                    "rss_gain_kib": 9800.0, "pss_ratio": 1.95, "pss_gain_with_daemon_kib": 2000.0}
    lines = table_lines(rows())
    assert lines[1].split()[-3:] == ["-", "2", "-"]  # no gain for native; median threads; no daemon
    assert lines[2].split()[-5:] == ["+2000", "KiB", "(1.95x)", "1", "-"]


def test_a_daemon_is_reported_apart_and_shared_out_over_its_connections():
    native = rows()[0]
    proxied = summarize("bridge+tdb via proxy", 16, [ProcessMemory(3, 15600, 2150)] * 2, None,
                        daemon=ProcessMemory(9, 40000, 32000, threads=11))
    assert (proxied.daemon_rss_kib, proxied.daemon_pss_kib, proxied.daemon_threads) == (40000, 32000, 11)
    (gain,) = gains([native, proxied])
    assert gain["pss_gain_kib"] == 50.0 and gain["pss_gain_with_daemon_kib"] == 50.0 + 32000 / 2
    assert table_lines([native, proxied])[2].endswith("39.1/31.2, 11")


def test_daemon_pid_is_found_by_its_socket(tmp_path):
    for pid, argv in ((20, [b"python3", b"-m", b"dbwrap_py.proxy.daemon", b"--socket", b"/a.sock"]),
                      (21, [b"dbwrap-py", b"proxy-daemon", b"--socket", b"/b.sock"]),
                      (22, [b"cat", b"/b.sock"])):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cmdline").write_bytes(b"\0".join(argv) + b"\0")
    assert daemon_pid("/b.sock", tmp_path) == 21
    assert daemon_pid("/a.sock", tmp_path) == 20
    assert daemon_pid("/c.sock", tmp_path) is None


def test_json_holds_rows_and_gains(tmp_path):
    write_json(tmp_path / "m.json", rows())
    data = json.loads((tmp_path / "m.json").read_text())
    assert [r["backend"] for r in data["rows"]] == ["native", "bridge+tdb"]
    assert data["gains"][0]["pss_ratio"] == 1.95
