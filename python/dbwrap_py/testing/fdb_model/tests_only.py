"""The model of FoundationDB's server serves test runs only.

It has no replication and no durability, takes any local user's connection
and unmarshals what arrives: not a store for a real Samba. Its server
refuses to start unless the environment says this is a test run, which
only the throwaway server (``throwaway.model_server``) says, to the server
it starts. (The model's client reaches nothing else: its cluster file must
name a unix socket, ``<description>@unix:<path>``, or
``<description>@tcp:<IPv4 address>:<port>``, which no real FoundationDB
cluster file does: theirs is ``<description>:<id>@<ip>:<port>,...``.)
"""

from __future__ import annotations

import os

from dbwrap_py.errors import ConfigError

ENV = "DBWRAP_PY_FDB_MODEL"
MARK = "tests-only"


def test_run_environment() -> dict[str, str]:
    """This process's environment, marked as a test run's."""
    return {**os.environ, ENV: MARK}


def require_test_run(what: str) -> None:
    """ConfigError unless this process was started as part of a test run."""
    if os.environ.get(ENV) != MARK:
        raise ConfigError(f"{what} serves tests only (no replication, no durability), and this is not "
                          f"a test run ({ENV}={MARK} is set by the throwaway server, "
                          "dbwrap_py.testing.fdb_model.throwaway): refused")
