"""Files and directories that root (smbd, the node agent, the proxy daemon)
creates or opens where another local user might have planted something.

A user who can write a directory root writes in can leave a symbolic link
at a name root is about to create (root then writes, truncates or chmods the
file it points at), or make the directory theirs. Each rule here is the
one place it is kept:

* ``create_file``: a new file, never through a symbolic link, with exactly
  the mode asked (O_CREAT|O_EXCL|O_NOFOLLOW, then fchmod: the umask does
  not apply, as in smbd, which runs with umask 0, so the files get the mode
  Samba asks for whichever process creates them);
* ``open_file``: a file opened read-write, created as ``create_file`` does
  if it is missing; a symbolic link or anything but a regular file there is
  refused;
* ``temp_file``: a new file of an unpredictable name (mkstemp), for one
  written whole and then renamed over its path (``os.replace`` renames the
  link, never its target);
* ``sqlite_file``: a SQLite database's file, made by ``create_file``
  before SQLite opens it by name, or, if it exists, looked at (lstat) and
  never opened here: closing a descriptor of a file drops every fcntl lock
  the process holds on it, and SQLite's connections in this process (a
  parent's, kept across fork; another database's ATTACH of the same
  cluster file) hold theirs by such locks (seen: a process's lock on the
  WAL went, another process took its connection for the last and deleted
  the -wal and -shm under it). SQLite makes its ``-wal``, ``-shm`` and
  ``-journal`` with the database file's permissions; a symbolic link
  already at one of those names is refused. SQLite opens them all by name,
  so a directory others may write is still unsafe: ``check_directory``;
* ``check_directory``: a directory root keeps such files in must be
  root's, or this process's effective user's, and writable by its owner
  only;
* ``read_private_file``: a file root reads a secret or its options from
  (a password_file, the node agent's --options-file): not through a link,
  a regular file of root's (or the effective user's), and none of the mode
  bits the caller refuses (group and others may not read a password).

Every refusal is ``UnsafePath`` (NT_STATUS_ACCESS_DENIED), naming the path
and what is wrong with it.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile

from dbwrap_py.errors import UnsafePath

_CREATE = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
#: the files SQLite makes beside a database's, with its permissions
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def _link_refused(path: str | os.PathLike[str]) -> UnsafePath:
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return UnsafePath(f"{os.fspath(path)} is a symbolic link (to {target}): refused, root does not "
                      "write through a link someone may have planted; remove it")


def create_file(path: str | os.PathLike[str], mode: int) -> int:
    """A new file at ``path`` (its descriptor, read-write, close-on-exec)
    with exactly ``mode``. FileExistsError if anything is there already, a
    symbolic link included: nothing is followed."""
    fd = os.open(path, _CREATE, mode)
    try:
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refuse_unless_regular(path: str | os.PathLike[str], st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise _link_refused(path)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePath(f"{os.fspath(path)} is not a regular file (file type {stat.S_IFMT(st.st_mode):#o}): "
                         "refused")


def open_file(path: str | os.PathLike[str], mode: int) -> int:
    """``path`` opened read-write (close-on-exec), created with exactly
    ``mode`` if missing; UnsafePath if it is a symbolic link or not a
    regular file. An existing file keeps its mode."""
    while True:
        try:
            return create_file(path, mode)
        except FileExistsError:
            pass
        try:
            fd = os.open(path, _OPEN)
        except FileNotFoundError:
            continue  # removed since: create it
        except OSError as exc:
            if exc.errno == errno.ELOOP and os.path.islink(path):
                raise _link_refused(path) from None
            raise
        try:
            _refuse_unless_regular(path, os.fstat(fd))
        except BaseException:
            os.close(fd)
            raise
        return fd


def temp_file(directory: str | os.PathLike[str], prefix: str, mode: int) -> tuple[int, str]:
    """A new file of an unpredictable name in ``directory`` (mkstemp:
    O_EXCL|O_NOFOLLOW) with exactly ``mode``: its descriptor and path."""
    fd, path = tempfile.mkstemp(prefix=prefix, dir=directory)
    try:
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    return fd, path


def sqlite_file(path: str, mode: int) -> str:
    """``path``, a SQLite database's file, made with exactly ``mode`` if
    missing, for ``sqlite3.connect``; UnsafePath if it, or its ``-wal``,
    ``-shm`` or ``-journal``, is a symbolic link, or it is not a regular
    file. ``:memory:`` as it is. An existing file is not opened (see the
    module's docstring)."""
    if path == ":memory:":
        return path
    for suffix in SQLITE_SIDE_FILES:  # first: a refused open makes nothing
        if os.path.islink(path + suffix):
            raise _link_refused(path + suffix)
    try:
        os.close(create_file(path, mode))  # new: no connection of this process has it open
    except FileExistsError:
        _refuse_unless_regular(path, os.lstat(path))
    return path


def _refuse_foreign_owner(path: str | os.PathLike[str], what: str, st: os.stat_result) -> None:
    """UnsafePath unless root or this process's effective user owns it."""
    euid = os.geteuid()
    if st.st_uid not in (0, euid):
        owners = "root" if euid == 0 else f"root or this process's effective uid {euid}"
        raise UnsafePath(f"{what} {os.fspath(path)} is owned by uid {st.st_uid}, not by {owners}: "
                         "refused (chown it to root)")


def check_directory(path: str | os.PathLike[str], what: str) -> None:
    """UnsafePath unless ``path`` (``what`` it is, for the message) is a
    directory owned by root or this process's effective user and writable
    by its owner only: anyone else who may write it can plant links and
    files there, or swap the ones root made."""
    st = os.stat(path)  # a link to the directory is judged by the directory
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(f"{what} {os.fspath(path)} is not a directory")
    _refuse_foreign_owner(path, what, st)
    writable = [who for who, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if st.st_mode & bit]
    if writable:
        raise UnsafePath(f"{what} {os.fspath(path)} is writable by {' and '.join(writable)} "
                         f"(mode {stat.S_IMODE(st.st_mode):04o}): refused (chmod go-w it)")


def read_private_file(path: str | os.PathLike[str], what: str, refused_bits: int) -> tuple[bytes, int]:
    """The bytes of ``path`` (``what`` it is, for the message) and its mode
    bits. UnsafePath, naming it and its mode, when it is a symbolic link,
    not a regular file, not owned by root or this process's effective
    user, or has any of ``refused_bits`` (e.g. 0o077: group or others may
    read or write it); an OSError (missing, unreadable) as it is."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(path):
            raise _link_refused(path) from None
        raise
    with os.fdopen(fd, "rb") as file:
        st = os.fstat(file.fileno())
        mode = stat.S_IMODE(st.st_mode)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(f"{what} {os.fspath(path)} is not a regular file")
        _refuse_foreign_owner(path, what, st)
        if mode & refused_bits:
            who = [name for name, bits in (("group", 0o070), ("others", 0o007)) if mode & refused_bits & bits]
            raise UnsafePath(f"{what} {os.fspath(path)} has mode {mode:04o}: {' and '.join(who)} may "
                             f"{_access(mode & refused_bits)} it; refused (chmod go-{_letters(refused_bits)} it)")
        return file.read(), mode


def _letters(bits: int) -> str:
    return "".join(letter for letter, mask in (("r", 0o044), ("w", 0o022), ("x", 0o011)) if bits & mask)


def _access(bits: int) -> str:
    kinds = [kind for kind, mask in (("read", 0o044), ("write", 0o022), ("execute", 0o011)) if bits & mask]
    return " and ".join(kinds)
