"""The conformance checks as pytest tests, for an adapter's own CI.

In a test module of the adapter's repository::

    from dbwrap_py.conformance.pytest_plugin import conformance_tests

    test_my_adapter = conformance_tests("mypackage.myadapter", pythonpath=["src"])

Each check becomes one test. It passes, fails with the driver's evidence,
or is skipped with the reason the adapter declared. The suite runs once per
adapter and options in a session; the adapter's throwaway server, if it has
one, is started for that run and stopped after it.

The package registers this module as a pytest plugin, which adds two
command-line options, so one test file can run against a real deployment:

    pytest --dbwrap-option endpoints=10.0.0.5:2379 [--dbwrap-adapter NAME]

Under pytest-xdist with ``--dist loadgroup``, one conformance_tests()'s
checks share an ``xdist_group``, so its suite runs once, on one worker,
beside the other adapters' suites on the other workers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import pytest

from dbwrap_py.conformance.runner import SuiteRun, list_checks, run_suite

_runs: dict[tuple, SuiteRun] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dbwrap_py", "dbwrap_py adapter conformance")
    group.addoption("--dbwrap-adapter", help="run conformance_tests() on this adapter instead")
    group.addoption("--dbwrap-option", action="append", default=[], metavar="K=V",
                    help="adapter option for conformance_tests() (repeatable); "
                         "an endpoint here means no throwaway server")


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist registers the mark itself; without it the mark does nothing
    config.addinivalue_line("markers", "xdist_group(name): pytest-xdist's --dist loadgroup "
                                       "runs the tests of one group on one worker")


def _group(adapter: str | None, options: Mapping[str, str] | None, pythonpath: Sequence[str]) -> str:
    """One name per suite run: its checks on one worker, which runs it once."""
    given = ",".join(f"{k}={v}" for k, v in sorted((options or {}).items()))
    return f"conformance:{adapter or 'native'}:{given}:{':'.join(pythonpath)}"


def _suite(adapter: str | None, options: Mapping[str, str], pythonpath: Sequence[str]) -> SuiteRun:
    key = (adapter, tuple(sorted(options.items())), tuple(pythonpath))
    if key not in _runs:
        _runs[key] = run_suite(adapter, options, pythonpath=pythonpath)
    return _runs[key]


def conformance_tests(
    adapter: str | None,
    options: Mapping[str, str] | None = None,
    pythonpath: Sequence[str] = (),
) -> Callable[..., None]:
    """A test function, parametrized with every check, for ``adapter``.

    ``adapter`` None runs the checks on Samba's native tdb, the reference.
    """
    names = [name for name, _ in list_checks()]

    @pytest.mark.xdist_group(_group(adapter, options, pythonpath))
    @pytest.mark.parametrize("check", names)
    def test_conformance(check: str, request: pytest.FixtureRequest) -> None:
        chosen = request.config.getoption("--dbwrap-adapter", None) or adapter
        given = dict(o.split("=", 1) for o in request.config.getoption("--dbwrap-option", []))
        run = _suite(chosen, {**(options or {}), **given}, pythonpath)
        result = run.by_name().get(check)
        assert result is not None, f"the driver reported nothing for {check}"
        if result.result == "skip":
            pytest.skip(f"{chosen}: {result.note}")
        assert result.result == "pass", f"{chosen}: {check} ({result.rule}): {result.note}"

    return test_conformance
