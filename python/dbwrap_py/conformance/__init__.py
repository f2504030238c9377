"""The adapter conformance suite: is Samba safe on this adapter?

``dbwrap-py check ADAPTER [-o k=v ...]`` runs every check through the C
bridge and Samba's real dbwrap front end, starting the adapter's throwaway
server when no endpoint is given, and prints check against result. The same
checks are a pytest plugin (dbwrap_py.conformance.pytest_plugin).

The checks themselves are C, in conformance/ (build/dbwrap_check). The
examples in dbwrap_py.conformance.broken each break one rule, to prove the
suite fails when it should.
"""

from dbwrap_py.conformance.runner import CheckResult, SuiteRun, list_checks, run_suite, run_suites

__all__ = ["CheckResult", "SuiteRun", "list_checks", "run_suite", "run_suites"]
