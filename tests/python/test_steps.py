"""scripts/steps.py (make test's lanes and step table) and `make help`."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = ROOT / "scripts" / "steps.py"

MAKEFILE = """\
slow-a:
\t@echo a-begin; sleep 2; echo a-end
slow-b:
\t@echo b-begin; sleep 2; echo b-end
spin:
\t@$(spin)
detached:
\t@setsid -f sh -c '$(spin); touch spun'; i=0; \\
\twhile [ ! -e spun ] && [ $$i -lt 600 ]; do sleep 0.1; i=$$((i+1)); done; [ -e spun ]
# a daemon that leaves its step's process group, then the step waits
leaves-daemon:
\t@setsid -f sh -c 'echo $$$$ > daemon.pid; exec sleep 120'; sleep 60
# one second of CPU, however long that takes on a loaded machine
spin = python3 -c "import time; t = time.process_time(); all(iter(lambda: time.process_time() - t < 1, False))"
fails:
\t@echo about to fail; exit 3
after:
\t@echo after ran
meet-a:
\t@echo a-begin; touch a-began; $(call meet,b); echo a-end
meet-b:
\t@echo b-begin; touch b-began; $(call meet,a); echo b-end
# waits (up to 10 s) until the other step has begun: it ends only if both run at once
meet = i=0; while [ ! -e $(1)-began ] && [ $$i -lt 200 ]; do sleep 0.05; i=$$((i+1)); done; \
\t[ -e $(1)-began ] || { echo "$(1) never began while this step ran"; exit 1; }
"""


def run_steps(tmp_path: Path, *lanes: str) -> tuple[subprocess.CompletedProcess, float]:
    (tmp_path / "Makefile").write_text(MAKEFILE)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, str(STEPS), "--title", "t", "--logs", "logs", *lanes],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    return proc, time.monotonic() - start


def table_rows(output: str) -> dict[str, list[str]]:
    rows = {}
    for line in output.split("each step's wall and CPU time", 1)[1].splitlines()[2:]:
        fields = line.split()
        if not fields or fields[0] == "total":  # the table ends there
            break
        rows[fields[0]] = fields
    return rows


def test_lanes_run_side_by_side_and_outputs_do_not_interleave(tmp_path):
    # each step waits for the other to begin: run one after the other, both fail
    proc, _ = run_steps(tmp_path, "meet-a", "meet-b")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # each step's output comes whole, begin and end together
    for name in "ab":
        assert f"{name}-begin\n{name}-end\n" in proc.stdout
    assert proc.stdout.rstrip().endswith("steps: 2 passed, 0 failed")
    assert (tmp_path / "logs" / "meet-a.log").read_text() == "a-begin\na-end\n"


def test_steps_in_one_lane_run_one_after_the_other(tmp_path):
    """The broken example of the test above: in one lane, meet-a waits for
    a meet-b that only starts after it, and fails saying so."""
    proc, _ = run_steps(tmp_path, "meet-a meet-b")
    assert proc.returncode == 1
    assert "b never began while this step ran" in proc.stdout


def test_a_failed_step_fails_the_run_names_itself_and_the_lane_goes_on(tmp_path):
    proc, _ = run_steps(tmp_path, "fails after", "slow-a")
    assert proc.returncode == 1
    rows = table_rows(proc.stdout)
    assert rows["fails"][5:] == ["FAILED", "(exit", "2)"]  # make's status for a failed recipe
    assert rows["after"][5] == "passed" and rows["slow-a"][5] == "passed"
    assert "fails failed (exit 2); the last" in proc.stdout and "  | about to fail" in proc.stdout
    assert proc.stdout.rstrip().endswith("steps: 2 passed, 1 failed")


def test_each_step_has_a_wall_time(tmp_path):
    proc, _ = run_steps(tmp_path, "slow-a after")
    rows = table_rows(proc.stdout)
    assert float(rows["slow-a"][3]) >= 2 and float(rows["after"][2]) >= 2  # after starts once slow-a ends


def test_each_step_has_its_cpu_time_and_the_run_the_machines_busy_share(tmp_path):
    """A step that spends a second of CPU shows it; one that sleeps shows
    none (the broken example: CPU read from the wrong process)."""
    proc, _ = run_steps(tmp_path, "spin", "slow-a")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = table_rows(proc.stdout)
    assert float(rows["spin"][4]) >= 1 and float(rows["slow-a"][4]) < 0.5
    assert re.search(r"the machine's \d+ CPUs were busy \d+% of the run", proc.stdout)


def test_a_daemon_that_left_its_step_is_counted_in_its_cpu_time(tmp_path):
    """smbd and the servers detach from the make that started them; a step's
    cgroup still counts them. Where no cgroup can be made the table says
    its CPU is only that of the processes waited for (and then the daemon's
    second is missing: the broken example)."""
    proc, _ = run_steps(tmp_path, "detached")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if "CPU only of the processes waited for" in proc.stdout:
        assert float(table_rows(proc.stdout)["detached"][4]) < 0.5
    else:
        assert float(table_rows(proc.stdout)["detached"][4]) >= 1


def test_make_help_names_every_target_of_the_makefile():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):(?!=)", makefile, re.M))
    shown = subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "help"],
                           capture_output=True, text=True, check=True, timeout=30).stdout
    listed = set(re.findall(r"^  ([a-z][a-z0-9-]*) ", shown, re.M))
    assert targets - listed == set(), "targets make help does not list"
    assert {"Set-up", "Tests", "Demo", "Servers"} <= {line.split()[0] for line in shown.splitlines() if line
                                                      and not line.startswith(" ")}


def test_then_runs_alone_once_every_lane_has_ended(tmp_path):
    proc, _ = run_steps(tmp_path, "--then", "after", "slow-a", "slow-b")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = table_rows(proc.stdout)
    assert rows["after"][1] == "0"  # lane 0: alone
    ends = [float(rows[s][2]) + float(rows[s][3]) for s in ("slow-a", "slow-b")]
    assert float(rows["after"][2]) >= max(ends) - 0.5  # whole seconds in the table
    assert "then 1 alone (lane 0)" in proc.stdout


def test_then_runs_a_plus_b_side_by_side_and_alone(tmp_path):
    """--then "meet-a+meet-b after": the pair meets (each waits for the
    other to begin), and after starts only once both have ended. The
    broken example: "meet-a meet-b" in --then, one after the other, fails
    to meet (test_steps_in_one_lane_run_one_after_the_other)."""
    proc, _ = run_steps(tmp_path, "--then", "meet-a+meet-b after", "slow-a")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = table_rows(proc.stdout)
    assert rows["meet-a"][1] == rows["meet-b"][1] == "0"
    assert float(rows["meet-a"][2]) >= float(rows["slow-a"][3]) - 0.5  # after the lanes
    ends = [float(rows[s][2]) + float(rows[s][3]) for s in ("meet-a", "meet-b")]
    assert float(rows["after"][2]) >= max(ends) - 0.5


def test_a_stopped_run_kills_what_its_steps_left_behind(tmp_path):
    """SIGTERM to a run: its steps' process groups get SIGTERM, then what is
    left in their cgroups, a daemon in a session of its own included, is
    killed. Moved out and kept (before stop 55), such daemons outlived a
    stopped make test."""
    (tmp_path / "Makefile").write_text(MAKEFILE)
    proc = subprocess.Popen([sys.executable, str(STEPS), "--title", "t", "--logs", "logs", "leaves-daemon"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    daemon = None
    try:
        pid_file = tmp_path / "daemon.pid"
        for _ in range(200):
            if pid_file.exists() and pid_file.read_text().strip():
                break
            time.sleep(0.05)
        daemon = int(pid_file.read_text())
        if "dbwrap-steps-" not in Path(f"/proc/{daemon}/cgroup").read_text():
            pytest.skip("no cgroup v2 for the steps here: nothing to kill them by")
        proc.terminate()
        output, _ = proc.communicate(timeout=60)
        assert proc.returncode == 130, output
        for _ in range(100):
            if not Path(f"/proc/{daemon}").exists():
                break
            time.sleep(0.05)
        assert not Path(f"/proc/{daemon}").exists(), "the step's daemon outlived the stopped run"
        daemon = None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if daemon is not None:
            try:
                os.kill(daemon, signal.SIGKILL)
            except ProcessLookupError:
                pass
