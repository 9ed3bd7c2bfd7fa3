"""`mrcctl wire`: sample writes a capture of every packet type; decode accounts for every frame (parsed
rows with the values that were built, rejects counted by reason), one JSON document with -j, errors as
{"error": ...} with a non-zero exit."""

from __future__ import annotations

import json
import random
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mrc.ctl.cli import main
from mrc.wire import IcrcContext, MrcPacket, Opcode, parse
from mrc.wire.ip import ether, ipv6_udp, pack_ipv6, split_ether
from mrc.wire.pcap import read_pcap, write_pcap
from mrc.wire.samples import HOST_A, HOST_B, ROUND, envelope, sample_frames

Cap = pytest.CaptureFixture[str]


def _run(capsys: Cap, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _json(capsys: Cap, *argv: str) -> tuple[int, Any]:
    rc, out, _ = _run(capsys, *argv)
    return rc, json.loads(out)  # exactly one document: json.loads rejects trailing data


def _built(frames: list[bytes]) -> list[MrcPacket]:
    out = []
    for raw in frames:
        f = split_ether(raw)
        out.append(parse(f.mrc, IcrcContext(f.inner.src, f.inner.dst), sport=f.sport))
    return out


@pytest.fixture
def sample_pcap(tmp_path: Path, capsys: Cap) -> Path:
    path = tmp_path / "s.pcap"
    rc, doc = _json(capsys, "-j", "wire", "sample", "--out", str(path), "--count", "3", "--seed", "5")
    assert rc == 0
    assert doc == {
        "file": str(path), "packets": 24, "rounds": 3, "seed": 5, "types": {k: 3 for k in ROUND},
    }
    return path


def test_sample_writes_what_sample_frames_builds(sample_pcap: Path) -> None:
    assert [d for _, d in read_pcap(sample_pcap)] == sample_frames(3, seed=5)


def test_decode_json_accounts_for_every_packet(sample_pcap: Path, capsys: Cap) -> None:
    rc, doc = _json(capsys, "-j", "wire", "decode", str(sample_pcap))
    assert rc == 0
    assert doc["file"] == str(sample_pcap)
    assert doc["total"] == doc["parsed"] == len(doc["packets"]) == 24
    assert doc["rejected"] == {} and doc["errors"] == []
    assert doc["icrc"] == {"ok": 21, "bad": 0, "ignored": 3, "truncated": 0}
    built = _built(sample_frames(3, seed=5))
    for row, p in zip(doc["packets"], built, strict=True):
        assert row["opcode"] == p.opcode_name and row["opcode_value"] == p.opcode
        assert (row["qpn"], row["psn"], row["ev"]) == (p.dqpn, p.psn, p.ev_index)
        assert (row["payload_len"], row["dma_len"]) == (len(p.payload), p.dma_len)
        assert row["flags_value"] == p.flags
        assert row["flow_label"] == p.ev_index
        assert row["container"].startswith("fcbb:bbbb:")
        assert row["inner_len"] == 8 + p.length and row["outer_len"] == 48 + p.length
        if p.is_data:
            assert row["va"] == hex(p.va) and row["rkey"] == hex(p.rkey) and row["imm"] == p.imm
        if p.trimmed:
            assert row["icrc"] == "ignored" and row["kind"] == "WRITE_TRIMMED"
            assert row["flags"] == "TRIMMED|PRIO"
        else:
            assert row["icrc"] == "ok"
    indexes = [r["index"] for r in doc["packets"]]
    assert indexes == list(range(1, 25))


def test_decode_control_bodies(sample_pcap: Path, capsys: Cap) -> None:
    _, doc = _json(capsys, "-j", "wire", "decode", str(sample_pcap))
    rows = doc["packets"]
    nack = next(r for r in rows if r["opcode"] == "NACK")
    trimmed = next(r for r in rows if r["kind"] == "WRITE_TRIMMED")
    assert nack["body"]["code_name"] == "TRIMMED" and nack["body"]["code"] == 1
    assert nack["psn"] == trimmed["psn"] and nack["body"]["echo_ev_index"] == trimmed["ev"]
    sack = next(r for r in rows if r["opcode"] == "SACK")
    write_imm = next(r for r in rows if r["opcode"] == "WRITE_IMM")
    assert sack["body"]["acked_psns"] == [write_imm["psn"]] and sack["body"]["bitmap"] == "0x1"
    probe = next(r for r in rows if r["opcode"] == "PROBE")
    reply = next(r for r in rows if r["opcode"] == "PROBE_REPLY")
    assert reply["body"]["request_id"] == probe["body"]["request_id"]
    assert reply["body"]["echo_ev_index"] == probe["ev"]
    status = next(r for r in rows if r["opcode"] == "PORT_STATUS")
    assert status["body"]["state_name"] == "UP" and status["body"]["epoch"] == 1


def test_trailing_json_flag(sample_pcap: Path, capsys: Cap) -> None:
    rc, doc = _json(capsys, "wire", "decode", str(sample_pcap), "-j")
    assert rc == 0 and doc["total"] == 24


def _garbage_frames() -> list[tuple[str | None, bytes]]:
    """(expected reject reason or None when it parses, frame) for frames that are not clean MRC."""
    good = sample_frames(1, seed=3)
    ipv4 = bytes(12) + b"\x08\x00" + bytes(40)
    dns = ether("02:00:00:00:00:01", "02:00:00:00:00:02",
                ipv6_udp(HOST_A.mrc_addr, HOST_B.mrc_addr, 5353, b"\x00" * 20, dport=53))
    tcp = ether("02:00:00:00:00:01", "02:00:00:00:00:02",
                pack_ipv6(HOST_A.mrc_addr, HOST_B.mrc_addr, 20, 6) + bytes(20))
    bad_opcode = bytearray(split_ether(good[0]).mrc)
    bad_opcode[0] = 0x99
    bad_version = bytearray(split_ether(good[5]).mrc)  # PROBE: MXH version at 12
    bad_version[12] = 7
    flipped = bytearray(good[0])
    flipped[-100] ^= 0x10  # a payload bit: parses, ICRC bad
    rng = random.Random(1)
    return [
        ("bad_ip", ipv4),
        ("bad_ip", dns),
        ("bad_ip", tcp),
        ("truncated", b"\x02\x00\x00"),
        ("truncated", good[0][:80]),  # IPv6 says more bytes than the frame has
        ("bad_opcode", envelope(bad_opcode, HOST_A, HOST_B, 1)),
        ("bad_version", envelope(bad_version, HOST_A, HOST_B, 1)),
        (None, bytes(flipped)),
        ("bad_ip", rng.randbytes(300)),
    ]


def test_decode_counts_garbage_by_reason(tmp_path: Path, capsys: Cap) -> None:
    good = sample_frames(1, seed=3)
    garbage = _garbage_frames()
    path = tmp_path / "mixed.pcap"
    frames = good + [f for _, f in garbage]
    write_pcap(path, [(1.0 + i, f) for i, f in enumerate(frames)])
    rc, doc = _json(capsys, "-j", "wire", "decode", str(path))
    assert rc == 0
    expected: dict[str, int] = {}
    for reason, _ in garbage:
        if reason:
            expected[reason] = expected.get(reason, 0) + 1
    assert doc["total"] == len(frames)
    assert doc["rejected"] == dict(sorted(expected.items()))
    assert doc["parsed"] + sum(doc["rejected"].values()) == doc["total"]
    assert doc["icrc"] == {"ok": 7, "bad": 1, "ignored": 1, "truncated": 0}
    # Rejected frames are listed with their index, so every frame is accounted for exactly once.
    seen = sorted([r["index"] for r in doc["packets"]] + [e["index"] for e in doc["errors"]])
    assert seen == list(range(1, len(frames) + 1))
    assert [e["reason"] for e in doc["errors"]] == [r for r, _ in garbage if r]
    bad = [r for r in doc["packets"] if r["icrc"] == "bad"]
    assert len(bad) == 1 and bad[0]["index"] == len(good) + 8


def test_decode_text_table_and_summary(sample_pcap: Path, tmp_path: Path, capsys: Cap) -> None:
    rc, out, _ = _run(capsys, "wire", "decode", str(sample_pcap))
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].split()[:5] == ["#", "OPCODE", "QPN", "PSN", "EV"]
    assert len(lines) == 1 + 24 + 1
    assert "TRIMMED|PRIO" in lines[2] and "ignored" in lines[2] and "0/4096" in lines[2]
    assert "fcbb:bbbb:" in lines[1]
    summary = f"{sample_pcap}: 24 frames, 24 parsed, 0 rejected (none); ICRC ok 21, bad 0, ignored 3"
    assert lines[-1] == summary
    mixed = tmp_path / "m.pcap"
    write_pcap(mixed, [(0.0, b"\x00" * 5), *[(1.0, f) for f in sample_frames(1)]])
    _, out, _ = _run(capsys, "wire", "decode", str(mixed))
    assert "REJECTED" in out.splitlines()[1]
    summary = "9 frames, 8 parsed, 1 rejected (truncated 1); ICRC ok 7, bad 0, ignored 1"
    assert out.splitlines()[-1].endswith(summary)


@pytest.mark.parametrize("content", [None, b"", b"not a pcap at all, just text\n", "truncated"])
def test_decode_bad_file_is_a_json_error(tmp_path: Path, capsys: Cap, content: bytes | str | None) -> None:
    path = tmp_path / "bad.pcap"
    if content == "truncated":
        write_pcap(path, [(0.0, f) for f in sample_frames(1)])
        path.write_bytes(path.read_bytes()[:-7])
    elif isinstance(content, bytes):
        path.write_bytes(content)
    rc, out, err = _run(capsys, "-j", "wire", "decode", str(path))
    assert rc != 0
    doc = json.loads(out)
    assert set(doc) == {"error"} and str(path) in doc["error"]
    assert "Traceback" not in err and "struct" not in doc["error"]
    rc, out, err = _run(capsys, "wire", "decode", str(path))
    assert rc != 0 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("mrcctl: error: ") and str(path) in err


def test_sample_errors(tmp_path: Path, capsys: Cap) -> None:
    rc, doc = _json(capsys, "-j", "wire", "sample", "--out", str(tmp_path / "x.pcap"), "--count", "0")
    assert rc != 0 and "count" in doc["error"]
    rc, doc = _json(capsys, "-j", "wire", "sample", "--out", str(tmp_path / "no" / "x.pcap"))
    assert rc != 0 and "cannot write" in doc["error"]
    rc, out, _ = _run(capsys, "wire", "sample", "--out", str(tmp_path / "ok.pcap"))
    assert rc == 0 and "wrote 8 packets" in out and "WRITE_TRIMMED 1" in out


def test_show_is_default_and_lists_the_format(capsys: Cap) -> None:
    rc, doc = _json(capsys, "-j", "wire", "show")
    assert rc == 0
    ops = {o["name"]: o for o in doc["opcodes"]}
    assert set(ops) == {"WRITE", "WRITE_IMM", "SACK", "NACK", "PROBE", "PROBE_REPLY", "PORT_STATUS"}
    assert ops["WRITE"]["value"] == Opcode.RDMA_WRITE_ONLY and ops["WRITE"]["header_bytes"] == 52
    assert ops["WRITE_IMM"]["header_bytes"] == 56 and ops["SACK"]["header_bytes"] == 36
    assert {f["name"]: f["value"] for f in doc["mxh_flags"]}["TRIMMED"] == 1
    assert {c["name"]: c["fatal"] for c in doc["nack_codes"]}["BAD_RKEY"] is True
    assert doc["udp_dport"] == 4791
    rc2, doc2 = _json(capsys, "-j", "wire")
    assert rc2 == 0 and doc2 == doc
    rc, out, _ = _run(capsys, "wire")
    assert rc == 0 and "PORT_STATUS" in out and "ACK_REQ_NOW" in out and "0xc0" in out


EDITCAP = shutil.which("editcap")
#: Row fields that a snaplen cut must not change: headers and on-the-wire lengths.
_HEADER_FIELDS = (
    "opcode", "kind", "qpn", "psn", "ev", "flags_value", "ackreq", "payload_len", "dma_len", "pad", "va",
    "rkey", "imm", "msn", "msg_len", "msg_offset", "timestamp_ns", "mrc_len", "outer_len", "inner_len",
    "frame_len", "sport", "src", "dst", "container", "flow_label", "ecn",
)


def _editcap(*args: str) -> None:
    assert EDITCAP is not None
    proc = subprocess.run([EDITCAP, *args], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.tshark
@pytest.mark.skipif(EDITCAP is None, reason="editcap is not installed (apt-get install tshark)")
def test_decode_pcapng_and_snaplen_cut_copies(sample_pcap: Path, tmp_path: Path, capsys: Cap) -> None:
    """What editcap makes of our capture (pcapng, the default of the Wireshark tools, and a copy cut
    to 200 bytes a frame) decodes to the same headers and on-the-wire lengths as the original."""
    _, orig = _json(capsys, "-j", "wire", "decode", str(sample_pcap))
    ng = tmp_path / "s.pcapng"
    _editcap("-F", "pcapng", str(sample_pcap), str(ng))
    rc, doc = _json(capsys, "-j", "wire", "decode", str(ng))
    assert rc == 0 and doc["file"] == str(ng)
    assert doc["packets"] == orig["packets"] and doc["icrc"] == orig["icrc"]
    for src, name in ((sample_pcap, "cut.pcap"), (ng, "cut.pcapng")):
        cut = tmp_path / name
        _editcap("-s", "200", str(src), str(cut))
        rc, doc = _json(capsys, "-j", "wire", "decode", str(cut))
        assert rc == 0
        assert doc["total"] == doc["parsed"] == 24 and doc["rejected"] == {}
        cut_rows = [r for r in orig["packets"] if r["frame_len"] > 200]
        assert cut_rows and all(r["opcode"] in ("WRITE", "WRITE_IMM") for r in cut_rows)
        assert doc["icrc"] == {"ok": 21 - len(cut_rows), "bad": 0, "ignored": 3, "truncated": len(cut_rows)}
        for row, want in zip(doc["packets"], orig["packets"], strict=True):
            assert {k: row[k] for k in _HEADER_FIELDS} == {k: want[k] for k in _HEADER_FIELDS}
            assert row["truncated"] is (want["frame_len"] > 200)
            assert row["captured_len"] == min(200, want["frame_len"])
            assert row["icrc"] == ("truncated" if row["truncated"] else want["icrc"])
        big = next(r for r in doc["packets"] if r["payload_len"] == 4096 and r["truncated"])
        assert big["frame_len"] == 4254 and big["captured_len"] == 200
        rc, out, _ = _run(capsys, "wire", "decode", str(cut))
        assert rc == 0 and "4096/4096" in out
        assert out.splitlines()[-1].endswith(
            f"truncated {len(cut_rows)} (cut by the capture's snaplen)")


def test_decode_reads_pcapng_without_editcap(tmp_path: Path, capsys: Cap) -> None:
    """A pcapng written by hand (big-endian, two interfaces, nanosecond clock on the second) decodes
    with the records' times; a cut one reports the on-the-wire payload length."""
    frames = sample_frames(1, seed=5)
    e = ">"

    def block(btype: int, body: bytes) -> bytes:
        body += bytes(-len(body) & 3)
        return struct.pack(e + "II", btype, 12 + len(body)) + body + struct.pack(e + "I", 12 + len(body))

    tsresol_ns = struct.pack(e + "HH", 9, 1) + b"\x09\x00\x00\x00" + struct.pack(e + "HH", 0, 0)
    blob = block(0x0A0D0D0A, struct.pack(e + "IHHq", 0x1A2B3C4D, 1, 0, -1))
    blob += block(1, struct.pack(e + "HHI", 1, 0, 0)) + block(1, struct.pack(e + "HHI", 1, 0, 0) + tsresol_ns)
    for i, f in enumerate(frames):
        data = f[:155]
        ticks = 1_700_000_000 * 10**9 + i
        head = struct.pack(e + "IIIII", 1, ticks >> 32, ticks & 0xFFFFFFFF, len(data), len(f))
        blob += block(6, head + data)
    path = tmp_path / "hand.pcapng"
    path.write_bytes(blob)
    rc, doc = _json(capsys, "-j", "wire", "decode", str(path))
    assert rc == 0
    assert doc["total"] == 8
    write = doc["packets"][0]
    assert write["opcode"] == "WRITE" and write["payload_len"] == 4096 and write["truncated"]
    assert write["time"] == pytest.approx(1_700_000_000.0, abs=1e-6)
    assert doc["packets"][1]["time"] == pytest.approx(1_700_000_000 + 1e-9, abs=1e-7)
    assert write["icrc"] == "truncated"
    # Headers cut by a 155-byte snaplen: the 56-byte WRITE_IMM headers end at byte 158.
    assert [e["reason"] for e in doc["errors"]] == ["truncated"]
    assert "too few for the MRC headers" in doc["errors"][0]["detail"]


@pytest.mark.parametrize("blob", [
    struct.pack("<I", 0x0A0D0D0A) + b"\x00" * 8,
    struct.pack("<IIIHHq", 0x0A0D0D0A, 28, 0x1A2B3C4D, 1, 0, -1) + struct.pack("<I", 28)
    + struct.pack("<II", 6, 0xFFFFFF00),
])
def test_decode_broken_pcapng_is_one_clear_error(tmp_path: Path, capsys: Cap, blob: bytes) -> None:
    path = tmp_path / "bad.pcapng"
    path.write_bytes(blob)
    rc, out, err = _run(capsys, "-j", "wire", "decode", str(path))
    assert rc != 0
    doc = json.loads(out)
    assert set(doc) == {"error"} and str(path) in doc["error"] and "block" in doc["error"]
    assert "Traceback" not in err
