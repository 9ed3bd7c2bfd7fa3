"""bpf/include/mrc_abi.h and mrc.wire must agree: the BPF programs read packets with the header's
numbers, the Python engine writes them with the module's."""

from __future__ import annotations

import re

from mrc.dataplane import bpf_source
from mrc.wire import consts
from mrc.wire.consts import MxhFlag, Opcode
from mrc.wire.packet import CTRL_HDR_LEN, WRITE_HDR_LEN, WRITE_IMM_HDR_LEN


def _defines() -> dict[str, int]:
    text = bpf_source("include/mrc_abi.h").read_text()
    raw = dict(re.findall(r"^#define[ \t]+(MRC_\w+)[ \t]+(.+?)[ \t]*$", text, re.M))
    out: dict[str, int] = {}
    # Evaluate simple expressions that refer to earlier defines (sums of names and numbers).
    for name, expr in raw.items():
        e = expr
        for other, val in sorted(out.items(), key=lambda kv: -len(kv[0])):
            e = re.sub(rf"\b{other}\b", str(val), e)
        assert re.fullmatch(r"[\s()+0-9xXa-fA-F]+", e), f"{name} = {expr!r} is not a constant expression"
        out[name] = int(eval(e, {"__builtins__": {}}))  # digits, parentheses and + only (checked above)
    return out


def test_header_numbers_match_python() -> None:
    d = _defines()
    assert d["MRC_UDP_PORT"] == consts.ROCEV2_UDP_PORT
    assert d["MRC_EV_SPORT_BASE"] == consts.EV_SPORT_BASE
    assert d["MRC_EV_INDEX_BITS"] == consts.EV_INDEX_BITS
    assert d["MRC_BTH_LEN"] == consts.BTH_LEN
    assert d["MRC_RETH_LEN"] == consts.RETH_LEN
    assert d["MRC_IMMDT_LEN"] == consts.IMMDT_LEN
    assert d["MRC_MXH_LEN"] == consts.MXH_LEN
    assert d["MRC_ICRC_LEN"] == consts.ICRC_LEN
    assert d["MRC_MXH_VERSION"] == consts.MXH_VERSION
    ops = {
        "WRITE_ONLY": Opcode.RDMA_WRITE_ONLY,
        "WRITE_ONLY_IMM": Opcode.RDMA_WRITE_ONLY_IMM,
        "SACK": Opcode.SACK,
        "NACK": Opcode.NACK,
        "PROBE": Opcode.PROBE,
        "PROBE_REPLY": Opcode.PROBE_REPLY,
        "PORT_STATUS": Opcode.PORT_STATUS,
    }
    for name, op in ops.items():
        assert d[f"MRC_OP_{name}"] == op, name
    assert {k for k in d if k.startswith("MRC_OP_")} == {f"MRC_OP_{n}" for n in ops}
    for flag in MxhFlag:
        assert d[f"MRC_MXH_F_{flag.name}"] == flag.value, flag.name
    assert d["MRC_MXH_OFF_WRITE"] + consts.MXH_LEN == WRITE_HDR_LEN
    assert d["MRC_MXH_OFF_WRITE_IMM"] + consts.MXH_LEN == WRITE_IMM_HDR_LEN
    assert d["MRC_MXH_OFF_CONTROL"] + consts.MXH_LEN == CTRL_HDR_LEN


def test_mxh_field_offsets_match_struct() -> None:
    """The EV index the egress program reads at MXH+2 is the one pack_mxh writes there."""
    from mrc.wire.mxh import pack_mxh

    d = _defines()
    buf = bytearray(consts.MXH_LEN)
    pack_mxh(buf, 0, flags=0x5A & 0x3F, ev_index=0x1234)
    off = d["MRC_MXH_OFF_EV_INDEX"]
    assert int.from_bytes(buf[off : off + 2], "big") == 0x1234
    assert buf[d["MRC_MXH_OFF_FLAGS"]] == 0x5A & 0x3F
