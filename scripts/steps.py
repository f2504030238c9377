#!/usr/bin/env python3
"""Run make targets as timed steps, in lanes side by side, and end with a
table of each step's wall time and CPU time (make test, make check).

    scripts/steps.py [--title NAME] [--logs DIR] [--then TARGETS] LANE [LANE ...]

A LANE is one or more make targets separated by spaces, run one after the
other; the lanes run at the same time. --then's targets run one after the
other once every lane has ended, with nothing beside them. A step's output goes to
DIR/<step>.log and, whole, to the terminal when the step ends, so the
output of steps running side by side never interleaves. A failed step does
not stop the others: every step runs, the table shows each result, and the
exit status is 1 if any failed. Ctrl-C or SIGTERM ends every running step's
process group by its PID.

A step's CPU time is its make's and every process under it that was waited
for (os.wait4); the last line says how busy the machine's CPUs were over the
run (/proc/stat), which tells a step that waits from one that competes.

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


class Runner:
    def __init__(self, lanes: list[list[str]], then: list[str], logs: Path, title: str) -> None:
        self.lanes = [[Step(target, n) for target in lane] for n, lane in enumerate(lanes, 1)]
        #: run alone once the lanes have ended ("lane 0" in the table)
        self.then = [Step(target, 0) for target in then]
        self.logs = logs
        self.title = title
        self.print_lock = threading.Lock()
        self.running: dict[str, subprocess.Popen] = {}
        self.stopping = False
        self.t0 = time.monotonic()
        self.cpu0 = machine_cpu()

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
                ["make", "--no-print-directory", step.target], stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            self.running[step.target] = process
            _, status, usage = os.wait4(process.pid, 0)
            process.returncode = step.returncode = os.waitstatus_to_exitcode(status)
            step.cpu = usage.ru_utime + usage.ru_stime
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
        self.logs.mkdir(parents=True, exist_ok=True)
        threads = [threading.Thread(target=self.run_lane, args=(lane,), daemon=True) for lane in self.lanes]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.5)
            self.run_lane(self.then)
        except KeyboardInterrupt:
            self.end_running()
            for thread in threads:
                thread.join(30)
            self.summary()
            return 130
        return self.summary()

    def summary(self) -> int:
        steps = [step for lane in self.lanes for step in lane] + self.then
        total = time.monotonic() - self.t0
        failed = [s for s in steps if s.returncode not in (0, None)]
        after = f", then {len(self.then)} alone (lane 0)" if self.then else ""
        lines = ["", f"{self.title}: each step's wall and CPU time ({len(self.lanes)} lanes side by side{after})",
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
                        help="make targets run in order once every lane has ended")
    parser.add_argument("lanes", nargs="+", metavar="LANE",
                        help="make targets separated by spaces, run in order")
    args = parser.parse_args(argv)
    lanes = [lane.split() for lane in args.lanes if lane.split()]
    runner = Runner(lanes, args.then.split(), args.logs, args.title)
    signal.signal(signal.SIGTERM, runner.on_sigterm)
    return runner.run()


if __name__ == "__main__":
    sys.exit(main())
