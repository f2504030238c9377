"""Where the built C libraries are: build/ of this checkout, or $DBWRAP_PY_BUILD;
and which venv the bridge embeds."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from dbwrap_py.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]


def build_dir() -> Path:
    return Path(os.environ.get("DBWRAP_PY_BUILD", REPO_ROOT / "build"))


def built_samba_release() -> str:
    """The Samba release the build was made for (the Makefile's stamp)."""
    return (build_dir() / "samba-version").read_text().split()[0]


def preload_library() -> Path:
    path = build_dir() / "libdbwrap_py_preload.so"
    if not path.exists():
        raise ConfigError(f"{path} is missing: run make")
    return path


def open_loop_program() -> Path:
    """build/smb_open_loop, make bench-elastic's SMB client (bench/smb_open_loop.c)."""
    path = build_dir() / "smb_open_loop"
    if not path.exists():
        raise ConfigError(f"{path} is missing: run make build/smb_open_loop "
                          "(it needs libsmbclient-dev, which make deps installs)")
    return path


def bridge_environment() -> dict[str, str]:
    """This process's environment for a bridged child (smbd, the conformance
    driver): the bridge embeds the venv running us, unless DBWRAP_PY_VENV
    names one (else it takes .venv beside the library). A dialect whose
    driver needs a venv of its own (scylla: .venv-scylla) then just works."""
    env = dict(os.environ)
    if sys.prefix != sys.base_prefix:
        env.setdefault("DBWRAP_PY_VENV", sys.prefix)
    return env
