"""dbwrap_py: Samba's dbwrap on any database, through Python adapters."""

from dbwrap_py.adapter import Adapter, Capabilities, DatabaseSpec
from dbwrap_py.errors import (
    AccessDenied,
    AdapterContractError,
    ConfigError,
    Corruption,
    DbwrapError,
    FencedOut,
    InvalidParameter,
    LockConflict,
    NameCollision,
    NotFound,
    NotSupported,
    Timeout,
    Unavailable,
    WriteProtected,
)
from dbwrap_py.leased import KEEP, LeasedAdapter, LeaseSource
from dbwrap_py.options import Option, Options
from dbwrap_py.transactions import TransactionalLeasedAdapter

__all__ = [
    "KEEP",
    "AccessDenied",
    "Adapter",
    "AdapterContractError",
    "Capabilities",
    "ConfigError",
    "Corruption",
    "DatabaseSpec",
    "DbwrapError",
    "FencedOut",
    "InvalidParameter",
    "LeaseSource",
    "LeasedAdapter",
    "LockConflict",
    "NameCollision",
    "NotFound",
    "NotSupported",
    "Option",
    "Options",
    "Timeout",
    "TransactionalLeasedAdapter",
    "Unavailable",
    "WriteProtected",
]
