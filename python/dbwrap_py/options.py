"""Adapter options: ``key=value`` strings from smb.conf or the command line.

smb.conf carries them as ``dbwrap_py:<option> = value`` (all databases) and
``dbwrap_py:<db>:<option> = value`` (one database); the bridge hands them
over already resolved for the database being opened, so an adapter only sees
plain names.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from dbwrap_py.errors import AdapterContractError, ConfigError
from dbwrap_py.safe_files import read_private_file

_TRUE = {"yes", "true", "1", "on"}
_FALSE = {"no", "false", "0", "off"}

#: Options whose value is a secret (a password, a key itself; not a path to
#: one). The one list: repr, logs, messages and the node agent's argv use it
#: (issue 39). ``key`` is the cephx key as a Ceph client setting.
SECRET_OPTIONS = frozenset({"password", "key"})
#: what a secret's value is shown as
REDACTED = "<secret>"


def is_secret(name: str) -> bool:
    """Is option ``name`` a secret (its value never printed nor put on argv)?"""
    return name.strip().lower() in SECRET_OPTIONS


def shown_value(name: str, value: str) -> str:
    """``value`` as it may be printed: a secret's is REDACTED."""
    return REDACTED if is_secret(name) else value


def shown_options(pairs: Iterable[str] | Mapping[str, str]) -> str:
    """``key=value`` strings, or a mapping, as one printable line: secrets
    redacted; ``none`` when there are none. For every log line and message
    that shows options."""
    items = list(pairs.items()) if isinstance(pairs, Mapping) else [
        tuple(p.partition("=")[::2]) if "=" in p else (p, None) for p in pairs]
    shown = [name if value is None else f"{name}={shown_value(name, value)}" for name, value in items]
    return " ".join(shown) or "none"


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
        return f"Options({ {k: shown_value(k, v) for k, v in self._values.items()}!r})"

    __str__ = __repr__

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
        raise ConfigError(f"option {key}={shown_value(key, raw)!r} is not a boolean (yes/no)")

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
            raise ConfigError(f"option {key}={shown_value(key, raw)!r} is not a {kind.__name__}") from None


# -- credentials (issue 39) ---------------------------------------------------------

#: the options an adapter with a password declares besides ``password``
PASSWORD_OPTIONS = ("password", "password_file", "allow_plaintext")


def read_secret_file(path: str | Path, option: str = "password_file") -> str:
    """The secret in ``path``, one trailing newline stripped.

    A relative name is looked up in ``$CREDENTIALS_DIRECTORY`` when that is
    set (systemd's LoadCredential=), else it is refused: the working
    directory of smbd says nothing. safe_files.read_private_file's rules
    apply: no link, owned by root or the effective uid, and no access at
    all for group or others (else UnsafePath naming it and its mode)."""
    path = Path(path)
    if not path.is_absolute():
        credentials = os.environ.get("CREDENTIALS_DIRECTORY")
        if not credentials:
            raise ConfigError(f"option {option}={str(path)!r} is relative and $CREDENTIALS_DIRECTORY "
                              "is not set: give an absolute path")
        path = Path(credentials) / path
    try:
        data, _ = read_private_file(path, f"option {option}:", refused_bits=0o077)
    except OSError as exc:
        raise ConfigError(f"option {option}: cannot read {str(path)!r}: {exc.strerror}") from None
    text = data.decode("utf-8", errors="strict")
    return text[:-1] if text.endswith("\n") else text


def password_of(options: Options, tls: bool) -> str:
    """The password ``options`` give, "" if none: ``password_file`` (read
    now), or ``password`` itself (kept for old smb.conf files; a file is
    better: smb.conf is often world-readable). Both at once are refused,
    and so is a password over a connection without TLS unless
    ``allow_plaintext = yes``."""
    direct, file = options.get_str("password", ""), options.get_str("password_file", "")
    if direct and file:
        raise ConfigError("options password and password_file: give one, not both")
    password = read_secret_file(file) if file else direct
    if password and not tls and not options.get_bool("allow_plaintext", False):
        given = "password_file" if file else "password"
        raise ConfigError(f"option {given}: the password would cross the network in clear text "
                          "(no TLS configured); configure TLS, or set allow_plaintext = yes")
    return password
