"""Find an adapter class by short name (``tdb``) or dotted module path.

A short name is a module in the ``dbwrap_py.adapters`` package (the top-level
``adapters/`` folder). Anything with a dot is imported as it is, which is how a
user prototypes a new backend without touching this repository.
A module names its adapter class in ``ADAPTER``.
"""

from __future__ import annotations

import importlib
import pkgutil

from dbwrap_py.adapter import Adapter
from dbwrap_py.errors import ConfigError

BUILTIN_PACKAGE = "dbwrap_py.adapters"


def module_name(name: str) -> str:
    name = name.strip()
    if not name:
        raise ConfigError("no adapter named (dbwrap_py:module is empty)")
    return name if "." in name else f"{BUILTIN_PACKAGE}.{name}"


def find_adapter(name: str) -> type[Adapter]:
    """The adapter class for ``name``; ConfigError says why if there is none."""
    modname = module_name(name)
    try:
        module = importlib.import_module(modname)
    except ModuleNotFoundError as exc:
        if exc.name and modname.startswith(exc.name):
            known = ", ".join(builtin_names())
            raise ConfigError(f"unknown adapter {name!r} (built in: {known})") from exc
        raise ConfigError(f"adapter {name!r} failed to import: {exc}") from exc
    except Exception as exc:  # a broken adapter module must not take the host down
        raise ConfigError(f"adapter {name!r} failed to import: {type(exc).__name__}: {exc}") from exc
    cls = getattr(module, "ADAPTER", None)
    if not (isinstance(cls, type) and issubclass(cls, Adapter)):
        raise ConfigError(f"module {modname} has no ADAPTER naming a dbwrap_py.Adapter subclass")
    return cls


def builtin_names() -> list[str]:
    package = importlib.import_module(BUILTIN_PACKAGE)
    return sorted(m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_"))
