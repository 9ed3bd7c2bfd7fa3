"""deploy/wireshark/mrc.lua on real captures: the pcapng files the Wireshark tools write by default,
copies cut by `editcap -s 200`, and the expert infos an operator sees with `tshark -z expert`.

* A snaplen-cut packet keeps its decoded headers and its on-the-wire lengths (mrc.payload_len 4096 for
  a 4096-byte WRITE of which 200 bytes were kept), is marked mrc.truncated with ICRC status "not all
  captured", and its Info column does not say "Malformed".
* The script verifies the ICRC of every whole packet (status good, bad, or not checked for trimmed
  packets) and, since RoCEv2's zero UDP checksum over IPv6 is not an error, no "Illegal checksum
  value (0)" Error remains for our packets, while the user's explicit `-o` choice still wins."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mrc.wire import IcrcContext, MrcPacket, parse
from mrc.wire.ip import split_ether
from mrc.wire.pcap import write_pcap
from mrc.wire.samples import sample_frames

TSHARK = shutil.which("tshark")
EDITCAP = shutil.which("editcap")
LUA = Path(__file__).resolve().parents[2] / "deploy" / "wireshark" / "mrc.lua"
SNAP = 200
#: a cut inside the RETH / ImmDt / MXH of data packets: the InfiniBand dissector then reads past the
#: captured bytes, which (uncaught) used to skip the MRC tree and, repeated, break the Lua state
SHORT_SNAP = 128

pytestmark = [
    pytest.mark.tshark,
    pytest.mark.skipif(TSHARK is None or EDITCAP is None,
                       reason="tshark/editcap are not installed (apt-get install tshark)"),
]

Rows = list[dict[str, list[str]]]
Captures = tuple[dict[str, Path], list[bytes], Path]


def _env(cfg: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "WIRESHARK_RUN_FROM_BUILD_DIRECTORY"}
    env["WIRESHARK_CONFIG_DIR"] = str(cfg)  # no personal preferences
    return env


def _tshark(cfg: Path, *args: str, lua: bool = True) -> str:
    assert TSHARK is not None
    cmd = [TSHARK, "-n", *args]
    if lua:
        cmd += ["-X", f"lua_script:{LUA}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(cfg), timeout=120, check=False)
    assert proc.returncode == 0, f"tshark failed ({proc.returncode}): {proc.stderr}"
    assert "Lua: Error" not in proc.stderr and "lua_script" not in proc.stderr, proc.stderr
    return proc.stdout


def _fields(cfg: Path, path: Path, fields: list[str], *extra: str, lua: bool = True) -> Rows:
    args = ["-r", str(path), *extra, "-T", "fields", "-E", "separator=/t", "-E", "aggregator=,"]
    for f in fields:
        args += ["-e", f]
    rows = []
    for line in _tshark(cfg, *args, lua=lua).splitlines():
        cells = line.split("\t")
        assert len(cells) == len(fields), line
        rows.append({f: (c.split(",") if c else []) for f, c in zip(fields, cells, strict=True)})
    return rows


def _one(row: dict[str, list[str]], field: str) -> int:
    (value,) = row[field]
    return int(value, 0)


def _editcap(*args: str) -> None:
    assert EDITCAP is not None
    proc = subprocess.run([EDITCAP, *args], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr


def _built(frames: list[bytes]) -> list[MrcPacket]:
    out = []
    for raw in frames:
        f = split_ether(raw)
        out.append(parse(f.mrc, IcrcContext(f.inner.src, f.inner.dst), sport=f.sport))
    return out


@pytest.fixture(scope="module")
def captures(tmp_path_factory: pytest.TempPathFactory) -> Captures:
    base = tmp_path_factory.mktemp("capture_tshark")
    frames = sample_frames(2, seed=8)
    pcap = base / "s.pcap"
    write_pcap(pcap, [(1_700_000_000 + i * 1e-6, f) for i, f in enumerate(frames)])
    files = {"pcap": pcap, "pcapng": base / "s.pcapng", "cut.pcapng": base / "cut.pcapng",
             "cut.pcap": base / "cut.pcap", "cut128.pcap": base / "cut128.pcap"}
    _editcap("-F", "pcapng", str(pcap), str(files["pcapng"]))
    _editcap("-s", str(SNAP), str(files["pcapng"]), str(files["cut.pcapng"]))
    _editcap("-F", "pcap", "-s", str(SNAP), str(pcap), str(files["cut.pcap"]))
    _editcap("-F", "pcap", "-s", str(SHORT_SNAP), str(pcap), str(files["cut128.pcap"]))
    cfg = base / "cfg"
    cfg.mkdir()
    return files, frames, cfg


FIELDS = [
    "frame.len", "frame.cap_len", "_ws.col.Info", "_ws.expert.message",
    "infiniband.bth.opcode", "infiniband.bth.psn", "infiniband.reth.dmalen",
    "mrc.opcode", "mrc.mxh.ev_index", "mrc.mxh.msn", "mrc.mxh.msg_len", "mrc.mxh.msg_offset",
    "mrc.mxh.timestamp", "mrc.mxh.flags", "mrc.payload_len", "mrc.truncated", "mrc.icrc.status",
    "mrc.sack.cum_psn", "mrc.nack.code",
]


@pytest.mark.parametrize("name", ["pcapng", "cut.pcapng", "cut.pcap"])
def test_headers_and_wire_lengths_from_pcapng_and_cut_copies(
    captures: Captures, name: str
) -> None:
    files, frames, cfg = captures
    rows = _fields(cfg, files[name], FIELDS)
    built = _built(frames)
    assert len(rows) == len(frames)
    snap = SNAP
    cut_seen = 0
    for row, frame, p in zip(rows, frames, built, strict=True):
        cut = name.startswith("cut") and len(frame) > snap
        cut_seen += cut
        assert _one(row, "frame.len") == len(frame)
        assert _one(row, "frame.cap_len") == (snap if cut else len(frame))
        assert _one(row, "infiniband.bth.opcode") == p.opcode == _one(row, "mrc.opcode")
        assert _one(row, "infiniband.bth.psn") == p.psn
        assert _one(row, "mrc.mxh.ev_index") == p.ev_index
        assert _one(row, "mrc.mxh.msn") == p.msn
        assert _one(row, "mrc.mxh.msg_len") == p.msg_len
        assert _one(row, "mrc.mxh.msg_offset") == p.msg_offset
        assert _one(row, "mrc.mxh.timestamp") == p.timestamp_ns
        assert _one(row, "mrc.mxh.flags") == p.flags
        assert _one(row, "mrc.truncated") == int(cut)
        if p.is_data:
            assert _one(row, "infiniband.reth.dmalen") == p.dma_len
            # The payload on the wire, not the bytes the capture kept.
            assert _one(row, "mrc.payload_len") == len(p.payload)
        info = ",".join(row["_ws.col.Info"])
        assert "Malformed" not in info and "Invalid Packet Length" not in info
        assert info.startswith(f"MRC {p.opcode_name}")
        if cut:
            assert f"[cut by snaplen: {snap - 102} of {p.length} bytes captured]" in info
            assert _one(row, "mrc.icrc.status") == 3
        elif p.trimmed:
            assert _one(row, "mrc.icrc.status") == 2
        else:
            assert _one(row, "mrc.icrc.status") == 0  # verified good
        if not p.trimmed:  # the trimmed packet's Note is the only expert info
            assert row["_ws.expert.message"] == [], row["_ws.expert.message"]
    if name.startswith("cut"):
        assert cut_seen >= 4 and any(len(p.payload) == 4096 for p in built)


def test_a_cut_inside_the_headers_decodes_what_was_kept_and_never_breaks_the_script(
    captures: Captures,
) -> None:
    """Cut at 128 bytes (26 of the UDP payload: inside a WRITE's RETH): InfiniBand's dissector would
    read past the captured bytes, an exception pcall cannot catch, which skipped the MRC tree of those
    packets and, after a few hundred, broke the script for every later packet ("C stack overflow").
    Now every packet gets its MRC tree (opcode, cut noted), InfiniBand decodes BTH wherever its
    headers were kept, and no error or malformed packet is reported."""
    files, frames, cfg = captures
    rows = _fields(cfg, files["cut128.pcap"], ["frame.cap_len", "_ws.col.Info", "infiniband.bth.psn",
                                              "mrc.opcode", "mrc.truncated"])
    built = _built(frames)
    kept = SHORT_SNAP - 102  # of the UDP payload (Ethernet, two IPv6 headers and UDP before it)
    assert len(rows) == len(frames)
    for row, frame, p in zip(rows, frames, built, strict=True):
        cut = len(frame) > SHORT_SNAP
        assert _one(row, "mrc.opcode") == p.opcode
        assert _one(row, "mrc.truncated") == int(cut)
        assert ",".join(row["_ws.col.Info"]).startswith(f"MRC {p.opcode_name}")
        headers = {0x0A: 28, 0x0B: 32}.get(p.opcode, 12) + 4
        if not cut or kept >= headers:
            assert _one(row, "infiniband.bth.psn") == p.psn
        else:
            assert row["infiniband.bth.psn"] == []
    experts = _tshark(cfg, "-r", str(files["cut128.pcap"]), "-q", "-z", "expert")
    assert "Errors" not in experts and "Lua" not in experts and "Malformed" not in experts
    assert sum(len(f) > SHORT_SNAP for f in frames) >= 8


def test_no_udp_checksum_error_and_the_tree_says_why(captures: Captures) -> None:
    files, frames, cfg = captures
    for name in ("pcapng", "cut.pcapng"):
        experts = _tshark(cfg, "-r", str(files[name]), "-q", "-z", "expert")
        assert "Illegal checksum" not in experts
        assert "Errors" not in experts and "Warnings" not in experts
        assert "Payload trimmed" in experts  # the trimmed packets' Notes are still there
    tree = _tshark(cfg, "-r", str(files["pcapng"]), "-V", "-c", "1")
    assert "[UDP checksum 0: RoCEv2 practice over IPv6 (RFC 6935/6936); the ICRC covers the packet]" in tree
    assert "ICRC status: Good" in tree
    # Without the script, Wireshark's own UDP dissector flags every packet (what operators saw).
    plain = _tshark(cfg, "-r", str(files["pcapng"]), "-q", "-z", "expert", lua=False)
    assert "Illegal checksum value (0)" in plain
    # The user's explicit choice wins over the script's default.
    forced = _tshark(cfg, "-r", str(files["pcapng"]), "-o", "udp.ignore_ipv6_zero_checksum:FALSE",
                     "-q", "-z", "expert")
    assert "Illegal checksum value (0)" in forced
    assert len(frames) == 16


def test_icrc_mismatch_is_an_error(tmp_path: Path, captures: Captures) -> None:
    _, _, cfg = captures
    frames = sample_frames(1, seed=9)
    write = bytearray(frames[0])
    write[-100] ^= 0x01  # a payload bit
    nack = bytearray(frames[2])
    nack[-5] ^= 0x80  # a body bit
    wrong_port = bytearray(frames[5])  # a PROBE whose UDP source port is not the one it was built for
    wrong_port[94] ^= 0x01
    pcap = tmp_path / "bad.pcap"
    write_pcap(pcap, [(float(i), bytes(f)) for i, f in enumerate([write, nack, wrong_port, frames[3]])])
    rows = _fields(cfg, pcap, ["mrc.icrc.status", "_ws.expert.message", "mrc.opcode"])
    assert [_one(r, "mrc.icrc.status") for r in rows] == [1, 1, 1, 0]
    for r in rows[:3]:
        assert "ICRC mismatch" in r["_ws.expert.message"]
    # The check can be switched off.
    rows = _fields(cfg, pcap, ["mrc.icrc.status"], "-o", "mrc.check_icrc:FALSE")
    assert [_one(r, "mrc.icrc.status") for r in rows] == [4, 4, 4, 4]
