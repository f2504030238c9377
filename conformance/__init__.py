"""The adapter conformance suite: is Samba safe on this adapter?

``dbwrap-py check ADAPTER [-o k=v ...]`` runs every check through the C
bridge and Samba's real dbwrap front end, starting the adapter's throwaway
server when no endpoint is given, and prints check against result. The same
checks are a pytest plugin (dbwrap_py.conformance.pytest_plugin).

The whole suite lives in the top-level conformance/ folder; this folder is
installed as the package dbwrap_py.conformance (setup.py), what is not
Python stays out of it:

- ``runner.py`` (runs the driver for one adapter), ``report.py`` (the
  table), ``pytest_plugin.py`` (conformance_tests(), for an adapter's own CI);
- ``broken/``: adapters that each break one rule, to prove the suite fails
  when it should;
- ``checks/``: the checks themselves, C through Samba's dbwrap front end,
  built by the Makefile into build/dbwrap_check;
- ``linearizability/``: the Go checker of the histories (build/linearizability);
- ``tests/``: the suite's own tests (make test-conformance-local).
"""

from dbwrap_py.conformance.runner import CheckResult, SuiteRun, list_checks, run_suite, run_suites

__all__ = ["CheckResult", "SuiteRun", "list_checks", "run_suite", "run_suites"]
