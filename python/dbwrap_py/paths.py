"""Where the built C libraries are: build/ of this checkout, or $DBWRAP_PY_BUILD."""

from __future__ import annotations

import os
from pathlib import Path

from dbwrap_py.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]


def build_dir() -> Path:
    return Path(os.environ.get("DBWRAP_PY_BUILD", REPO_ROOT / "build"))


def preload_library() -> Path:
    path = build_dir() / "libdbwrap_py_preload.so"
    if not path.exists():
        raise ConfigError(f"{path} is missing: run make")
    return path
