"""Run the conformance driver (build/dbwrap_check) against one adapter.

The driver does the checking, through Samba's real dbwrap front end; this
module chooses its arguments from what the adapter declares, starts the
adapter's throwaway server when no endpoint is given, and reads back one
JSON line per check.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dbwrap_py.adapter import Capabilities
from dbwrap_py.bench.targets import display_name
from dbwrap_py.errors import ConfigError
from dbwrap_py.nodecache.adapter import declared_capabilities
from dbwrap_py.paths import bridge_environment, build_dir
from dbwrap_py.registry import find_adapter
from dbwrap_py.servers import ServerError, backend_options
from dbwrap_py.testing.hooks import hooks_for

#: the whole suite is bounded; each check is bounded inside the driver
SUITE_TIMEOUT_SECONDS = 1800


@dataclass(frozen=True)
class CheckResult:
    name: str
    rule: str
    result: str  # "pass", "fail" or "skip"
    note: str = ""
    measured: str = ""
    ms: int = 0


@dataclass
class SuiteRun:
    target: str
    capabilities: Capabilities | None  # None for native tdb
    results: list[CheckResult] = field(default_factory=list)
    log: str = ""  # what the bridge and the adapter wrote to stderr

    def by_name(self) -> dict[str, CheckResult]:
        return {r.name: r for r in self.results}

    def names(self, result: str) -> set[str]:
        return {r.name for r in self.results if r.result == result}

    @property
    def ok(self) -> bool:
        return bool(self.results) and not self.names("fail")


def driver_path() -> Path:
    path = build_dir() / "dbwrap_check"
    if not path.exists():
        raise ConfigError(f"{path} is missing: run make")
    return path


def checker_path() -> Path | None:
    """The Porcupine checker, if it was built (make builds it)."""
    path = build_dir() / "linearizability"
    return path if path.exists() else None


def list_checks() -> list[tuple[str, str]]:
    """Every check's name and rule, in the driver's order."""
    out = subprocess.run([str(driver_path()), "--list"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    return [(d["check"], d["rule"]) for d in map(json.loads, out.splitlines())]


def _capability_args(caps: Capabilities) -> list[str]:
    args = [f"--lock-release={caps.lock_release_seconds}"]
    if not caps.multi_process:
        args.append("--single-process")
    if not caps.transactions:
        args.append("--no-transactions")
    if caps.max_value_size:
        args.append(f"--max-value={caps.max_value_size}")
    return args


def _over_transport(caps: Capabilities, options: Mapping[str, str]) -> Capabilities:
    """In proxy mode a dead process's record locks are the daemon's to free,
    at once, whatever the adapter's own lease."""
    if options.get("transport") != "proxy":
        return caps
    return dataclasses.replace(caps, lock_release_seconds=0.0, notes=(
        *caps.notes, "transport = proxy: the node daemon holds the record locks and frees a "
                     "process's when its connection closes"))


def _all_skipped(adapter: str, only: Sequence[str], why: str) -> SuiteRun:
    checks = [(name, rule) for name, rule in list_checks() if not only or name in only]
    caps = find_adapter(adapter).capabilities
    return SuiteRun(adapter, caps, [CheckResult(name, rule, "skip", why) for name, rule in checks])


def _parse(out: str) -> list[CheckResult]:
    results = []
    for line in out.splitlines():
        d = json.loads(line)
        results.append(CheckResult(d["check"], d["rule"], d["result"], d["note"],
                                   d["measured"], d["ms"]))
    return results


def _agent_log(options: Mapping[str, str]) -> str:
    """A throwaway node agent's log, read before its directory goes."""
    cache_dir = options.get("node_cache_dir")
    log = Path(cache_dir) / "agent.log" if cache_dir else None
    if log is None or not log.exists():
        return ""
    text = log.read_text(errors="replace")
    return f"\nnode agent log ({log.name}):\n{text}" if text.strip() else ""


def run_suite(
    adapter: str | None,
    options: Mapping[str, str] | None = None,
    only: Sequence[str] = (),
    pythonpath: Sequence[str] = (),
) -> SuiteRun:
    """Run the checks on ``adapter`` (None: Samba's native tdb, the reference)."""
    options = dict(options or {})
    env = bridge_environment()
    if pythonpath:
        env["DBWRAP_PY_PATH"] = os.pathsep.join(
            [*pythonpath, *filter(None, [env.get("DBWRAP_PY_PATH")])])
    # DBWRAP_PY_CHECK_PREFIX: a command to run the driver under (make test-memcheck: valgrind)
    args = [*shlex.split(os.environ.get("DBWRAP_PY_CHECK_PREFIX", "")), str(driver_path())]
    checker = checker_path()
    if checker is not None:
        args.append(f"--checker={checker}")
    args += [f"--only={name}" for name in only]
    with contextlib.ExitStack() as stack:
        if adapter is None:
            caps = None
            args.append("--native")
        else:
            try:
                options = stack.enter_context(backend_options(adapter, options))
            except ServerError as exc:
                return _all_skipped(adapter, only, f"needs a server, and none could be started: {exc}")
            caps = _over_transport(declared_capabilities(find_adapter(adapter), options), options)
            args += [f"--adapter={adapter}", *_capability_args(caps)]
            args += [f"--option={k}={v}" for k, v in options.items()]
        proc = subprocess.run(args, capture_output=True, text=True, env=env,
                              timeout=SUITE_TIMEOUT_SECONDS)
        log = proc.stderr + _agent_log(options)
    target = display_name(adapter, options) if adapter else "native tdb"
    run = SuiteRun(target, caps, _parse(proc.stdout), log)
    if proc.returncode != 0:
        raise ConfigError(f"dbwrap_check exited {proc.returncode}: {proc.stderr.strip()}")
    return run


def run_suites(
    adapter: str,
    options: Mapping[str, str],
    variants: Sequence[Mapping[str, str]],
    only: Sequence[str] = (),
    pythonpath: Sequence[str] = (),
) -> list[SuiteRun]:
    """The suite on ``options``, then on each variant of them (its options
    added, such as ``node_cache=yes``), all on one throwaway store when the
    adapter starts one: a Cassandra or a Ceph starts once for every table.
    Each table's databases have paths of their own, so their records never
    meet in the store; what sits beside the store (a node agent, a node
    daemon) is each table's own."""
    server = hooks_for(adapter).throwaway_server(options)
    with contextlib.ExitStack() as stack:
        try:
            reach = {} if server is None else stack.enter_context(server)
        except ServerError as exc:
            return [_all_skipped(adapter, only, f"needs a server, and none could be started: {exc}")]
        return [run_suite(adapter, {**options, **variant, **reach}, only=only, pythonpath=pythonpath)
                for variant in ({}, *variants)]
