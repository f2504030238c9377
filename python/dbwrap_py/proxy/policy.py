"""What a peer of the proxy daemon may open: the daemon's configuration decides.

An OPEN carries a database path, tdb and open flags, a mode, an adapter
name and options, all from the socket's peer. Without a configuration the
daemon serves root (and its own user) alone, who could do all of that
anyway. With ``--config FILE`` (the only way to start it with ``--group``),
this module is the one place an OPEN is judged (issue 39):

* the path must be absolute, hold no ``..``, and its directory, resolved
  (realpath), must lie inside one of the configured ``directories``; the
  file itself must not be a symbolic link;
* the adapter and its options come from the first ``[database PATTERN]``
  section whose pattern (fnmatch) matches the file's name; the adapter the
  peer names must be that one, compared as a string before anything is
  imported (a peer never makes the daemon import a module); each option the
  peer sends must be one the section gives, with the same value
  (``node_cache_dir`` included: the daemon makes directories only where its
  configuration says);
* open flags may only be ``O_RDONLY``/``O_RDWR`` and ``O_CREAT``
  (``O_TRUNC``, ``O_EXCL``, ``O_APPEND``, ... refused);
* the mode is masked with 0o666 (no set-id, sticky or execute bits);
* the name is normalised (``//`` and ``/./`` go): one file, one shared
  Database and one lock table.

The file::

    [daemon]
    directories = /var/lib/samba/lock /var/lib/samba/private

    [database *]
    adapter = etcd
    endpoints = https://etcd1:2379
    password_file = /etc/samba/dbwrap_py-etcd.password

It is refused (``UnsafePath``) when it is a link, not root's (or the
effective user's), writable by group or others, or readable by them while
it holds a secret (``password``, ``key``).
"""

from __future__ import annotations

import configparser
import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path

from dbwrap_py.errors import AccessDenied, ConfigError, UnsafePath
from dbwrap_py.options import is_secret
from dbwrap_py.safe_files import read_private_file

#: the open flags smbd uses; anything else from a peer is refused
ALLOWED_OPEN_FLAGS = os.O_RDONLY | os.O_RDWR | os.O_CREAT
#: the mode bits a peer may ask for
MODE_MASK = 0o666
_SECTION = "database "


@dataclass(frozen=True)
class DatabaseRule:
    pattern: str
    adapter: str
    options: dict[str, str]


@dataclass(frozen=True)
class Admitted:
    """An OPEN as the daemon will make it."""

    name: str
    open_flags: int
    mode: int
    adapter: str
    options: list[str]


class DaemonConfig:
    """The daemon's ``--config``: the directories it serves and the adapter
    and options of each database name pattern."""

    def __init__(self, path: str, directories: list[str], rules: list[DatabaseRule]) -> None:
        self.path = path
        self.directories = directories
        self.rules = rules

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "DaemonConfig":
        where = os.fspath(path)
        try:
            data, mode = read_private_file(where, "the proxy daemon's --config", refused_bits=0o022)
        except OSError as exc:
            raise ConfigError(f"--config {where!r}: {exc.strerror}") from None
        parser = configparser.ConfigParser(interpolation=None, delimiters=("=",),
                                           comment_prefixes=("#",), inline_comment_prefixes=None)
        parser.optionxform = str  # type: ignore[assignment,method-assign]
        try:
            parser.read_string(data.decode("utf-8"), source=where)
        except (configparser.Error, UnicodeDecodeError) as exc:
            raise ConfigError(f"--config {where!r}: {exc}") from None
        if not parser.has_option("daemon", "directories"):
            raise ConfigError(f"--config {where!r}: no [daemon] directories = ... (the directories "
                              "whose databases the daemon serves)")
        directories = []
        for directory in parser.get("daemon", "directories").split():
            if not os.path.isabs(directory):
                raise ConfigError(f"--config {where!r}: directory {directory!r} is not absolute")
            resolved = os.path.realpath(directory)
            if not os.path.isdir(resolved):
                raise ConfigError(f"--config {where!r}: directory {directory!r} is not a directory")
            directories.append(resolved)
        rules = []
        for section in parser.sections():
            if section == "daemon":
                continue
            if not section.startswith(_SECTION):
                raise ConfigError(f"--config {where!r}: unknown section [{section}] "
                                  "(known: [daemon], [database PATTERN])")
            items = dict(parser.items(section))
            adapter = items.pop("adapter", "").strip()
            if not adapter:
                raise ConfigError(f"--config {where!r}: [{section}] names no adapter (adapter = NAME)")
            secret = [key for key in items if is_secret(key)]
            if secret and mode & 0o044:
                raise UnsafePath(f"--config {where!r} has mode {mode:04o} and holds {', '.join(secret)}: "
                                 "readable by group or others; refused (chmod 0600)")
            rules.append(DatabaseRule(section[len(_SECTION):].strip(), adapter, items))
        if not rules:
            raise ConfigError(f"--config {where!r}: no [database PATTERN] section: the daemon would "
                              "serve nothing")
        return cls(where, directories, rules)

    # -- one OPEN -------------------------------------------------------------------

    def admit(self, name: str, open_flags: int, mode: int, adapter: str,
              options: list[str]) -> Admitted:
        """The OPEN the daemon makes of a peer's, or AccessDenied naming why not."""
        self._check_path(name)
        extra = open_flags & ~ALLOWED_OPEN_FLAGS
        if extra or open_flags & os.O_ACCMODE not in (os.O_RDONLY, os.O_RDWR):
            raise AccessDenied(f"OPEN of {name}: open flags {open_flags:#o} refused: only O_RDONLY or "
                               f"O_RDWR, and O_CREAT, are allowed (extra bits {extra:#o}; O_TRUNC is "
                               f"{os.O_TRUNC:#o})")
        rule = self._rule(name)
        if adapter.strip() != rule.adapter:
            raise AccessDenied(f"OPEN of {name}: adapter {adapter!r} asked, but the daemon's --config "
                               f"{self.path} serves [database {rule.pattern}] with {rule.adapter!r}: "
                               "refused (the daemon imports no module a peer names)")
        for option in options:
            key, eq, value = option.partition("=")
            key = key.strip()
            if key not in rule.options or not eq or rule.options[key].strip() != value.strip():
                shown = "<secret>" if is_secret(key) else value.strip()
                configured = rule.options.get(key)
                has = ("none" if configured is None else
                       "<secret>" if is_secret(key) else repr(configured.strip()))
                raise AccessDenied(f"OPEN of {name}: option {key}={shown} sent, but the daemon's --config "
                                   f"{self.path} [database {rule.pattern}] has {key}: {has}: refused "
                                   "(a peer's options must match the configuration's)")
        # one spelling per file (no '//' or '/./'): the daemon's table shares a Database by its name
        return Admitted(os.path.normpath(name), open_flags, mode & MODE_MASK, rule.adapter,
                        [f"{key}={value}" for key, value in rule.options.items()])

    def _check_path(self, name: str) -> None:
        if not os.path.isabs(name):
            raise AccessDenied(f"OPEN of {name!r}: not an absolute path: refused")
        if ".." in Path(name).parts:
            raise AccessDenied(f"OPEN of {name}: the path holds '..': refused")
        directory = os.path.realpath(os.path.dirname(name))
        if not any(directory == allowed or directory.startswith(allowed.rstrip("/") + "/")
                   for allowed in self.directories):
            raise AccessDenied(f"OPEN of {name}: its directory {directory} is outside the daemon's "
                               f"directories ({', '.join(self.directories)}, --config {self.path}): refused")
        if os.path.islink(name):
            raise UnsafePath(f"OPEN of {name}: it is a symbolic link (to {os.readlink(name)}): refused, "
                             "the daemon opens no database through a link")

    def _rule(self, name: str) -> DatabaseRule:
        base = os.path.basename(name)
        for rule in self.rules:
            if fnmatch.fnmatchcase(base, rule.pattern):
                return rule
        raise AccessDenied(f"OPEN of {name}: no [database PATTERN] section of the daemon's --config "
                           f"{self.path} matches {base!r}: refused")
