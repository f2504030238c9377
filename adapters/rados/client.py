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
import math
import os
import struct
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from collections.abc import Callable
from dataclasses import dataclass

import rados

from dbwrap_py.errors import AccessDenied, ConfigError, DbwrapError, Timeout, Unavailable
from dbwrap_py.nodecache.layout import bucket_of
from dbwrap_py.options import Option, Options, shown_value

#: bytes that stay themselves in an encoded key: printable ASCII but '%'
_SAFE = bytes(c for c in range(0x21, 0x7F) if c != ord("%"))
#: cls_lock's exclusive lock type
_LOCK_EXCLUSIVE = 1
#: the OSD returns at most this many omap entries per request
OMAP_PAGE = 1024
#: errno of a failed omap_cmp guard
ECANCELED = 125
#: cls_lock flag: renew a lock this locker holds; fail (ENOENT) if it no longer holds it
LOCK_MUST_RENEW = 2
#: what a write op's own guards refuse it with (a lock held, a compare or a version that failed)
REFUSED = (errno.EBUSY, errno.EEXIST, errno.ENOENT, ECANCELED, errno.ERANGE, errno.EOVERFLOW)


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


def lock_op(name: str, cookie: str, seconds: float, flags: int = 0) -> bytes:
    """cls_lock_lock_op: an exclusive lock that the OSD lets expire after ``seconds``."""
    whole = int(seconds)
    nanos = int(round((seconds - whole) * 1e9))
    return _framed(_string(name) + bytes([_LOCK_EXCLUSIVE]) + _string(cookie) + _string("")
                   + _string("") + struct.pack("<II", whole, nanos) + bytes([flags]))


def get_info_op(name: str) -> bytes:
    """cls_lock_get_info_op: who holds lock ``name``."""
    return _framed(_string(name))


def locker_cookies(reply: bytes) -> set[str]:
    """The cookies of the unexpired lockers in a cls_lock_get_info_reply (the
    OSD drops expired lockers before it answers): a map of locker_id_t
    (entity_name_t, cookie) to locker_info_t, each framed, the latter skipped."""
    cookies: set[str] = set()
    if len(reply) < 10:
        return cookies
    (count,) = struct.unpack_from("<I", reply, 6)
    at = 10
    for _ in range(count):
        (length,) = struct.unpack_from("<I", reply, at + 2)
        start = at + 6
        (size,) = struct.unpack_from("<I", reply, start + 9)  # after entity_name_t: u8 type, s64 num
        cookies.add(reply[start + 13:start + 13 + size].decode())
        at = start + length
        (length,) = struct.unpack_from("<I", reply, at + 2)
        at += 6 + length
    return cookies


def assert_op(name: str, cookie: str) -> bytes:
    """cls_lock_assert_op: fails the whole compound op unless ``cookie`` holds
    an unexpired ``name`` (the OSD drops expired lockers when it reads them)."""
    return _framed(_string(name) + bytes([_LOCK_EXCLUSIVE]) + _string(cookie) + _string(""))


def lock_name(key: bytes) -> str:
    """A record's cls_lock name: its bucket, then a digest, since the lock
    lives in an xattr named after it and the OSD caps xattr names
    (osd_max_attr_name_len, 100). A node claiming a bucket finds the
    processes' locks in it by the bucket."""
    return f"r{bucket_of(key):02x}{hashlib.blake2b(key, digest_size=16).hexdigest()}"


def bucket_locks(bucket: int) -> str:
    """The xattr name prefix of the record locks in ``bucket``."""
    return f"lock.r{bucket:02x}"


def record_oid(meta_oid: str, objects: int, key: bytes) -> str:
    """The object that holds ``key``: by its bucket, so that a bucket's
    records, locks and claim are all in one object (a claim is one op)."""
    return f"{meta_oid}/{bucket_of(key) % objects}"


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


#: The client's timeouts, in whole seconds (from op_timeout).
_TIMEOUT_SETTINGS = ("rados_osd_op_timeout", "rados_mon_op_timeout", "client_mount_timeout")
#: A client needs neither its own log file nor an admin socket.
_QUIET_SETTINGS = {"log_file": "", "admin_socket": "", "log_to_stderr": "false", "err_to_stderr": "false"}
_OWN_SETTINGS = frozenset(_TIMEOUT_SETTINGS) | frozenset(_QUIET_SETTINGS) | {"mon_host", "key"}
#: the options ClientConfig reads (the adapter's and the node agent's)
CLIENT_OPTIONS = (
    Option("conf", str, "", help="a ceph.conf (this or mon_host)"),
    Option("mon_host", str, "", help="the monitors (this or conf)"),
    Option("pool", str, "dbwrap_py", help="the RADOS pool"),
    Option("user", str, "", help="the cephx user (default admin)"),
    Option("keyring", str, "", help="a keyring file with the user's key (default: the conf's)"),
)


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

    def __repr__(self) -> str:  # settings hold the cephx key: never printed
        shown = tuple((name, shown_value(name, value)) for name, value in self.settings)
        return f"ClientConfig(settings={shown!r}, user={self.user!r}, pool={self.pool!r})"

    @classmethod
    def from_options(cls, options: Mapping[str, str], op_timeout: float) -> "ClientConfig":
        options = Options(dict(options), CLIENT_OPTIONS)
        conf, mon_host = options.value("conf"), options.value("mon_host")
        if not conf and not mon_host:
            raise ConfigError("rados: give conf (a ceph.conf) or mon_host")
        settings = read_conf(conf) if conf else {}
        if mon_host:
            settings["mon_host"] = mon_host
        user = options.value("user") or "admin"
        if options.value("keyring"):
            settings["key"] = read_key(options.value("keyring"), user)
        else:  # the conf's keyring, read now, if it has one with the user's key
            key = conf_key(settings.get("keyring", ""), user)
            if key:
                settings["key"] = key
        settings.pop("keyring", None)
        seconds = str(max(1, math.ceil(op_timeout)))  # Ceph takes whole seconds here (0.5 is EINVAL)
        settings.update({name: seconds for name in _TIMEOUT_SETTINGS})
        settings.update(_QUIET_SETTINGS)
        return cls(tuple(sorted(settings.items())), options.value("user"),
                   options.value("pool") or "dbwrap_py")

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

    def _apply_settings(self, client: rados.Rados) -> None:
        """The settings, each set on its own. A ceph.conf option this librados
        does not know (a conf written for another Ceph release, such as
        ``mon cluster log file level``, gone in Ceph 18) is skipped, as Ceph
        skips it in a conf file; the ones this adapter sets itself must take."""
        for name, value in self.settings:
            try:
                client.conf_set(name, value)
            except rados.ObjectNotFound:
                if name in _OWN_SETTINGS:
                    raise

    def _connect(self) -> rados.Rados:
        kwargs: dict[str, object] = {"conffile": rados.Rados.NO_CONF_FILE}
        if self.user:
            kwargs["rados_id"] = self.user
        try:
            client = rados.Rados(**kwargs)
            self._apply_settings(client)
        except rados.Error as exc:
            raise mapped(exc, "set up the cluster client") from exc
        try:
            client.connect(timeout=max(1, int(float(dict(self.settings)["rados_mon_op_timeout"]))))
        except rados.Error as exc:
            hint = "" if "key" in dict(self.settings) else " (no key was found: give keyring = FILE)"
            raise mapped(exc, "connect to the cluster" + hint) from exc
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


def conf_key(keyrings: str, user: str) -> str:
    """The user's key from the first of a ceph.conf's ``keyring`` files that
    has it ("" if none does): ``$name`` and ``$cluster`` expanded as Ceph does."""
    name = user if user.startswith("client.") else f"client.{user}"
    for path in (p.strip() for p in keyrings.split(",")):
        path = path.replace("$cluster", "ceph").replace("$name", name)
        if path and os.path.isfile(path):
            try:
                return read_key(path, user)
            except ConfigError:
                continue
    return ""


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


#: notifies in flight, kept until their callbacks ran (a child never runs its parent's)
_NOTIFIES: set[object] = set()


class Ops:
    """Ops on one configuration's client in this process, counted: ``ops``
    sent, and ``round_trips``, the waits for the cluster (ops sent together
    count once). A write op's refusal by its own guards (a lock held, a
    compare or a version that failed) is its negative errno, not an error."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self.ops = 0
        self.round_trips = 0

    @property
    def io(self) -> rados.Ioctx:
        return CLIENTS.ioctx(self.config)

    def write(self, oid: str, build: Callable[[rados.WriteOp], object], what: str) -> int:
        with rados.WriteOpCtx() as op:
            build(op)
            return self.send(op, oid, what)

    def send(self, op: rados.WriteOp, oid: str, what: str) -> int:
        self.ops += 1
        self.round_trips += 1
        io = self.io  # connecting fails here, apart from the op's own refusals
        try:
            io.operate_write_op(op, oid)
        except rados.Error as exc:
            code = getattr(exc, "errno", None)
            if code in REFUSED:
                return -code
            raise mapped(exc, what) from exc
        return 0

    def read(self, oid: str, keys: list[str], what: str = "read") -> dict[str, bytes]:
        """The omap values of those ``keys`` that exist (an empty one as b"")."""
        self.ops += 1
        self.round_trips += 1
        io = self.io
        with rados.ReadOpCtx() as op:
            values, _ = io.get_omap_vals_by_keys(op, keys)
            try:
                io.operate_read_op(op, oid)
            except rados.ObjectNotFound:
                return {}
            except rados.Error as exc:
                raise mapped(exc, what) from exc
            return {name: value or b"" for name, value in values}

    def write_read(self, oid: str, build: Callable[[rados.WriteOp], object], keys: list[str],
                   what: str) -> tuple[int, dict[str, bytes]]:
        """A write op and a read of ``keys`` ordered behind it, sent together:
        one round trip. The read is answered whether the write was refused or not."""
        if not keys:
            return self.write(oid, build, what), {}
        io = self.io
        with rados.WriteOpCtx() as writer, rados.ReadOpCtx() as reader:
            build(writer)
            values, _ = io.get_omap_vals_by_keys(reader, keys)
            self.ops += 2
            self.round_trips += 1
            with translated(what):
                wrote = io.operate_aio_write_op(writer, oid)
                fetched = io.operate_aio_read_op(reader, oid, flag=rados.LIBRADOS_OPERATION_ORDER_READS_WRITES)
                wrote.wait_for_complete()
                fetched.wait_for_complete()
            result, read = wrote.get_return_value(), fetched.get_return_value()
            if result < 0 and -result not in REFUSED:
                raise failed(result, what)
            if read < 0 and read != -errno.ENOENT:
                raise failed(read, what)
            return result, ({name: value or b"" for name, value in values} if read == 0 else {})

    def page(self, oid: str, after: str, prefix: str, what: str) -> tuple[list[tuple[str, bytes]], int]:
        """Up to OMAP_PAGE omap entries named ``prefix``... after ``after``,
        and the object's version then (0: there is no object)."""
        self.ops += 1
        self.round_trips += 1
        io = self.io
        with rados.ReadOpCtx() as op:
            values, _ = io.get_omap_vals(op, after, prefix, OMAP_PAGE)
            try:
                io.operate_read_op(op, oid)
            except rados.ObjectNotFound:
                return [], 0
            except rados.Error as exc:
                raise mapped(exc, what) from exc
            return [(name, value or b"") for name, value in values], io.get_last_version()

    def pages_together(self, reads: list[tuple[str, str, str]], what: str) -> list[list[tuple[str, bytes]]]:
        """page() of each (oid, after, prefix), the entries only, the ops
        sent together: one round trip. A missing object's page is empty."""
        self.ops += len(reads)
        self.round_trips += 1
        io = self.io
        with contextlib.ExitStack() as stack:
            ops = [stack.enter_context(rados.ReadOpCtx()) for _ in reads]
            values = [io.get_omap_vals(op, after, prefix, OMAP_PAGE)[0]
                      for op, (_, after, prefix) in zip(ops, reads)]
            with translated(what):
                sent = [io.operate_aio_read_op(op, oid) for op, (oid, _, _) in zip(ops, reads)]
                for completion in sent:
                    completion.wait_for_complete()
            pages = []
            for completion, page in zip(sent, values):
                result = completion.get_return_value()
                if result < 0 and result != -errno.ENOENT:
                    raise failed(result, what)
                pages.append([(name, value or b"") for name, value in page] if result == 0 else [])
            return pages

    def notify(self, oid: str, msg: str, what: str, timeout_ms: int = 5000,
               answered: Callable[[int, list | None], None] | None = None) -> None:
        """Notify ``oid``'s watchers; ``answered(result, acks)`` when they
        have answered, if given. Nobody waits here; the completion is kept
        until its callback ran (or for ever: one freed earlier would crash
        the callback)."""
        self.ops += 1

        def done(completion: object, result: int, acks: list | None, timeouts: list | None) -> None:
            _NOTIFIES.discard(completion)
            if answered is not None:
                answered(result, acks)

        with translated(what):
            _NOTIFIES.add(self.io.aio_notify(oid, done, msg=msg, timeout_ms=timeout_ms))

    def lock_holders(self, oid: str, name: str, what: str) -> set[str]:
        """The cookies that hold cls_lock ``name`` on ``oid`` now, by the OSD's clock."""
        self.ops += 1
        self.round_trips += 1
        try:
            result, reply = self.io.execute(oid, "lock", "get_info", get_info_op(name), 4096)
        except rados.ObjectNotFound:
            return set()
        except rados.Error as exc:
            raise mapped(exc, what) from exc
        if result < 0:
            raise failed(result, what)
        return locker_cookies(reply)
