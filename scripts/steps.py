#!/usr/bin/env python3
"""Run make targets as timed steps, in lanes side by side, and end with a
table of each step's wall time and CPU time (make test, make check).

    scripts/steps.py [--title NAME] [--logs DIR] [--then TARGETS] LANE [LANE ...]

A LANE is one or more make targets separated by spaces, run one after the
other; the lanes run at the same time. --then's words run one after the
other once every lane has ended, with nothing beside them; a word
"a+b" runs targets a and b side by side (a step that leaves a core idle,
valgrind's, beside another). A step's output goes to
DIR/<step>.log and, whole, to the terminal when the step ends, so the
output of steps running side by side never interleaves. A failed step does
not stop the others: every step runs, the table shows each result, and the
exit status is 1 if any failed. Ctrl-C or SIGTERM ends every running step's
process group by its PID, then kills what is left in the steps' cgroups.

A step's CPU time is that of every process it started, daemons that left
their parent included: each step runs in a cgroup of its own (cgroup v2's
cpu.stat, where this user may make one; else only the processes that were
waited for, os.wait4, and the table says so). The last line says how busy
the machine's CPUs were over the run (/proc/stat), which tells a step that
waits from one that competes.

Standard library only: it runs before the venv exists.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

#: how much of a failed step's log the summary repeats
TAIL_LINES = 40


@dataclass
class Step:
    target: str
    lane: int
    start: float = 0.0
    wall: float = 0.0
    cpu: float = 0.0
    returncode: int | None = None
    log: Path | None = None

    @property
    def state(self) -> str:
        if self.returncode is None:
            return "not run"
        return "passed" if self.returncode == 0 else f"FAILED (exit {self.returncode})"


class CpuAccounts:
    """One cgroup v2 per step, in a folder of this run's inside this
    process's own cgroup (so a run inside a step, make test-conformance in
    make test, is counted in that step too), for its CPU time; none
    (``self.base`` None) where cgroup2 is not mounted or not writable.
    Processes left in a step's cgroup at the end move back to this
    process's, so every folder made here is removed."""

    def __init__(self) -> None:
        self.base: Path | None = None
        own = _own_cgroup()
        if own is None:
            return
        try:
            base = own / f"dbwrap-steps-{os.getpid()}"
            base.mkdir()
        except OSError:
            return
        self.own, self.base = own, base

    def argv(self, step: str, argv: list[str]) -> list[str]:
        """``argv`` run inside the step's cgroup (its first process moves
        itself in before it execs, so every descendant is counted)."""
        if self.base is None:
            return argv
        group = self.base / step
        group.mkdir(exist_ok=True)
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(group / "cgroup.procs"), *argv]

    def seconds(self, step: str) -> float | None:
        if self.base is None:
            return None
        try:
            for line in (self.base / step / "cpu.stat").read_text().splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) / 1e6
        except (OSError, ValueError):
            pass
        return None

    def close(self, kill: bool = False) -> None:
        """Deepest first: a run inside a step (make test-conformance) may
        have been stopped before it removed its own. ``kill`` (the run was
        stopped): what is left in a step's cgroup, daemons that left their
        step's process group included, is killed, not kept."""
        if self.base is None:
            return
        for folder, _, _ in os.walk(self.base, topdown=False):
            group = Path(folder)
            try:
                if kill:
                    _kill_members(group)
                for pid in (group / "cgroup.procs").read_text().split():
                    (self.own / "cgroup.procs").write_text(pid)
                group.rmdir()
            except OSError:
                pass


def _kill_members(group: Path, wait: float = 5.0) -> None:
    """SIGKILL every process in ``group`` (cgroup.kill, Linux 5.14 on; by
    PID before), and wait up to ``wait`` seconds until it is empty."""
    try:
        (group / "cgroup.kill").write_text("1")
    except OSError:
        for pid in (group / "cgroup.procs").read_text().split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
    until = time.monotonic() + wait
    while (group / "cgroup.procs").read_text().split() and time.monotonic() < until:
        time.sleep(0.05)


def _own_cgroup() -> Path | None:
    """This process's cgroup v2 folder ("0::/path" in /proc/self/cgroup,
    under cgroup2's mount), or None."""
    try:
        with open("/proc/self/mounts") as mounts:
            mount = next((Path(f[1]) for f in map(str.split, mounts) if len(f) > 2 and f[2] == "cgroup2"), None)
        with open("/proc/self/cgroup") as groups:
            path = next((line.strip()[3:] for line in groups if line.startswith("0::")), None)
    except OSError:
        return None
    if mount is None or path is None:
        return None
    return mount / path.lstrip("/")


class Runner:
    def __init__(self, lanes: list[list[str]], then: list[str], logs: Path, title: str) -> None:
        self.lanes = [[Step(target, n) for target in lane] for n, lane in enumerate(lanes, 1)]
        #: run once the lanes have ended, each group alone ("lane 0" in the table)
        self.then = [[Step(target, 0) for target in word.split("+") if target] for word in then]
        self.logs = logs
        self.title = title
        self.print_lock = threading.Lock()
        self.running: dict[str, subprocess.Popen] = {}
        self.stopping = False
        self.t0 = time.monotonic()
        self.cpu0 = machine_cpu()
        self.accounts = CpuAccounts()

    def say(self, text: str) -> None:
        with self.print_lock:
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
            sys.stdout.flush()

    def run_lane(self, steps: list[Step]) -> None:
        for step in steps:
            if self.stopping:
                return
            self.run_step(step)

    def run_step(self, step: Step) -> None:
        step.log = self.logs / f"{step.target}.log"
        step.start = time.monotonic() - self.t0
        self.say(f"==> {self.title}: {step.target} started (lane {step.lane}, at {step.start:.0f} s)")
        with open(step.log, "wb") as out:
            process = subprocess.Popen(
                self.accounts.argv(step.target, ["make", "--no-print-directory", step.target]),
                stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            self.running[step.target] = process
            _, status, usage = os.wait4(process.pid, 0)
            process.returncode = step.returncode = os.waitstatus_to_exitcode(status)
            counted = self.accounts.seconds(step.target)
            step.cpu = usage.ru_utime + usage.ru_stime if counted is None else counted
            self.running.pop(step.target, None)
        step.wall = time.monotonic() - self.t0 - step.start
        text = step.log.read_text(errors="replace")
        self.say(f"---- {step.target} (lane {step.lane}): its output ----\n{text}"
                 f"<== {self.title}: {step.target} {step.state} in {step.wall:.0f} s ({step.cpu:.0f} CPU s)")

    def on_sigterm(self, signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    def end_running(self) -> None:
        """End every running step's process group (by the leader's PID)."""
        self.stopping = True
        for process in list(self.running.values()):
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def run(self) -> int:
        try:
            return self._run()
        finally:
            self.accounts.close(kill=self.stopping)

    def _run(self) -> int:
        self.logs.mkdir(parents=True, exist_ok=True)
        threads = [threading.Thread(target=self.run_lane, args=(lane,), daemon=True) for lane in self.lanes]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.5)
            self.run_then()
        except KeyboardInterrupt:
            self.end_running()
            for thread in threads:
                thread.join(30)
            self.summary()
            return 130
        return self.summary()

    def run_then(self) -> None:
        for group in self.then:
            if self.stopping:
                return
            threads = [threading.Thread(target=self.run_step, args=(step,), daemon=True) for step in group]
            for thread in threads:
                thread.start()
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.5)

    def summary(self) -> int:
        steps = [step for lane in self.lanes for step in lane] + [step for group in self.then for step in group]
        total = time.monotonic() - self.t0
        failed = [s for s in steps if s.returncode not in (0, None)]
        after = f", then {len(self.then)} alone (lane 0)" if self.then else ""  # a group counts once
        counted = "" if self.accounts.base is not None else "; CPU only of the processes waited for"
        lines = ["", f"{self.title}: each step's wall and CPU time ({len(self.lanes)} lanes side by side"
                     f"{after}{counted})",
                 f"  {'step':<28} {'lane':>4} {'start s':>8} {'wall s':>8} {'CPU s':>7}  result"]
        for step in sorted(steps, key=lambda s: (s.returncode is None, s.start)):
            lines.append(f"  {step.target:<28} {step.lane:>4} {step.start:>8.0f} {step.wall:>8.0f} "
                         f"{step.cpu:>7.0f}  {step.state}")
        lines.append(f"  {'total':<28} {'':>4} {'':>8} {total:>8.0f} {sum(s.cpu for s in steps):>7.0f}")
        busy = busy_share(self.cpu0, machine_cpu())
        if busy is not None:
            lines.append(f"  the machine's {os.cpu_count()} CPUs were busy {busy:.0%} of the run")
        for step in failed:
            lines.append(f"\n{step.target} failed (exit {step.returncode}); the last {TAIL_LINES} "
                         f"lines of {step.log}:")
            tail = step.log.read_text(errors="replace").splitlines()[-TAIL_LINES:] if step.log else []
            lines.extend(f"  | {line}" for line in tail)
        passed = sum(s.returncode == 0 for s in steps)
        lines.append(f"steps: {passed} passed, {len(steps) - passed} failed")
        self.say("\n".join(lines))
        return 0 if passed == len(steps) else 1


def machine_cpu() -> tuple[int, int] | None:
    """(busy, total) jiffies of every CPU since boot, from /proc/stat's first
    line; None where there is no /proc/stat."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = sum(fields[3:5])  # idle, iowait
    total = sum(fields[:8])  # user .. steal; guest time is counted in user
    return total - idle, total


def busy_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--title", default="make test")
    parser.add_argument("--logs", type=Path, default=Path("results/test-steps"))
    parser.add_argument("--then", default="", metavar="TARGETS",
                        help="make targets run in order once every lane has ended; a+b: side by side")
    parser.add_argument("lanes", nargs="+", metavar="LANE",
                        help="make targets separated by spaces, run in order")
    args = parser.parse_args(argv)
    lanes = [lane.split() for lane in args.lanes if lane.split()]
    runner = Runner(lanes, args.then.split(), args.logs, args.title)
    signal.signal(signal.SIGTERM, runner.on_sigterm)
    return runner.run()


if __name__ == "__main__":
    sys.exit(main())
