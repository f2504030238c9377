"""dbwrap-py: look at adapters and databases from the command line.

  dbwrap-py adapters                       built-in adapters and what they declare
  dbwrap-py dump ADAPTER DB [-o k=v ...]   every record, like tdbdump
  dbwrap-py get ADAPTER DB KEY             one value
  dbwrap-py put ADAPTER DB KEY VALUE       store under the record lock

DB is the name smbd would pass to db_open, e.g. /var/lib/samba/private/secrets.tdb.
Keys and values are given as text; use \\xNN escapes for other bytes.
"""

from __future__ import annotations

import argparse
import codecs
import os
import sys
from collections.abc import Sequence

from dbwrap_py.adapter import TDB_CLEAR_IF_FIRST
from dbwrap_py.database import Database, open_database
from dbwrap_py.errors import DbwrapError
from dbwrap_py.ntstatus import NAMES
from dbwrap_py.registry import builtin_names, find_adapter


def _bytes(text: str) -> bytes:
    return codecs.escape_decode(text.encode())[0]


def _show(data: bytes) -> str:
    return "".join(chr(b) if 32 <= b < 127 and b != 0x5C else f"\\x{b:02x}" for b in data)


def _open(args: argparse.Namespace) -> Database:
    flags = TDB_CLEAR_IF_FIRST if args.volatile else 0
    return open_database(
        args.db, 0, flags, os.O_RDWR | os.O_CREAT, 0o600, 0, 0, args.adapter, args.option
    )


def _cmd_adapters(args: argparse.Namespace) -> int:
    for name in builtin_names():
        try:
            caps = find_adapter(name).capabilities
        except DbwrapError as exc:
            print(f"{name:12} unavailable: {exc}")
            continue
        print(
            f"{name:12} transactions={'yes' if caps.transactions else 'no'}"
            f" multi_process={'yes' if caps.multi_process else 'no'}"
            f" lock_release={caps.lock_release_seconds:g}s"
        )
        for note in caps.notes:
            print(f"{'':12} note: {note}")
    return 0


def _cmd_dump(args: argparse.Namespace) -> int:
    db = _open(args)
    try:
        count = 0
        for key, value in db.traverse(False):
            print(f"key({len(key)}) = \"{_show(key)}\"\ndata({len(value)}) = \"{_show(value)}\"\n")
            count += 1
        print(f"{count} records", file=sys.stderr)
    finally:
        db.close()
    return 0


def _cmd_get(args: argparse.Namespace) -> int:
    db = _open(args)
    try:
        value = db.fetch(_bytes(args.key))
    finally:
        db.close()
    if value is None:
        print("not found", file=sys.stderr)
        return 1
    print(_show(value))
    return 0


def _cmd_put(args: argparse.Namespace) -> int:
    db = _open(args)
    key = _bytes(args.key)
    try:
        db.lock(key)
        try:
            db.store(key, _bytes(args.value), 0)
        finally:
            db.unlock(key)
    finally:
        db.close()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dbwrap-py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("adapters", help="list built-in adapters").set_defaults(fn=_cmd_adapters)
    for name, fn, extra in (
        ("dump", _cmd_dump, ()),
        ("get", _cmd_get, ("key",)),
        ("put", _cmd_put, ("key", "value")),
    ):
        cmd = sub.add_parser(name)
        cmd.add_argument("adapter", help="short name (tdb) or dotted module")
        cmd.add_argument("db", help="database name, as smbd passes it to db_open")
        for arg in extra:
            cmd.add_argument(arg)
        cmd.add_argument("-o", "--option", action="append", default=[], metavar="K=V",
                         help="adapter option (repeatable)")
        cmd.add_argument("--volatile", action="store_true",
                         help="open with TDB_CLEAR_IF_FIRST, as smbd opens locking.tdb")
        cmd.set_defaults(fn=fn)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except DbwrapError as exc:
        status = NAMES.get(exc.ntstatus, f"0x{exc.ntstatus:08x}")
        print(f"dbwrap-py: {type(exc).__name__}: {exc} ({status})", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
