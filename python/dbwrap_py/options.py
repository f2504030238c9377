"""Adapter options: ``key=value`` strings from smb.conf or the command line.

smb.conf carries them as ``dbwrap_py:<option> = value`` (all databases) and
``dbwrap_py:<db>:<option> = value`` (one database); the bridge hands them
over already resolved for the database being opened, so an adapter only sees
plain names.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from dbwrap_py.errors import AdapterContractError, ConfigError
from dbwrap_py.safe_files import read_private_file

_TRUE = {"yes", "true", "1", "on"}
_FALSE = {"no", "false", "0", "off"}

#: Names whose value is a secret whatever a schema says (a password, a key
#: itself; not a path to one): the fallback for a path that shows options
#: without their adapter's schema (issue 39). ``key`` is the cephx key as a
#: Ceph client setting. A declared Option(secret=True) adds its own name.
SECRET_OPTIONS = frozenset({"password", "key"})
#: what a secret's value is shown as
REDACTED = "<secret>"
#: the value types an option may declare
KINDS: tuple[type, ...] = (str, int, float, bool, list)


@dataclasses.dataclass(frozen=True)
class Option:
    """One declared option: its name, value type, default when unset (None:
    the adapter works it out, ``help`` says how), an optional minimum for a
    number, and whether its value is a secret (never printed nor on argv)."""

    name: str
    kind: type = str
    default: Any = ""
    minimum: float | None = None
    secret: bool = False
    help: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS or self.name != self.name.strip().lower():
            raise AdapterContractError(f"option {self.name!r}: kind {self.kind!r} is not one of "
                                       "str, int, float, bool, list, or the name is not lower case")

    def parse(self, raw: str, minimum: float | None = None) -> Any:
        """``raw`` as this option's kind; ConfigError naming the option if it
        is not one, or is below the minimum (``minimum``: a stricter one)."""
        shown = shown_value(self.name, raw, (self,))
        if self.kind is bool:
            if raw.lower() in _TRUE | _FALSE:
                return raw.lower() in _TRUE
            raise ConfigError(f"option {self.name}={shown!r} is not a boolean (yes/no)")
        if self.kind is list:
            return [item.strip() for item in raw.replace(",", " ").split() if item.strip()]
        if self.kind is str:
            return raw
        try:
            value = self.kind(raw)
        except ValueError:
            raise ConfigError(f"option {self.name}={shown!r} is not a {self.kind.__name__}") from None
        return self.check(value, minimum)

    def check(self, value: Any, minimum: float | None = None) -> Any:
        """``value`` if it is at least the minimum (the declared one, and
        ``minimum`` when given), else ConfigError naming the option."""
        for bound in (self.minimum, minimum):
            if bound is not None and value < bound:
                shown = shown_value(self.name, str(value), (self,))
                raise ConfigError(f"option {self.name}={shown} is below the minimum {bound}")
        return value

    def with_default(self, default: Any) -> "Option":
        """The same option with another default (one adapter's)."""
        return dataclasses.replace(self, default=default)

    def describe(self) -> str:
        """One line for listings: name, type, default, minimum, secret, help."""
        default = "(adapter's)" if self.default is None else (
            REDACTED if self.secret and self.default else repr(self.default))
        parts = [f"{self.name}: {self.kind.__name__}, default {default}"]
        if self.minimum is not None:
            parts.append(f"minimum {self.minimum}")
        if self.secret:
            parts.append("secret")
        return ", ".join(parts) + (f" -- {self.help}" if self.help else "")


Schema = Iterable["Option | str"]


def schema_of(declared: Schema) -> dict[str, Option]:
    """Name -> Option; a bare name (an adapter that declares names only) is
    an untyped string option defaulting to ""."""
    options = (item if isinstance(item, Option) else Option(item.strip().lower()) for item in declared)
    return {option.name: option for option in options}


def is_secret(name: str, schema: Schema | None = None) -> bool:
    """Is option ``name`` a secret (its value never printed nor put on
    argv)? Its declaration in ``schema`` says so, and SECRET_OPTIONS are
    secret whatever any schema says."""
    name = name.strip().lower()
    declared = schema_of(schema or ()).get(name)
    return name in SECRET_OPTIONS or (declared is not None and declared.secret)


def shown_value(name: str, value: str, schema: Schema | None = None) -> str:
    """``value`` as it may be printed: a secret's is REDACTED."""
    return REDACTED if is_secret(name, schema) else value


def shown_options(pairs: Iterable[str] | Mapping[str, str], schema: Schema | None = None) -> str:
    """``key=value`` strings, or a mapping, as one printable line: secrets
    redacted; ``none`` when there are none. For every log line and message
    that shows options."""
    declared = tuple(schema_of(schema or ()).values())
    items = list(pairs.items()) if isinstance(pairs, Mapping) else [
        tuple(p.partition("=")[::2]) if "=" in p else (p, None) for p in pairs]
    shown = [name if value is None else f"{name}={shown_value(name, value, declared)}" for name, value in items]
    return " ".join(shown) or "none"


class Options(Mapping[str, str]):
    """Read-only option values with typed reads that fail clearly.

    An adapter declares its options (Adapter.options_schema: name, type,
    default, secret). Values for other names, or of the wrong type, are
    refused before the adapter is built; ``value`` reads one as its declared
    type, and reading an undeclared name is an adapter bug, reported at once.
    """

    def __init__(self, values: Mapping[str, str] | None = None, schema: Schema | None = None) -> None:
        """``schema``: read by it without refusing other names (for a reader
        that sees more options than one adapter's, such as the node agent)."""
        self._values = {k.strip().lower(): v.strip() for k, v in (values or {}).items()}
        self._declared: frozenset[str] | None = None
        self._schema: dict[str, Option] = schema_of(schema or ())

    def declare(self, schema: Schema) -> None:
        """Accept only the options in ``schema``, each of its type and at
        least its minimum; ConfigError names any other option or bad value."""
        declared = schema_of(schema)
        unknown = sorted(set(self._values) - set(declared))
        if unknown:
            valid = ", ".join(sorted(declared)) or "none"
            raise ConfigError(f"unknown option(s) {', '.join(unknown)} (valid: {valid})")
        for name, raw in self._values.items():
            declared[name].parse(raw)
        self._declared, self._schema = frozenset(declared), declared

    def value(self, key: str, minimum: float | None = None) -> Any:
        """Option ``key`` as its declared type; its declared default when
        unset. ``minimum``: a stricter bound this reader needs than the
        declared one. Reading an undeclared option is an adapter bug."""
        option = self._schema.get(key)
        if option is None:
            raise AdapterContractError(f"the adapter reads option {key!r} but does not declare it")
        raw = self._values.get(key)
        if raw is None:
            return list(option.default) if isinstance(option.default, list) else option.default
        return option.parse(raw, minimum)

    def adopt(self, schema: Schema) -> None:
        """Options built without ``declare`` (an adapter made directly, as
        tests and the node cache do) are read by ``schema`` too, other names
        still let be; declared ones are left as they are."""
        if self._declared is None:
            self._schema = {**self._schema, **schema_of(schema)}

    def with_schema(self, schema: Schema) -> "Options":
        """These values read by ``schema`` (over any schema they have), for
        a reader given options undeclared or declared for someone else (a
        client's from_options, an adapter's node_store)."""
        return Options(self._values, (*self.schema(), *schema_of(schema).values()))

    def schema(self) -> tuple[Option, ...]:
        """The options declared (or read by), in declaration order."""
        return tuple(self._schema.values())

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
        shown = {k: shown_value(k, v, self.schema()) for k, v in self._values.items()}
        return f"Options({shown!r})"

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
        raise ConfigError(f"option {key}={shown_value(key, raw, self.schema())!r} is not a boolean (yes/no)")

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
            shown = shown_value(key, raw, self.schema())
            raise ConfigError(f"option {key}={shown!r} is not a {kind.__name__}") from None


# -- credentials (issue 39) ---------------------------------------------------------

#: the options an adapter with a password declares (password_of reads them)
PASSWORD_OPTIONS = (
    Option("password", str, "", secret=True, help="the password itself; password_file is better"),
    Option("password_file", str, "", help="a file holding the password (0600, or in $CREDENTIALS_DIRECTORY)"),
    Option("allow_plaintext", bool, False, help="allow a password over a connection without TLS"),
)


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
    options = options.with_schema(PASSWORD_OPTIONS)
    direct, file = options.value("password"), options.value("password_file")
    if direct and file:
        raise ConfigError("options password and password_file: give one, not both")
    password = read_secret_file(file) if file else direct
    if password and not tls and not options.value("allow_plaintext"):
        given = "password_file" if file else "password"
        raise ConfigError(f"option {given}: the password would cross the network in clear text "
                          "(no TLS configured); configure TLS, or set allow_plaintext = yes")
    return password
