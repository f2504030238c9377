"""Adapter options: ``key=value`` strings from smb.conf or the command line.

smb.conf carries them as ``dbwrap_py:<option> = value`` (all databases) and
``dbwrap_py:<db>:<option> = value`` (one database); the bridge hands them
over already resolved for the database being opened, so an adapter only sees
plain names.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from dbwrap_py.errors import AdapterContractError, ConfigError

_TRUE = {"yes", "true", "1", "on"}
_FALSE = {"no", "false", "0", "off"}


class Options(Mapping[str, str]):
    """Read-only option values with typed getters that fail clearly.

    An adapter declares its option names (Adapter.option_names). Values for
    other names are refused before the adapter is built, and reading an
    undeclared name is an adapter bug, reported at once.
    """

    def __init__(self, values: Mapping[str, str] | None = None) -> None:
        self._values = {k.strip().lower(): v.strip() for k, v in (values or {}).items()}
        self._declared: frozenset[str] | None = None

    def declare(self, names: Iterable[str]) -> None:
        """Accept only ``names``; ConfigError names any other given option."""
        declared = frozenset(n.lower() for n in names)
        unknown = sorted(set(self._values) - declared)
        if unknown:
            valid = ", ".join(sorted(declared)) or "none"
            raise ConfigError(f"unknown option(s) {', '.join(unknown)} (valid: {valid})")
        self._declared = declared

    @classmethod
    def parse(cls, pairs: Iterable[str]) -> "Options":
        """Build from ``key=value`` strings; a string without ``=`` is an error."""
        values: dict[str, str] = {}
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if not sep or not key.strip():
                raise ConfigError(f"option {pair!r} is not of the form key=value")
            values[key] = value
        return cls(values)

    def __getitem__(self, key: str) -> str:
        return self._values[self._check(key)]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Options({self._values!r})"

    def get_str(self, key: str, default: str) -> str:
        return self._values.get(self._check(key), default)

    def get_int(self, key: str, default: int, minimum: int | None = None) -> int:
        value = self._number(key, default, int)
        if minimum is not None and value < minimum:
            raise ConfigError(f"option {key}={value} is below the minimum {minimum}")
        return value

    def get_float(self, key: str, default: float, minimum: float | None = None) -> float:
        value = self._number(key, default, float)
        if minimum is not None and value < minimum:
            raise ConfigError(f"option {key}={value} is below the minimum {minimum}")
        return value

    def get_bool(self, key: str, default: bool) -> bool:
        raw = self._values.get(self._check(key))
        if raw is None:
            return default
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        raise ConfigError(f"option {key}={raw!r} is not a boolean (yes/no)")

    def get_list(self, key: str, default: list[str]) -> list[str]:
        raw = self._values.get(self._check(key))
        if raw is None:
            return list(default)
        return [item.strip() for item in raw.replace(",", " ").split() if item.strip()]

    def _check(self, key: str) -> str:
        if self._declared is not None and key not in self._declared:
            raise AdapterContractError(f"the adapter reads option {key!r} but does not declare it")
        return key

    def _number(self, key, default, kind):
        raw = self._values.get(self._check(key))
        if raw is None:
            return default
        try:
            return kind(raw)
        except ValueError:
            raise ConfigError(f"option {key}={raw!r} is not a {kind.__name__}") from None
