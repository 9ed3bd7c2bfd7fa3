"""The dataplane part of bpf/include/mrc_abi.h and its ctypes mirror (mrc.dataplane.abi) agree: every
struct has the same fields, types and array lengths in the same order (hence the same offsets and size,
since both use natural alignment), and every enum value matches its #define."""

from __future__ import annotations

import ctypes as ct
import re
from typing import Any

from mrc.dataplane import abi, bpf_source

_CTYPES = {"__u8": ct.c_uint8, "__u16": ct.c_uint16, "__u32": ct.c_uint32, "__u64": ct.c_uint64}


def _header() -> str:
    text = bpf_source("include/mrc_abi.h").read_text()
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def _structs() -> dict[str, list[tuple[str, Any, int | None]]]:
    out: dict[str, list[tuple[str, Any, int | None]]] = {}
    for name, body in re.findall(r"struct\s+(\w+)\s*\{(.*?)\};", _header(), re.S):
        fields: list[tuple[str, Any, int | None]] = []
        for ctype, fname, arr in re.findall(r"(__u\d+)\s+(\w+)\s*(?:\[(\d+)\])?\s*;", body):
            fields.append((fname, _CTYPES[ctype], int(arr) if arr else None))
        assert fields, name
        out[name] = fields
    return out


def _c_layout(fields: list[tuple[str, Any, int | None]]) -> tuple[list[int], int]:
    """Offsets and size by the C rules (natural alignment), independent of ctypes."""
    off, offsets, align = 0, [], 1
    for _n, t, arr in fields:
        size = ct.sizeof(t)
        a = size
        align = max(align, a)
        off = (off + a - 1) // a * a
        offsets.append(off)
        off += size * (arr or 1)
    return offsets, (off + align - 1) // align * align


def test_every_header_struct_is_mirrored() -> None:
    structs = _structs()
    mirrored: dict[str, Any] = {vars(s)["_c_name_"]: s for s in abi.STRUCTS}
    assert set(structs) == set(mirrored)
    for cname, fields in structs.items():
        py = mirrored[cname]
        got: list[tuple[str, Any, int | None]] = []
        for fname, ftype in py._fields_:
            if issubclass(ftype, ct.Array):
                got.append((fname, ftype._type_, ftype._length_))
            else:
                got.append((fname, ftype, None))
        assert got == fields, cname
        offsets, size = _c_layout(fields)
        assert [getattr(py, f[0]).offset for f in fields] == offsets, cname
        assert ct.sizeof(py) == size, cname
        assert size % 8 == 0 or size < 8, f"{cname}: pad to 8 bytes (hash keys hash their padding too)"


def test_enums_match_defines() -> None:
    raw = dict(re.findall(r"^#define[ \t]+(MRC_\w+)[ \t]+(0x[0-9A-Fa-f]+|\d+)[ \t]*$", _header(), re.M))
    for name, value in abi.DEFINES.items():
        assert name in raw, name
        assert int(raw[name], 0) == value, name
    prefixes = ("MRC_DROP_", "MRC_SW_", "MRC_PORT_F_")
    assert {k for k in raw if k.startswith(prefixes)} <= set(abi.DEFINES)
    assert len(abi.DropReason) + 1 == abi.DROP_MAX
    assert len(abi.SwitchAction) == abi.SW_ACT_MAX


def test_helpers() -> None:
    assert abi.mac_key("02:00:01:02:03:04").value == int.from_bytes(bytes([2, 0, 1, 2, 3, 4, 0, 0]), "little")
    assert abi.drop_prob_fixed(0.0) == 0 and abi.drop_prob_fixed(1.0) == 0xFFFFFFFF
