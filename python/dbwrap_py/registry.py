"""Find an adapter class by short name (``tdb``) or dotted module path.

A short name is an entry point in the ``dbwrap_py.adapters`` group, so an
adapter can ship as its own pip package::

    [project.entry-points."dbwrap_py.adapters"]
    myadapter = "mypkg.myadapter:MyAdapter"

The built-in adapters (the top-level ``adapters/`` folder) register there
too, in setup.py. A name with a dot is imported as a module, which is how a
user prototypes a new backend without packaging it; the module names its
adapter class in ``ADAPTER``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata

from dbwrap_py.adapter import Adapter
from dbwrap_py.errors import ConfigError

ENTRY_POINT_GROUP = "dbwrap_py.adapters"


@functools.cache
def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    # Scanning the installed distributions costs some 25 ms; once per process
    # (smbd's children inherit it from the parent that opened the databases).
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def adapter_names() -> list[str]:
    """Every registered adapter, built in or installed as a package."""
    return sorted(_entry_points())


def _checked(cls: object, where: str) -> type[Adapter]:
    if not (isinstance(cls, type) and issubclass(cls, Adapter)):
        raise ConfigError(f"{where} names no dbwrap_py.Adapter subclass")
    return cls


def _from_module(name: str) -> type[Adapter]:
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            raise ConfigError(f"unknown adapter {name!r}: no module {exc.name!r}") from exc
        raise ConfigError(f"adapter {name!r} failed to import: {exc}") from exc
    except Exception as exc:  # a broken adapter module must not take the host down
        raise ConfigError(f"adapter {name!r} failed to import: {type(exc).__name__}: {exc}") from exc
    if not hasattr(module, "ADAPTER"):
        raise ConfigError(f"module {name} has no ADAPTER naming a dbwrap_py.Adapter subclass")
    return _checked(module.ADAPTER, f"module {name}'s ADAPTER")


def _from_entry_point(name: str) -> type[Adapter]:
    entry_point = _entry_points().get(name)
    if entry_point is None:
        known = ", ".join(adapter_names()) or "none"
        raise ConfigError(f"unknown adapter {name!r} (registered: {known}; a dotted name"
                          " imports a module with ADAPTER)")
    try:
        cls = entry_point.load()
    except Exception as exc:  # a broken adapter package must not take the host down
        raise ConfigError(f"adapter {name!r} failed to import ({entry_point.value}):"
                          f" {type(exc).__name__}: {exc}") from exc
    return _checked(cls, f"entry point {name} = {entry_point.value}")


def find_adapter(name: str) -> type[Adapter]:
    """The adapter class for ``name``; ConfigError says why if there is none."""
    name = name.strip()
    if not name:
        raise ConfigError("no adapter named (dbwrap_py:module is empty)")
    return _from_module(name) if "." in name else _from_entry_point(name)
