"""Interop with Wireshark: tshark's own InfiniBand dissector reads our BTH/RETH/ImmDt/ICRC with the
values we built, and deploy/wireshark/mrc.lua decodes MXH and the control bodies by field name, on the
IPv6-in-IPv6 fabric frames of `mrcctl wire sample`, without disturbing the InfiniBand decode.

Runs as root too (CI does): Debian's init.lua sets run_user_scripts_when_superuser = true, so
`-X lua_script:` loads; a script that fails to load makes tshark reject our `-e mrc.*` fields, so the
test fails rather than passing vacuously."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mrc.wire import IcrcContext, MrcPacket, Nack, PortStatus, Probe, ProbeReply, Sack, parse
from mrc.wire.icrc import ev_sport, read_icrc
from mrc.wire.ip import Frame, split_ether
from mrc.wire.pcap import write_pcap
from mrc.wire.samples import HOST_A, HOST_B, envelope, sample_frames

TSHARK = shutil.which("tshark")
LUA = Path(__file__).resolve().parents[2] / "deploy" / "wireshark" / "mrc.lua"

pytestmark = [
    pytest.mark.tshark,
    pytest.mark.skipif(TSHARK is None, reason="tshark is not installed (apt-get install tshark)"),
]

Row = dict[str, list[str]]
Capture = tuple[Path, list[tuple[Frame, MrcPacket]], Path]


def tshark_fields(pcap: Path, fields: list[str], config_dir: Path, *, lua: bool = False) -> list[Row]:
    """One dict per frame: field name -> every occurrence (tshark -T fields, occurrences joined by ',')."""
    assert TSHARK is not None
    env = {k: v for k, v in os.environ.items() if k != "WIRESHARK_RUN_FROM_BUILD_DIRECTORY"}
    env["WIRESHARK_CONFIG_DIR"] = str(config_dir)  # no personal preferences or disabled protocols
    cmd = [TSHARK, "-n", "-r", str(pcap), "-T", "fields", "-E", "separator=/t", "-E", "aggregator=,"]
    if lua:
        cmd += ["-X", f"lua_script:{LUA}"]
    for f in fields:
        cmd += ["-e", f]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, f"tshark failed ({proc.returncode}): {proc.stderr}"
    # Lua load errors go to stderr with rc 0 when no mrc.* field was requested: never accept them.
    assert "Lua: Error" not in proc.stderr and "lua_script" not in proc.stderr, proc.stderr
    rows = []
    for line in proc.stdout.splitlines():
        cells = line.split("\t")
        assert len(cells) == len(fields), line
        rows.append({f: (c.split(",") if c else []) for f, c in zip(fields, cells, strict=True)})
    return rows


def one(row: Row, field: str) -> int:
    """The single integer value of `field` (decimal or 0x hex, as tshark prints it)."""
    values = row[field]
    assert len(values) == 1, (field, values)
    return int(values[0], 0)


def _decoded(frames: list[bytes]) -> list[tuple[Frame, MrcPacket]]:
    out = []
    for raw in frames:
        f = split_ether(raw)
        out.append((f, parse(f.mrc, IcrcContext(f.inner.src, f.inner.dst), sport=f.sport, verify=False)))
    return out


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> Capture:
    base = tmp_path_factory.mktemp("tshark")
    frames = sample_frames(3, seed=11)
    pcap = base / "sample.pcap"
    write_pcap(pcap, [(1_700_000_000 + i * 1e-6, f) for i, f in enumerate(frames)])
    cfg = base / "wireshark-config"
    cfg.mkdir()
    return pcap, _decoded(frames), cfg


IB_FIELDS = [
    "frame.number", "ipv6.dst", "ipv6.flow", "udp.srcport", "udp.dstport", "udp.length",
    "infiniband.bth.opcode", "infiniband.bth.destqp", "infiniband.bth.psn", "infiniband.bth.padcnt",
    "infiniband.bth.p_key", "infiniband.bth.a",
    "infiniband.reth.va", "infiniband.reth.r_key", "infiniband.reth.dmalen", "infiniband.immdt",
    "infiniband.invariant.crc",
]


def check_infiniband(rows: list[Row], built: list[tuple[Frame, MrcPacket]]) -> None:
    assert len(rows) == len(built)
    opcodes = set()
    for row, (f, p) in zip(rows, built, strict=True):
        assert f.outer is not None
        # Envelope as tshark sees it: outer uSID container then inner host, flow label = EV.
        assert [ipaddress.IPv6Address(a) for a in row["ipv6.dst"]] == [
            ipaddress.IPv6Address(f.outer.dst), ipaddress.IPv6Address(f.inner.dst)
        ]
        assert int(row["ipv6.flow"][0], 16) == p.ev_index
        assert one(row, "udp.srcport") == ev_sport(p.ev_index) and one(row, "udp.dstport") == 4791
        assert one(row, "udp.length") == 8 + p.length
        # BTH on every packet, control ones included.
        opcodes.add(one(row, "infiniband.bth.opcode"))
        assert one(row, "infiniband.bth.opcode") == p.opcode
        assert one(row, "infiniband.bth.destqp") == p.dqpn
        assert one(row, "infiniband.bth.psn") == p.psn
        assert one(row, "infiniband.bth.p_key") == 0xFFFF
        assert one(row, "infiniband.bth.a") == int(p.ackreq)
        if not p.is_data:
            assert row["infiniband.reth.va"] == []
            continue
        assert one(row, "infiniband.bth.padcnt") == p.pad
        assert one(row, "infiniband.reth.va") == p.va
        assert one(row, "infiniband.reth.r_key") == p.rkey
        assert one(row, "infiniband.reth.dmalen") == p.dma_len
        if p.imm is not None:
            # tshark 4.0 lists ImmDt twice (the header item and its value); both must be ours.
            assert set(row["infiniband.immdt"]) == {f"{p.imm:08x}"}
        else:
            assert row["infiniband.immdt"] == []
        if not p.trimmed:
            assert one(row, "infiniband.invariant.crc") == read_icrc(f.mrc)
    assert {10, 11} <= opcodes and {0xC0, 0xC1, 0xC2, 0xC3, 0xC4} <= opcodes


def test_infiniband_dissector_reads_bth_reth_immdt(capture: Capture) -> None:
    pcap, built, cfg = capture
    check_infiniband(tshark_fields(pcap, IB_FIELDS, cfg), built)


MRC_FIELDS = [
    "mrc.opcode", "mrc.mxh.version", "mrc.mxh.flags", "mrc.mxh.flags.trimmed", "mrc.mxh.flags.prio",
    "mrc.mxh.flags.first", "mrc.mxh.flags.last", "mrc.mxh.flags.ack_req_now", "mrc.mxh.flags.retx",
    "mrc.mxh.ev_index", "mrc.mxh.msn", "mrc.mxh.msg_len", "mrc.mxh.msg_offset", "mrc.mxh.timestamp",
    "mrc.payload_len",
    "mrc.sack.cum_psn", "mrc.sack.echo_ev_index", "mrc.sack.echo_flags", "mrc.sack.echo_flags.ecn_ce",
    "mrc.sack.words", "mrc.sack.echo_timestamp", "mrc.sack.service_time", "mrc.sack.bitmap",
    "mrc.sack.acked_psn",
    "mrc.nack.code", "mrc.nack.echo_ev_index", "mrc.nack.cum_psn", "mrc.nack.echo_timestamp",
    "mrc.probe.request_id", "mrc.probe.reply_qpn",
    "mrc.probe_reply.request_id", "mrc.probe_reply.echo_ev_index", "mrc.probe_reply.flags",
    "mrc.probe_reply.flags.service_time_valid", "mrc.probe_reply.echo_timestamp",
    "mrc.probe_reply.service_time",
    "mrc.port_status.request_id", "mrc.port_status.port", "mrc.port_status.state", "mrc.port_status.epoch",
    "mrc.icrc",
]


def test_lua_dissector_decodes_mxh_and_control_bodies(capture: Capture) -> None:
    pcap, built, cfg = capture
    rows = tshark_fields(pcap, IB_FIELDS + MRC_FIELDS, cfg, lua=True)
    # The InfiniBand decode is intact with the script loaded.
    check_infiniband(rows, built)
    kinds = set()
    for row, (f, p) in zip(rows, built, strict=True):
        kinds.add(p.opcode)
        assert one(row, "mrc.opcode") == p.opcode
        assert one(row, "mrc.mxh.version") == 1
        assert one(row, "mrc.mxh.flags") == p.flags
        for name, bit in (("trimmed", 0x01), ("retx", 0x02), ("first", 0x04), ("last", 0x08),
                          ("ack_req_now", 0x10), ("prio", 0x20)):
            assert one(row, f"mrc.mxh.flags.{name}") == int(bool(p.flags & bit)), name
        assert one(row, "mrc.mxh.ev_index") == p.ev_index
        assert one(row, "mrc.mxh.msn") == p.msn
        assert one(row, "mrc.mxh.msg_len") == p.msg_len
        assert one(row, "mrc.mxh.msg_offset") == p.msg_offset
        assert one(row, "mrc.mxh.timestamp") == p.timestamp_ns
        b = p.body
        if p.is_data:
            assert one(row, "mrc.payload_len") == len(p.payload)
            assert row["mrc.icrc"] == []
            continue
        assert one(row, "mrc.icrc") == read_icrc(f.mrc)
        if isinstance(b, Sack):
            assert one(row, "mrc.sack.cum_psn") == b.cum_psn
            assert one(row, "mrc.sack.echo_ev_index") == b.echo_ev_index
            assert one(row, "mrc.sack.echo_flags") == b.echo_flags
            assert one(row, "mrc.sack.echo_flags.ecn_ce") == b.echo_flags & 1
            assert one(row, "mrc.sack.words") == b.bitmap_bits // 64
            assert one(row, "mrc.sack.echo_timestamp") == b.echo_timestamp_ns
            assert one(row, "mrc.sack.service_time") == b.service_time_ns
            assert row["mrc.sack.bitmap"] == [b.bitmap.to_bytes(b.bitmap_bits // 8, "little").hex()]
            assert [int(x) for x in row["mrc.sack.acked_psn"]] == b.acked_psns()
        elif isinstance(b, Nack):
            assert one(row, "mrc.nack.code") == b.code
            assert one(row, "mrc.nack.echo_ev_index") == b.echo_ev_index
            assert one(row, "mrc.nack.cum_psn") == b.cum_psn
            assert one(row, "mrc.nack.echo_timestamp") == b.echo_timestamp_ns
        elif isinstance(b, Probe):
            assert one(row, "mrc.probe.request_id") == b.request_id
            assert one(row, "mrc.probe.reply_qpn") == b.reply_qpn
        elif isinstance(b, ProbeReply):
            assert one(row, "mrc.probe_reply.request_id") == b.request_id
            assert one(row, "mrc.probe_reply.echo_ev_index") == b.echo_ev_index
            assert one(row, "mrc.probe_reply.flags") == b.flags
            assert one(row, "mrc.probe_reply.flags.service_time_valid") == b.flags & 1
            assert one(row, "mrc.probe_reply.echo_timestamp") == b.echo_timestamp_ns
            assert one(row, "mrc.probe_reply.service_time") == b.service_time_ns
        else:
            assert isinstance(b, PortStatus)
            assert one(row, "mrc.port_status.request_id") == b.request_id
            assert one(row, "mrc.port_status.port") == b.port
            assert one(row, "mrc.port_status.state") == b.state
            assert one(row, "mrc.port_status.epoch") == b.epoch
        # A control packet shows only its own body.
        own = {Sack: "sack", Nack: "nack", Probe: "probe.", ProbeReply: "probe_reply"}
        prefix = own.get(type(b), "port_status")
        for field in MRC_FIELDS:
            body_field = field.split(".")[1] in ("sack", "nack", "probe", "probe_reply", "port_status")
            if body_field and not field.startswith(f"mrc.{prefix}"):
                assert row[field] == [], (p.opcode_name, field)
    assert len(kinds) == 7


def test_lua_dissector_flags_malformed_packets_without_failing(tmp_path: Path) -> None:
    """Short or foreign MRC packets get an expert info; tshark still exits 0 and decodes the rest."""
    good = sample_frames(1, seed=2)
    sack = bytearray(split_ether(good[4]).mrc)  # round order: ... WRITE_IMM, SACK (index 4)
    assert sack[0] == 0xC0
    probe = bytearray(split_ether(good[5]).mrc)
    probe[12] = 9  # MXH version
    frames = [
        envelope(sack[:40], HOST_B, HOST_A, 3),  # SACK body cut short
        envelope(probe, HOST_A, HOST_B, 3),
        envelope(sack[:20], HOST_B, HOST_A, 3),  # MXH cut short
        good[0],
    ]
    pcap = tmp_path / "bad.pcap"
    write_pcap(pcap, [(float(i), f) for i, f in enumerate(frames)])
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    fields = ["_ws.expert.message", "mrc.mxh.ev_index", "infiniband.bth.opcode"]
    rows = tshark_fields(pcap, fields, cfg, lua=True)
    messages = [",".join(r["_ws.expert.message"]) for r in rows]
    assert "SACK body truncated" in messages[0]
    assert "MXH version 9, expected 1" in messages[1]
    assert "MXH truncated" in messages[2]
    ((_, write),) = _decoded(good[:1])
    assert one(rows[3], "mrc.mxh.ev_index") == write.ev_index
    assert [one(r, "infiniband.bth.opcode") for r in rows] == [0xC0, 0xC2, 0xC0, 0x0A]


def test_lua_dissector_flags_what_the_parser_refuses_even_with_a_good_icrc(tmp_path: Path) -> None:
    """Each packet below has a valid ICRC and is refused by `mrc.wire.parse`; the dissector showed every
    one as a valid packet with "ICRC Good" (and a full WRITE whose TRIMMED bit flipped as a trimmed
    packet). Each now carries the parser's reason as an expert Error."""
    from mrc.wire import WireError

    good = sample_frames(1, seed=2)
    write = bytearray(split_ether(good[0]).mrc)
    nack = next(bytearray(split_ether(f).mrc) for f in good if split_ether(f).mrc[0] == 0xC1)
    assert write[0] == 0x0A and nack[0] == 0xC1
    ctx = IcrcContext(HOST_A.mrc_addr, HOST_B.mrc_addr)
    back = IcrcContext(HOST_B.mrc_addr, HOST_A.mrc_addr)

    def ev_of(p: bytes | bytearray) -> int:
        return int.from_bytes(p[14:16] if p[0] >= 0xC0 else p[30:32], "big") & 0x3FFF

    def forged(pkt: bytearray, edit: int, value: int, *, width: int = 1, reply: bool = False) -> bytes:
        p = bytearray(pkt)
        p[edit:edit + width] = value.to_bytes(width, "big")
        (back if reply else ctx).write(p, len(p) - 4, ev_sport(ev_of(p)))
        return bytes(p)

    # BTH byte 1 low nibble (TVer); WRITE: RETH at 12 (DMA length 24..27), MXH at 28 (flags 29, EV 30..31,
    # offset 40..43); NACK: MXH at 12, body at 36 (code)
    cases = [
        (forged(write, 1, write[1] | 0x01), "BTH TVer 1, expected 0"),
        (forged(write, 30, 0x4001, width=2), "MXH EV index 0x4001 > 0x3fff"),
        (forged(write, 24, 100, width=4), "headers and DMA length say"),
        (forged(write, 40, 1 << 28, width=4), "beyond message length"),
        (forged(nack, 36, 9, reply=True), "NACK code 9 is none of 1..7"),
        (forged(write, 29, write[29] | 0x01), "trimmed packet of"),
    ]
    for pkt, _ in cases:
        with pytest.raises(WireError):
            parse(pkt)
    frames = [envelope(p, HOST_B if p[0] == 0xC1 else HOST_A, HOST_A if p[0] == 0xC1 else HOST_B, ev_of(p))
              for p, _ in cases]
    pcap = tmp_path / "forged.pcap"
    write_pcap(pcap, [(float(i), f) for i, f in enumerate(frames)])
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    rows = tshark_fields(pcap, ["_ws.expert.message", "mrc.icrc.status"], cfg, lua=True)
    for row, (_, needle) in zip(rows, cases, strict=True):
        assert needle in ",".join(row["_ws.expert.message"]), (needle, row)


def test_lua_dissector_shows_reserved_mxh_flags(tmp_path: Path) -> None:
    """Reserved MXH flag bits (0xC0) are ignored by the parser and shown by `wire decode` (FIRST|0xc0);
    the dissector dropped them from its flag text."""
    write = bytearray(split_ether(sample_frames(1, seed=2)[0]).mrc)
    write[29] |= 0xC0  # MXH flags (MXH at 28 after BTH + RETH)
    ev = int.from_bytes(write[30:32], "big") & 0x3FFF
    IcrcContext(HOST_A.mrc_addr, HOST_B.mrc_addr).write(write, len(write) - 4, ev_sport(ev))
    assert parse(write).flags & 0xC0 == 0xC0
    pcap = tmp_path / "reserved.pcap"
    write_pcap(pcap, [(0.0, envelope(write, HOST_A, HOST_B, ev))])
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (row,) = tshark_fields(pcap, ["_ws.col.Info", "mrc.icrc.status"], cfg, lua=True)
    assert "|0xc0]" in ",".join(row["_ws.col.Info"]) and one(row, "mrc.icrc.status") == 0
