"""The proxy protocol's two sides agree: c_bridge/proxy_wire.h against
python/dbwrap_py/proxy/wire.py, constant by constant."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dbwrap_py.proxy import wire

HEADER = Path(__file__).resolve().parents[2] / "c_bridge" / "proxy_wire.h"


def _c_constants() -> dict[str, int]:
    text = HEADER.read_text()
    found = {name: int(value, 0) for name, value in
             re.findall(r"#define (PROXY_\w+) \(?(0x[0-9a-fA-F]+|\d+)u?", text)}
    found |= {name: int(value) for name, value in re.findall(r"\b(PROXY_\w+) = (\d+),", text)}
    found["PROXY_MAX_MESSAGE"] = eval(  # "(64u * 1024 * 1024)": integers only
        re.search(r"#define PROXY_MAX_MESSAGE \(([\du *]+)\)", text).group(1).replace("u", ""))
    return found


def test_every_op_has_the_same_number_on_both_sides() -> None:
    c = _c_constants()
    for op in wire.Op:
        assert c[f"PROXY_{op.name}"] == op.value, op.name
    for txn in wire.Txn:
        assert c[f"PROXY_TXN_{txn.name}"] == txn.value, txn.name
    c_ops = {name for name in c if name.startswith("PROXY_") and not name.startswith("PROXY_TXN_")
             and name not in {"PROXY_MAGIC", "PROXY_VERSION", "PROXY_MIN_VERSION",
                              "PROXY_MAX_MESSAGE", "PROXY_REQUEST_HEADER", "PROXY_WAIT_FOREVER",
                              "PROXY_WRITE_THROUGH_VERSION", "PROXY_FAST_PATH_VERSION"}}
    assert c_ops == {f"PROXY_{op.name}" for op in wire.Op}


def test_the_framing_constants_agree() -> None:
    c = _c_constants()
    assert c["PROXY_MAGIC"] == wire.MAGIC
    assert c["PROXY_VERSION"] == wire.VERSION
    assert c["PROXY_MIN_VERSION"] == wire.MIN_VERSION
    assert c["PROXY_WRITE_THROUGH_VERSION"] == wire.WRITE_THROUGH_VERSION
    assert c["PROXY_FAST_PATH_VERSION"] == wire.FAST_PATH_VERSION
    assert c["PROXY_MAX_MESSAGE"] == wire.MAX_MESSAGE
    assert c["PROXY_REQUEST_HEADER"] == wire.REQUEST_HEADER.size
    assert c["PROXY_WAIT_FOREVER"] == wire.WAIT_FOREVER


def test_each_ops_first_version_is_the_same_on_both_sides() -> None:
    """proxy_op_version()'s switch in proxy_wire.c against wire.OP_VERSION."""
    text = (HEADER.parent / "proxy_wire.c").read_text()
    body = re.search(r"uint16_t proxy_op_version\(.*?\n}\n", text, re.S).group(0)
    c = _c_constants()
    found: dict[str, int] = {}
    cases: list[str] = []
    for case, returned in re.findall(r"case (PROXY_\w+):|return (PROXY_\w+);", body):
        if case:
            cases.append(case)
            continue
        found.update({name: c[returned] for name in cases})
        cases = []
    assert c["PROXY_MIN_VERSION"] not in found.values()  # only the ops that need more
    assert found == {f"PROXY_{op.name}": version for op, version in wire.OP_VERSION.items()}


def test_a_short_field_is_malformed_not_read_past() -> None:
    body = wire.Writer().u32(10).body() + b"abc"  # claims 10 bytes, has 3
    with pytest.raises(wire.Malformed):
        wire.Reader(body).bytes()


def test_trailing_bytes_are_malformed() -> None:
    r = wire.Reader(wire.Writer().u8(1).u8(2).body())
    r.u8()
    with pytest.raises(wire.Malformed):
        r.end()


def test_an_optional_flag_other_than_0_or_1_is_malformed() -> None:
    with pytest.raises(wire.Malformed):
        wire.Reader(b"\x02").opt()


def test_fields_round_trip() -> None:
    body = wire.Writer().u8(7).u16(65535).u32(2**32 - 1).i32(-5).u64(2**63).bytes(b"\x00k") \
        .str("n\udcff").opt(None).opt(b"").body()
    r = wire.Reader(body)
    assert (r.u8(), r.u16(), r.u32(), r.i32(), r.u64()) == (7, 65535, 2**32 - 1, -5, 2**63)
    assert (r.bytes(), r.str(), r.opt(), r.opt()) == (b"\x00k", "n\udcff", None, b"")
    r.end()
