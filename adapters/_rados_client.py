"""The RADOS adapter's plumbing: one librados client per process, the
encodings of the cls_lock calls it sends, key encoding, and errors.

* One client per process and configuration, connected on first use in that
  process. librados threads do not survive fork(): a handle opened before
  fork hangs the child's first request, and shutting it down may hang too,
  so a child never touches an inherited handle; it keeps a reference so
  Python never collects it, and connects its own.
* librados waits forever by default (``rados_osd_op_timeout`` and
  ``rados_mon_op_timeout`` are 0); the client sets both to ``op_timeout``,
  so a dead cluster fails a call within it.
* cls_lock's input structures are Ceph-encoded; the Python binding has no
  compound-op helpers for them, so ``lock_op``/``assert_op`` encode them
  (layout: src/cls/lock/cls_lock_ops.h, Ceph 16.2).
* omap keys must be UTF-8 in the Python binding: Samba's binary keys are
  percent-encoded (printable ASCII stays readable, every byte round-trips).
"""

from __future__ import annotations

import configparser
import contextlib
import errno
import gc
import hashlib
import os
import struct
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import rados

from dbwrap_py.errors import AccessDenied, ConfigError, DbwrapError, Timeout, Unavailable

#: bytes that stay themselves in an encoded key: printable ASCII but '%'
_SAFE = bytes(c for c in range(0x21, 0x7F) if c != ord("%"))
#: cls_lock's exclusive lock type
_LOCK_EXCLUSIVE = 1
#: the OSD returns at most this many omap entries per request
OMAP_PAGE = 1024
#: errno of a failed omap_cmp guard
ECANCELED = 125


def encode_key(key: bytes) -> str:
    return urllib.parse.quote_from_bytes(key, safe=_SAFE)


def decode_key(name: str) -> bytes:
    return urllib.parse.unquote_to_bytes(name)


# -- cls_lock encodings (Ceph's ENCODE_START framing, little-endian) ------------


def _string(data: str | bytes) -> bytes:
    raw = data.encode() if isinstance(data, str) else data
    return struct.pack("<I", len(raw)) + raw


def _framed(payload: bytes) -> bytes:
    """ENCODE_START(1, 1): version, compat version, payload length."""
    return struct.pack("<BBI", 1, 1, len(payload)) + payload


def lock_op(name: str, cookie: str, seconds: float) -> bytes:
    """cls_lock_lock_op: an exclusive lock that the OSD lets expire after ``seconds``."""
    whole = int(seconds)
    nanos = int(round((seconds - whole) * 1e9))
    return _framed(_string(name) + bytes([_LOCK_EXCLUSIVE]) + _string(cookie) + _string("")
                   + _string("") + struct.pack("<II", whole, nanos) + bytes([0]))


def assert_op(name: str, cookie: str) -> bytes:
    """cls_lock_assert_op: fails the whole compound op unless ``cookie`` holds
    an unexpired ``name`` (the OSD drops expired lockers when it reads them)."""
    return _framed(_string(name) + bytes([_LOCK_EXCLUSIVE]) + _string(cookie) + _string(""))


def lock_name(key: bytes) -> str:
    """A record's cls_lock name: a digest, since the lock lives in an xattr
    named after it and the OSD caps xattr names (osd_max_attr_name_len, 100)."""
    return "r" + hashlib.blake2b(key, digest_size=16).hexdigest()


def lock_xattr(name: str) -> str:
    """The object xattr where cls_lock keeps lock ``name``; removing it
    releases the lock and leaves nothing behind (cls_lock's own unlock keeps
    an empty entry per name forever)."""
    return "lock." + name


# -- errors --------------------------------------------------------------------


def mapped(exc: rados.Error, what: str) -> DbwrapError:
    """A librados error as the framework's typed exception."""
    if isinstance(exc, rados.TimedOut):
        return Timeout(f"{what}: the cluster did not answer in time ({exc})")
    if isinstance(exc, (rados.PermissionError, rados.PermissionDeniedError)):
        return AccessDenied(f"{what}: {exc}")
    return Unavailable(f"{what}: {type(exc).__name__}: {exc}")


def failed(result: int, what: str) -> DbwrapError:
    """An async op's negative errno as the framework's typed exception."""
    if -result == errno.ETIMEDOUT:
        return Timeout(f"{what}: the cluster did not answer in time")
    if -result in (errno.EACCES, errno.EPERM):
        return AccessDenied(f"{what}: {os.strerror(-result)}")
    return Unavailable(f"{what}: {os.strerror(-result)} (errno {-result})")


@contextlib.contextmanager
def translated(what: str) -> Iterator[None]:
    try:
        yield
    except rados.Error as exc:
        raise mapped(exc, what) from exc


# -- the per-process client ----------------------------------------------------------


@dataclass(frozen=True)
class ClientConfig:
    """What identifies a cluster connection; one client per process per config.

    The ceph.conf and keyring files are read once, when the database is
    opened: smbd's children run as the user they serve (per-thread setresuid)
    and could not read them when they connect. A client needs neither its
    own log file nor an admin socket, so both are off.
    """

    settings: tuple[tuple[str, str], ...]
    user: str
    pool: str

    @classmethod
    def from_options(cls, options: Mapping[str, str], op_timeout: float) -> "ClientConfig":
        conf, mon_host = options.get("conf", ""), options.get("mon_host", "")
        if not conf and not mon_host:
            raise ConfigError("rados: give conf (a ceph.conf) or mon_host")
        settings = read_conf(conf) if conf else {}
        if mon_host:
            settings["mon_host"] = mon_host
        if options.get("keyring"):
            settings["key"] = read_key(options["keyring"], options.get("user") or "admin")
        settings.pop("keyring", None)
        settings.update({"rados_osd_op_timeout": f"{op_timeout:g}",
                         "rados_mon_op_timeout": f"{op_timeout:g}",
                         "client_mount_timeout": f"{op_timeout:g}",
                         "log_file": "", "admin_socket": "", "log_to_stderr": "false",
                         "err_to_stderr": "false"})
        return cls(tuple(sorted(settings.items())), options.get("user", ""),
                   options.get("pool", "dbwrap_py") or "dbwrap_py")

    def connect(self) -> rados.Rados:
        """A connected client, made in a thread of its own: Ceph draws the
        client's messenger nonce from a per-thread random engine, which a
        forked child inherits. smbd's children, all connecting from their
        main thread, got one nonce, and the OSD took each new child's
        connection for the previous child reconnecting (its ops then hung)."""
        made: dict[str, object] = {}

        def make() -> None:
            try:
                made["client"] = self._connect()
            except BaseException as exc:  # re-raised in the caller's thread
                made["error"] = exc

        thread = threading.Thread(target=make, name="rados-connect")
        thread.start()
        thread.join()
        if "error" in made:
            raise made["error"]  # type: ignore[misc]
        return made["client"]  # type: ignore[return-value]

    def _connect(self) -> rados.Rados:
        kwargs: dict[str, object] = {"conffile": rados.Rados.NO_CONF_FILE, "conf": dict(self.settings)}
        if self.user:
            kwargs["rados_id"] = self.user
        try:
            client = rados.Rados(**kwargs)
        except rados.Error as exc:
            raise mapped(exc, "set up the cluster client") from exc
        try:
            client.connect(timeout=max(1, int(float(dict(self.settings)["rados_mon_op_timeout"]))))
        except rados.Error as exc:
            raise mapped(exc, "connect to the cluster") from exc
        return client


def _parser(path: str, what: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        with open(path, encoding="utf-8") as text:
            parser.read_file(text)
    except (OSError, configparser.Error) as exc:
        raise ConfigError(f"rados: cannot read the {what} {path}: {exc}") from exc
    return parser


def read_conf(path: str) -> dict[str, str]:
    """A ceph.conf's [global] and [client] settings, as a client sees them
    (names with ``_`` for spaces, as Ceph treats them)."""
    parser = _parser(path, "ceph.conf")
    settings: dict[str, str] = {}
    for section in ("global", "client"):
        if parser.has_section(section):
            for name, value in parser.items(section):
                settings[name.strip().replace(" ", "_")] = value.strip()
    return settings


def read_key(path: str, user: str) -> str:
    """The secret of ``client.<user>`` in a keyring file."""
    parser = _parser(path, "keyring")
    section = user if user.startswith("client.") else f"client.{user}"
    if not parser.has_option(section, "key"):
        raise ConfigError(f"rados: keyring {path} has no key for {section}")
    return parser.get(section, "key").strip()


class _Clients:
    """This process's clients; a forked child starts with none."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.by_config: dict[ClientConfig, tuple[rados.Rados, rados.Ioctx]] = {}
        #: handles inherited over fork: never used, never shut down, never collected
        self.inherited: list[object] = []
        self.lock = threading.Lock()

    def ioctx(self, config: ClientConfig) -> rados.Ioctx:
        with self.lock:
            if self.pid != os.getpid():
                self.inherited.append(self.by_config)
                self.by_config = {}
                self.pid = os.getpid()
            found = self.by_config.get(config)
            if found is None:
                client = config.connect()
                try:
                    ioctx = client.open_ioctx(config.pool)
                except rados.ObjectNotFound:
                    client.shutdown()
                    raise Unavailable(f"rados: pool {config.pool!r} does not exist") from None
                found = self.by_config[config] = (client, ioctx)
            return found[1]


CLIENTS = _Clients()

# Objects in reference cycles (an adapter and its watches' callbacks) are
# freed by the cycle collector whenever it runs, which may be in a forked
# child: freeing an inherited Watch there unwatches through the parent's
# client and hangs for ever. Objects alive at fork are frozen for the fork
# (gc.freeze), so a child never collects them; the parent thaws its own.
os.register_at_fork(before=gc.freeze, after_in_parent=gc.unfreeze)
