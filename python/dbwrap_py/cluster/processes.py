"""A cluster's processes, found by session: every server it starts (ctdbd,
smbd, a node agent, the backend's server) leads a session of its own
(``start_new_session``), and whatever a server forks stays in that session,
also when it is reparented to init (ctdb's helpers, samba-dcerpcd). So the
sessions say which processes are the cluster's, and whether any outlived it.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from pathlib import Path

from dbwrap_py.bench.memory import PROC, children_of


def _stat_fields(stat: str) -> list[str]:
    """/proc/<pid>/stat after the command name (which may hold spaces):
    state, ppid, pgrp, session, ..."""
    return stat.rpartition(")")[2].split()


def in_sessions(leaders: Collection[int], proc: Path = PROC) -> dict[int, str]:
    """Live processes (zombies are dead) in the sessions ``leaders`` lead:
    {PID: command line}."""
    found = {}
    wanted = set(leaders)
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = _stat_fields((entry / "stat").read_text())
            if fields[0] != "Z" and int(fields[3]) in wanted:
                found[int(entry.name)] = _command(entry)
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return found


#: clock ticks per second, for /proc/<pid>/stat's CPU times
_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(leaders: Collection[int], proc: Path = PROC) -> dict[str, float]:
    """CPU seconds (user and system) used so far by the live processes in
    the sessions ``leaders`` lead, by command name ("smbd", "ctdbd",
    "etcd", ...), with the children each has reaped: smbd's exited client
    processes count in their parent's. A benchmark takes two readings and
    their difference."""
    used: dict[str, float] = {}
    wanted = set(leaders)
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = _stat_fields(stat)
            if fields[0] == "Z" or int(fields[3]) not in wanted:
                continue
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            ticks = sum(int(field) for field in fields[11:15])  # utime stime cutime cstime
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        used[name] = used.get(name, 0.0) + ticks / _TICKS
    return used


def still_running(processes: Mapping[int, str], proc: Path = PROC) -> dict[int, str]:
    """Those of ``processes`` (from in_sessions) that still run: the same PID,
    not a zombie, the same command line (not a reused PID)."""
    running = {}
    for pid, command in processes.items():
        entry = proc / str(pid)
        try:
            if _stat_fields((entry / "stat").read_text())[0] != "Z" and _command(entry) == command:
                running[pid] = command
        except (OSError, IndexError):
            continue
    return running


def session_leading_children(proc: Path = PROC) -> set[int]:
    """This process's children that lead a session of their own (a child in
    our session would make in_sessions name this process and its kin)."""
    leaders = set()
    for pid in children_of(os.getpid(), proc):
        try:
            if int(_stat_fields((proc / str(pid) / "stat").read_text())[3]) == pid:
                leaders.add(pid)
        except (OSError, ValueError, IndexError):
            continue
    return leaders


def _command(entry: Path) -> str:
    return (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
