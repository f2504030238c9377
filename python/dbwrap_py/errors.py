"""Typed exceptions an adapter raises, each carrying the NTSTATUS smbd sees.

The C bridge reads ``ntstatus`` from any DbwrapError it catches. Any other
exception (a bug in an adapter) becomes NT_STATUS_INTERNAL_DB_ERROR, and
MemoryError becomes NT_STATUS_NO_MEMORY.
"""

from __future__ import annotations

from dbwrap_py import ntstatus as nt


class DbwrapError(Exception):
    """Base of every error an adapter may raise on purpose."""

    ntstatus: int = nt.NT_STATUS_INTERNAL_DB_ERROR
    #: a normal answer (a missing key, a taken lock), logged only at debug level 10
    routine: bool = False


class NotFound(DbwrapError):
    """The key does not exist (TDB_MODIFY on a missing key, delete of a missing key)."""

    ntstatus = nt.NT_STATUS_NOT_FOUND
    routine = True


class NameCollision(DbwrapError):
    """The key exists already (TDB_INSERT on an existing key)."""

    ntstatus = nt.NT_STATUS_OBJECT_NAME_COLLISION
    routine = True


class LockConflict(DbwrapError):
    """A lock could not be granted without waiting (nonblocking requests)."""

    ntstatus = nt.NT_STATUS_FILE_LOCK_CONFLICT
    routine = True


class FencedOut(LockConflict):
    """This process lost its lock (lease expired) and may no longer write."""

    routine = False


class Unavailable(DbwrapError):
    """The backend cannot be reached or has no quorum."""

    ntstatus = nt.NT_STATUS_DEVICE_NOT_READY


class Timeout(DbwrapError):
    """The backend did not answer within the configured time."""

    ntstatus = nt.NT_STATUS_IO_TIMEOUT


class WriteProtected(DbwrapError):
    """A write was attempted where dbwrap forbids it (inside traverse_read)."""

    ntstatus = nt.NT_STATUS_MEDIA_WRITE_PROTECTED
    routine = True


class NotSupported(DbwrapError):
    """The adapter does not offer this operation (for example transactions)."""

    ntstatus = nt.NT_STATUS_NOT_SUPPORTED


class Corruption(DbwrapError):
    """The backend's data is inconsistent."""

    ntstatus = nt.NT_STATUS_INTERNAL_DB_CORRUPTION


class AccessDenied(DbwrapError):
    """The backend refused the operation (read-only open, permissions)."""

    ntstatus = nt.NT_STATUS_ACCESS_DENIED


class UnsafePath(AccessDenied):
    """A file or directory root would use where another user could have
    planted something: a symbolic link where a file is created or opened, a
    directory not root's or writable by others (``dbwrap_py.safe_files``)."""


class InvalidParameter(DbwrapError):
    """A caller passed something dbwrap does not allow (an unknown store flag)."""

    ntstatus = nt.NT_STATUS_INVALID_PARAMETER


class ConfigError(InvalidParameter):
    """Bad configuration: an unknown adapter, an import error or a bad option."""


class AdapterContractError(DbwrapError):
    """The adapter broke the API contract, for example by returning a wrong type."""

    ntstatus = nt.NT_STATUS_INTERNAL_DB_ERROR


def ntstatus_of(exc: BaseException) -> int:
    """The NTSTATUS the bridge reports for ``exc``."""
    if isinstance(exc, DbwrapError):
        return exc.ntstatus
    if isinstance(exc, MemoryError):
        return nt.NT_STATUS_NO_MEMORY
    return nt.NT_STATUS_INTERNAL_DB_ERROR
