"""Moving a Samba's persistent databases from one backend to another.

Swapping the adapter in smb.conf is safe for the volatile databases, which
smbd wipes when it starts; the persistent ones (secrets with the machine
password, passdb, the registry, share ACLs, group mapping, account policy)
would be left behind. ``copy_database`` copies one database:

* the source is read with one traverse_read (a consistent snapshot on tdb,
  which holds its all-record read lock for the traverse, and on sqlite);
* the destination is written under its transaction where it has one, so a
  failed copy leaves it empty; without one, record by record under the
  record lock, as dbwrap_trans_store would;
* it refuses a non-empty destination unless ``overwrite`` is given, and
  writes nothing for an empty source (a mistyped path creates nothing);
* then a fresh handle on the destination reads every record back and
  compares it with the source, key by key.

A copy is meant to run while Samba is stopped: whatever smbd writes to the
source after the snapshot is not in the destination. ``running_samba``
finds the daemons of a Samba, by their pid files, and the processes that
hold a local database file open, so the command can refuse.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dbwrap_py.database import Database, open_database
from dbwrap_py.errors import DbwrapError, NotFound
from dbwrap_py.options import shown_options

#: the databases smbd opens with TDB_CLEAR_IF_FIRST and wipes at start: nothing to carry over
VOLATILE_NAMES = frozenset({
    "locking.tdb", "brlock.tdb", "leases.tdb", "smbXsrv_open_global.tdb",
    "smbXsrv_session_global.tdb", "smbXsrv_tcon_global.tdb", "smbXsrv_client_global.tdb",
    "smbXsrv_version_global.tdb", "mutex.tdb", "names.tdb", "smbd_cleanupd.tdb",
})
#: persistent databases: (smb.conf directory parameter, file name)
PERSISTENT_LOCATIONS = (
    ("private dir", "secrets.tdb"),
    ("private dir", "passdb.tdb"),
    ("state directory", "registry.tdb"),
    ("state directory", "share_info.tdb"),
    ("state directory", "group_mapping.tdb"),
    ("state directory", "account_policy.tdb"),
)
#: the daemons that open persistent databases, by pid file name
SAMBA_DAEMONS = ("smbd", "winbindd", "nmbd", "samba")


class CopyRefused(Exception):
    """The copy would lose data or make no sense; the message says why and what to do."""


@dataclass(frozen=True)
class Endpoint:
    """An adapter and its options, as ``dbwrap_py:module`` and ``dbwrap_py:<option>`` give them."""

    adapter: str
    options: Sequence[str] = ()

    def open(self, name: str, create: bool) -> Database:
        # persistent: no TDB_CLEAR_IF_FIRST, so nothing is wiped at open
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        return open_database(name, 0, 0, flags, 0o600, 0, 0, self.adapter, list(self.options))

    def __str__(self) -> str:
        return " ".join([self.adapter, *(f"-o {shown_options([o])}" for o in self.options)])


@dataclass
class CopyReport:
    name: str
    copied: int = 0
    verified: int = 0
    #: keys whose value differs in the destination, missing from it, or only in it
    differing: list[bytes] = field(default_factory=list)
    missing: list[bytes] = field(default_factory=list)
    extra: list[bytes] = field(default_factory=list)
    overwritten: int = 0
    transactional: bool = False
    #: the source held no record, so nothing was written
    empty_source: bool = False

    @property
    def ok(self) -> bool:
        return not (self.differing or self.missing or self.extra) and self.verified == self.copied


def _records(db: Database) -> dict[bytes, bytes]:
    return dict(db.traverse(False))


def _write(db: Database, records: dict[bytes, bytes], stale: Iterable[bytes]) -> None:
    """Each write under its record lock, as dbwrap's own stores do."""
    for key in stale:
        db.lock(key)
        try:
            db.delete(key)
        except NotFound:
            pass
        finally:
            db.unlock(key)
    for key, value in records.items():
        db.lock(key)
        try:
            db.store(key, value, 0)
        finally:
            db.unlock(key)


def _fill(db: Database, records: dict[bytes, bytes], overwrite: bool, report: CopyReport) -> None:
    present = _records(db)
    if present and not overwrite:
        raise CopyRefused(f"{report.name}: the destination already holds {len(present)} records;"
                          " pass --overwrite to replace them")
    report.overwritten = len(present)
    stale = [k for k in present if k not in records]
    report.transactional = db.adapter.capabilities.transactions
    if not report.transactional:
        _write(db, records, stale)
        return
    db.transaction_start(False)
    try:
        _write(db, records, stale)
    except BaseException:
        db.transaction_cancel()
        raise
    db.transaction_commit()


def copy_database(name: str, source: Endpoint, destination: Endpoint,
                  overwrite: bool = False) -> CopyReport:
    """Copy database ``name`` (the path smbd passes to db_open) and verify the copy."""
    if os.path.basename(name) in VOLATILE_NAMES:
        raise CopyRefused(f"{name} is volatile: smbd wipes it when it starts, so there is"
                          " nothing to carry over")
    report = CopyReport(name)
    try:
        src = source.open(name, create=False)
    except DbwrapError as exc:
        raise CopyRefused(f"{name}: cannot open the source ({source}): {exc}") from exc
    try:
        records = _records(src)
    finally:
        src.close()
    if not records:  # nothing to carry over; a wrong path must not create a destination
        report.empty_source = True
        return report
    dst = destination.open(name, create=True)
    try:
        _fill(dst, records, overwrite, report)
    finally:
        dst.close()
    report.copied = len(records)
    _verify(name, destination, records, report)
    return report


def _verify(name: str, destination: Endpoint, records: dict[bytes, bytes],
            report: CopyReport) -> None:
    """Read everything back through a new handle and compare, record by record."""
    check = destination.open(name, create=False)
    try:
        copied = _records(check)
    finally:
        check.close()
    for key, value in records.items():
        if key not in copied:
            report.missing.append(key)
        elif copied[key] != value:
            report.differing.append(key)
        else:
            report.verified += 1
    report.extra = [k for k in copied if k not in records]


# -- is a Samba using these databases? ---------------------------------------


def samba_parameter(configfile: str, name: str) -> str:
    """One [global] parameter as Samba resolves it (defaults, includes).

    With registry shares on, loading the configuration opens registry.tdb
    natively, and creates it if missing: a copy must not touch what it copies.
    """
    result = subprocess.run(["testparm", "-s", "--option=registry shares=no",
                             f"--parameter-name={name}", configfile],
                            capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise CopyRefused(f"testparm cannot read {configfile}: {result.stderr.strip()[-300:]}")
    return result.stdout.strip()


def persistent_databases(configfile: str) -> list[str]:
    """The paths of a Samba's persistent databases, as smbd names them."""
    folders: dict[str, str] = {}
    paths = []
    for parameter, filename in PERSISTENT_LOCATIONS:
        if parameter not in folders:
            folders[parameter] = samba_parameter(configfile, parameter)
        paths.append(str(Path(folders[parameter]) / filename))
    return paths


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead, only not yet reaped
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def running_daemons(configfile: str) -> list[str]:
    """Samba daemons alive per the pid files of ``configfile``'s pid directory."""
    piddir = Path(samba_parameter(configfile, "pid directory"))
    found = []
    for daemon in SAMBA_DAEMONS:
        pidfile = piddir / f"{daemon}.pid"
        try:
            pid = int(pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        if _alive(pid):
            found.append(f"{daemon} (pid {pid}, from {pidfile})")
    return found


def _local_files(name: str) -> list[Path]:
    """The files an adapter may keep for ``name`` on this machine."""
    return [p for p in (Path(name), Path(name + ".sqlite")) if p.exists()]


def processes_holding(names: Sequence[str]) -> list[str]:
    """Other processes with one of the databases' local files open."""
    wanted = {p.resolve() for name in names for p in _local_files(name)}
    holders = []
    if not wanted:
        return holders
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        pid = int(fd_dir.parent.name)
        if pid == os.getpid():
            continue
        try:
            targets = {Path(os.readlink(fd)) for fd in fd_dir.iterdir()}
        except OSError:  # gone meanwhile, or not ours to read
            continue
        for path in sorted(targets & wanted):
            holders.append(f"{_command(pid)} (pid {pid}) has {path} open")
    return holders
