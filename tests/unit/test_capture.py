"""mrc.wire.pcapng and mrc.wire.capture: pcapng files in both byte orders with several interfaces,
sections, timestamp resolutions and packet block kinds; every kind of broken pcapng reported as a
PcapError naming the file, offset and block; link types other than Ethernet; snaplen-cut frames
decoded from their headers with their on-the-wire lengths. Files written by editcap (the tool that
makes pcapng and snaplen-cut copies in the field) are read as well as hand-made ones."""

from __future__ import annotations

import contextlib
import random
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from mrc.errors import MrcError
from mrc.wire import WireError
from mrc.wire.capture import (
    LINKTYPE_IPV6,
    LINKTYPE_LINUX_SLL,
    LINKTYPE_LINUX_SLL2,
    LINKTYPE_RAW,
    Captured,
    parse_captured,
    read_capture,
    split_captured,
)
from mrc.wire.ip import ETH_LEN, split_ether
from mrc.wire.pcap import LINKTYPE_ETHERNET, PcapError, Record, write_pcap
from mrc.wire.pcapng import MAX_BLOCK, read_pcapng
from mrc.wire.samples import HOST_A, HOST_B, ROUND, envelope, sample_frames

EDITCAP = shutil.which("editcap")

# ------------------------------------------------------------------------------ hand-made pcapng


def _opt(e: str, code: int, value: bytes) -> bytes:
    return struct.pack(e + "HH", code, len(value)) + value + bytes(-len(value) & 3)


def _opts(e: str, *opts: bytes) -> bytes:
    return b"".join(opts) + struct.pack(e + "HH", 0, 0) if opts else b""


def _block(e: str, btype: int, body: bytes) -> bytes:
    body += bytes(-len(body) & 3)
    total = 12 + len(body)
    return struct.pack(e + "II", btype, total) + body + struct.pack(e + "I", total)


def _shb(e: str, major: int = 1) -> bytes:
    return _block(e, 0x0A0D0D0A, struct.pack(e + "IHHq", 0x1A2B3C4D, major, 0, -1))


def _idb(e: str, linktype: int = 1, snaplen: int = 0, *opts: bytes) -> bytes:
    return _block(e, 1, struct.pack(e + "HHI", linktype, 0, snaplen) + _opts(e, *opts))


def _epb(e: str, iface: int, ticks: int, data: bytes, orig: int | None = None, *opts: bytes) -> bytes:
    head = struct.pack(e + "IIIII", iface, ticks >> 32, ticks & 0xFFFFFFFF, len(data),
                       len(data) if orig is None else orig)
    return _block(e, 6, head + data + bytes(-len(data) & 3) + _opts(e, *opts))


def _spb(e: str, orig: int, data: bytes) -> bytes:
    return _block(e, 3, struct.pack(e + "I", orig) + data)


def _pb(e: str, iface: int, ticks: int, data: bytes) -> bytes:
    head = struct.pack(e + "HHIIII", iface, 0, ticks >> 32, ticks & 0xFFFFFFFF, len(data), len(data))
    return _block(e, 2, head + data)


@pytest.mark.parametrize("e", ["<", ">"])
def test_pcapng_interfaces_resolutions_and_packet_blocks(tmp_path: Path, e: str) -> None:
    """Two interfaces (us default, ns via if_tsresol, one with a 2^-10 s clock and if_tsoffset), an
    EPB comment option, a name-resolution block and a statistics block skipped, an SPB (no time)."""
    p = tmp_path / "multi.pcapng"
    blob = (
        _shb(e)
        + _idb(e, 1, 0)  # interface 0: Ethernet, microseconds
        + _idb(e, LINKTYPE_LINUX_SLL2, 262144, _opt(e, 9, b"\x09"))  # 1: SLL2, nanoseconds
        + _idb(e, LINKTYPE_RAW, 0, _opt(e, 9, b"\x8a"), _opt(e, 14, struct.pack(e + "q", 100)))
        + _block(e, 4, struct.pack(e + "HH", 0, 0))  # name resolution: skipped
        + _epb(e, 0, 1_700_000_000_250_000, b"eth" * 20, None, _opt(e, 1, b"a comment"))
        + _epb(e, 1, 1_700_000_000_123_456_789, b"sll" * 10, 5000)
        + _epb(e, 2, 3 * 1024 + 512, b"raw")
        + _block(e, 5, struct.pack(e + "III", 0, 0, 0))  # interface statistics: skipped
        + _spb(e, 7, b"simple!")
        + _pb(e, 1, 2_000_000_000, b"old")
    )
    p.write_bytes(blob)
    got = list(read_capture(p))
    assert [(r.data, r.orig_len, r.linktype, r.interface) for r in got] == [
        (b"eth" * 20, 60, 1, 0),
        (b"sll" * 10, 5000, LINKTYPE_LINUX_SLL2, 1),
        (b"raw", 3, LINKTYPE_RAW, 2),
        (b"simple!", 7, 1, 0),
        (b"old", 3, LINKTYPE_LINUX_SLL2, 1),
    ]
    assert got[0].time == pytest.approx(1_700_000_000.25, abs=1e-6)
    assert got[1].time == pytest.approx(1_700_000_000.123456789, abs=1e-7)
    assert got[1].truncated and not got[0].truncated
    assert got[2].time == 100 + 3.5
    assert got[3].time is None
    assert got[4].time == 2.0
    assert list(read_pcapng(p)) == got


def test_pcapng_sections_switch_byte_order_and_interfaces(tmp_path: Path) -> None:
    p = tmp_path / "sections.pcapng"
    p.write_bytes(
        _shb("<") + _idb("<", 1) + _idb("<", 101) + _epb("<", 1, 5, b"first")
        + _shb(">") + _idb(">", 113) + _epb(">", 0, 6, b"second")
    )
    got = list(read_capture(p))
    assert [(r.data, r.linktype, r.interface) for r in got] == [(b"first", 101, 1), (b"second", 113, 0)]
    # A new section forgets the previous one's interfaces.
    p.write_bytes(_shb("<") + _idb("<", 1) + _idb("<", 1) + _shb("<") + _idb("<", 1) + _epb("<", 1, 0, b"x"))
    _expect(p, "block 5 (enhanced packet)", "interface 1, but the section describes 1 interface(s)")


def test_simple_packet_block_respects_snaplen(tmp_path: Path) -> None:
    p = tmp_path / "spb.pcapng"
    p.write_bytes(_shb("<") + _idb("<", 1, 4) + _spb("<", 4000, b"abcdefgh"))
    ((rec,),) = [list(read_capture(p))]
    assert rec.data == b"abcd" and rec.orig_len == 4000 and rec.truncated


def _expect(path: Path, *fragments: str) -> PcapError:
    with pytest.raises(PcapError) as ei:
        list(read_capture(path))
    msg = str(ei.value)
    assert isinstance(ei.value, MrcError)
    assert str(path) in msg
    for frag in fragments:
        assert frag in msg, msg
    return ei.value


def test_broken_pcapng_files_name_offset_block_and_problem(tmp_path: Path) -> None:
    p = tmp_path / "bad.pcapng"
    e = "<"
    good = _shb(e) + _idb(e, 1)
    shb_len, idb_len = len(_shb(e)), len(_idb(e, 1))
    cases: list[tuple[bytes, tuple[str, ...]]] = [
        (b"", ("offset 0", "empty file")),
        (struct.pack("<I", 0x0A0D0D0A) + b"\x00" * 8, ("block 0 (section header)", "bad byte-order magic")),
        (_shb(e, major=2), ("offset 0", "unsupported pcapng version 2.0")),
        (good + struct.pack("<II", 6, 13) + bytes(5), (f"offset {shb_len + idb_len}", "block 2",
                                                        "block length 13 is not a multiple of 4")),
        (good + struct.pack("<II", 6, 8), ("block 2", "block length 8")),
        (good + struct.pack("<II", 6, MAX_BLOCK + 4), ("block 2", "exceeds the limit")),
        (good + _epb(e, 0, 0, b"abcd")[:-6], ("block 2 (enhanced packet)", "truncated block")),
        (good + _epb(e, 0, 0, b"abcd")[:-4] + struct.pack("<I", 99),
         ("block 2 (enhanced packet)", "trailing block length 99 != leading")),
        (good + _epb(e, 3, 0, b"abcd"), ("interface 3, but the section describes 1 interface(s)",)),
        (_shb(e) + _epb(e, 0, 0, b"abcd"), ("block 1", "interface 0, but the section describes 0")),
        (_shb(e) + _spb(e, 4, b"abcd"), ("simple packet before any interface description",)),
        (good + _block(e, 6, struct.pack("<IIIII", 0, 0, 0, 100, 100) + b"ab"),
         ("captured length 100 exceeds the 4 bytes the block holds",)),
        (good + _block(e, 6, bytes(8)), ("enhanced packet body of 8 bytes, 20 needed",)),
        (_shb(e) + _block(e, 1, struct.pack("<HHI", 1, 0, 0) + struct.pack("<HH", 9, 40)),
         ("block 1 (interface description)", "option 9 of 40 bytes overruns the block")),
        (_shb(e) + _idb(e, 1, 0, _opt(e, 9, b"\x20")), ("if_tsresol 10^-32 s is out of range",)),
        (_shb(e) + _idb(e, 1, 0, _opt(e, 9, b"\x06\x00")), ("if_tsresol of 2 bytes",)),
        (_shb(e) + _idb(e, 1, 0, _opt(e, 14, b"\x00")), ("if_tsoffset of 1 bytes",)),
        (good + b"\x06\x00\x00", (f"offset {shb_len + idb_len}", "truncated block header (3 of 8 bytes)")),
        (_idb(e, 1) + _epb(e, 0, 0, b""), ("offset 0", "not a pcap or pcapng file")),
        # a section header of 12 bytes: nothing after its byte-order magic (a struct.error traceback)
        (b"\x0a\x0d\x0d\x0a\x0c\x00\x00\x00\x4d\x3c\x2b\x1a",
         ("block 0 (section header)", "block length 12 is not a multiple of 4 of at least 28")),
    ]
    for blob, frags in cases:
        p.write_bytes(blob)
        _expect(p, *frags)


def test_not_a_capture_and_missing_file(tmp_path: Path) -> None:
    _expect(tmp_path / "nope.pcapng", "cannot open")
    p = tmp_path / "text.pcapng"
    p.write_bytes(b"GIF89a and more")
    _expect(p, "offset 0", "not a pcap or pcapng file", "47494638")
    p.write_bytes(b"")
    _expect(p, "empty file")


def test_every_truncation_of_a_pcapng_is_clean_end_or_pcap_error(tmp_path: Path) -> None:
    """No cut of a valid pcapng raises anything but PcapError (never struct.error or IndexError); a
    cut on a block boundary after the section header is a clean end with the packets before it."""
    e = ">"
    blocks = [_shb(e), _idb(e, 1, 0, _opt(e, 9, b"\x09")), _epb(e, 0, 10**9, b"p" * 30, 64),
              _spb(e, 5, b"12345")]
    full = b"".join(blocks)
    ends = [sum(len(b) for b in blocks[: i + 1]) for i in range(len(blocks))]
    packets_at = {ends[0]: 0, ends[1]: 0, ends[2]: 1, ends[3]: 2}
    cut = tmp_path / "cut.pcapng"
    for n in range(len(full) + 1):
        cut.write_bytes(full[:n])
        if n in packets_at:
            assert len(list(read_capture(cut))) == packets_at[n]
        else:
            with pytest.raises(PcapError):
                list(read_capture(cut))


# ---------------------------------------------------------------------------------- editcap files


def _editcap(*args: str) -> None:
    assert EDITCAP is not None
    proc = subprocess.run([EDITCAP, *args], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.tshark
@pytest.mark.skipif(EDITCAP is None, reason="editcap is not installed (apt-get install tshark)")
def test_editcap_pcapng_and_snaplen_copies_read_back(tmp_path: Path) -> None:
    frames = sample_frames(2, seed=4)
    src = tmp_path / "s.pcap"
    write_pcap(src, [(1_700_000_000 + i * 1e-6, f) for i, f in enumerate(frames)])
    ng = tmp_path / "s.pcapng"
    _editcap("-F", "pcapng", str(src), str(ng))
    assert ng.read_bytes()[:4] == b"\x0a\x0d\x0d\x0a"
    got = list(read_capture(ng))
    assert [r.data for r in got] == frames
    assert [r.orig_len for r in got] == [len(f) for f in frames]
    assert {r.linktype for r in got} == {LINKTYPE_ETHERNET}
    assert got[3].time == pytest.approx(1_700_000_000 + 3e-6, abs=1e-7)
    for fmt, name in (("pcapng", "cut.pcapng"), ("pcap", "cut.pcap")):
        cut = tmp_path / name
        _editcap("-F", fmt, "-s", "200", str(src), str(cut))
        got = list(read_capture(cut))
        assert [r.data for r in got] == [f[:200] for f in frames]
        assert [r.orig_len for r in got] == [len(f) for f in frames]
        assert [r.truncated for r in got] == [len(f) > 200 for f in frames]


# --------------------------------------------------------------------------------- link types, cuts


def _rec(frame: bytes, orig: int | None = None, linktype: int = LINKTYPE_ETHERNET) -> Record:
    return Record(0.0, frame, len(frame) if orig is None else orig, linktype)


def test_link_types_and_vlan_tags_reach_the_same_packet() -> None:
    frame = sample_frames(1, seed=1)[0]
    ip = frame[ETH_LEN:]
    want = parse_captured(split_captured(_rec(frame)))[0]
    vlan = frame[:12] + b"\x81\x00\x60\x05" + frame[12:]
    qinq = frame[:12] + b"\x88\xa8\x00\x07\x81\x00\x60\x05" + frame[12:]
    sll = struct.pack("!HHH8sH", 0, 1, 6, bytes(8), 0x86DD) + ip
    sll2 = struct.pack("!HHIHBB8s", 0x86DD, 0, 3, 1, 0, 6, bytes(8)) + ip
    for data, lt in ((vlan, LINKTYPE_ETHERNET), (qinq, LINKTYPE_ETHERNET), (ip, LINKTYPE_RAW),
                     (ip, LINKTYPE_IPV6), (sll, LINKTYPE_LINUX_SLL), (sll2, LINKTYPE_LINUX_SLL2)):
        pkt, icrc = parse_captured(split_captured(_rec(data, linktype=lt)))
        assert icrc == "ok", lt
        assert (pkt.psn, pkt.ev_index, pkt.timestamp_ns, bytes(pkt.payload)) == (
            want.psn, want.ev_index, want.timestamp_ns, bytes(want.payload))
    with pytest.raises(WireError, match="link type 105 is not decoded") as ei:
        split_captured(_rec(ip, linktype=105))
    assert ei.value.reason == "bad_ip"
    with pytest.raises(WireError, match="more than 2 VLAN tags"):
        split_captured(_rec(frame[:12] + b"\x81\x00\x00\x01" * 3 + frame[12:]))
    with pytest.raises(WireError, match="protocol 0x0800"):
        split_captured(_rec(sll[:14] + b"\x08\x00" + ip, linktype=LINKTYPE_LINUX_SLL))
    with pytest.raises(WireError, match="IP version 4"):
        split_captured(_rec(b"\x45" + ip[1:], linktype=LINKTYPE_RAW))


def _cut(frame: bytes, n: int) -> Captured:
    return split_captured(_rec(frame[:n], len(frame)))


def test_cut_write_keeps_headers_and_wire_lengths() -> None:
    frames = sample_frames(1, seed=0)
    write = frames[ROUND.index("WRITE")]
    full, _ = parse_captured(split_captured(_rec(write)))
    assert full.dma_len == 4096
    c = _cut(write, 200)
    assert c.truncated and c.captured_len == 200 and c.wire_len == len(write)
    assert c.mrc_len == full.length and len(c.frame.mrc) == 200 - 102
    pkt, icrc = parse_captured(c)
    assert icrc == "truncated"
    for field in ("opcode", "dqpn", "psn", "va", "rkey", "dma_len", "flags", "ev_index", "msn", "msg_len",
                  "msg_offset", "timestamp_ns", "pad", "length"):
        assert getattr(pkt, field) == getattr(full, field), field
    # The payload is the part the capture kept, never zeros standing in for the rest.
    assert bytes(pkt.payload) == bytes(full.payload)[: 200 - 102 - 52]
    # Lengths are still checked, against the length on the wire: a frame that was short on the wire
    # too (orig_len says so) is rejected as before.
    with pytest.raises(WireError) as ei:
        split_captured(_rec(write[:200], len(write) - 100))
    assert ei.value.reason == "truncated"
    # A DMA length that disagrees with the wire length is still bad_length.
    bad = bytearray(write)
    bad[102 + 24 : 102 + 28] = struct.pack("!I", 4000)
    with pytest.raises(WireError) as ei:
        parse_captured(_cut(bytes(bad), 200))
    assert ei.value.reason == "bad_length"


def test_cut_control_packets() -> None:
    frames = sample_frames(1, seed=0)
    sack = frames[ROUND.index("SACK")]
    full, _ = parse_captured(split_captured(_rec(sack)))
    # The ICRC cut off: the body is whole and decoded.
    pkt, icrc = parse_captured(_cut(sack, len(sack) - 2))
    assert icrc == "truncated" and pkt.body == full.body
    # The body cut: headers decoded, body None.
    pkt, icrc = parse_captured(_cut(sack, 102 + 40))
    assert icrc == "truncated" and pkt.body is None
    assert (pkt.psn, pkt.ev_index, pkt.timestamp_ns, pkt.length) == (
        full.psn, full.ev_index, full.timestamp_ns, full.length)
    # Header checks still apply to a cut control packet.
    bad = bytearray(sack)
    bad[102 + 12] = 9  # MXH version
    with pytest.raises(WireError) as ei:
        parse_captured(_cut(bytes(bad), 102 + 40))
    assert ei.value.reason == "bad_version"
    bad = bytearray(sack)
    bad[102 + 13] |= 1  # TRIMMED
    with pytest.raises(WireError, match="TRIMMED set on a control packet"):
        parse_captured(_cut(bytes(bad), 102 + 40))


def test_a_cut_inside_the_headers_is_truncated_and_says_how_much_was_kept() -> None:
    write = sample_frames(1, seed=0)[0]
    cases = [
        (50, f"kept 50 of {len(write)} bytes, too few for the IPv6 header (54)"),
        (80, f"kept 80 of {len(write)} bytes, too few for the inner IPv6 header (94)"),
        (96, f"kept 96 of {len(write)} bytes, too few for the UDP header (102)"),
        (130, f"kept 28 of {len(write) - 102} bytes, too few for the MRC headers (52)"),
        (110, f"kept 8 of {len(write) - 102} bytes, too few for BTH (12)"),
    ]
    for n, message in cases:
        with pytest.raises(WireError) as ei:
            parse_captured(_cut(write, n))
        assert ei.value.reason == "truncated"
        assert message in str(ei.value)


def test_every_cut_of_every_sample_frame_decodes_or_is_a_wire_error() -> None:
    """Whatever the snaplen, a frame gives its headers with the on-the-wire values or a WireError
    (never IndexError or struct.error); once the headers are kept, the values never change."""
    frames = sample_frames(1, seed=6)
    for frame in frames:
        full, _ = parse_captured(split_captured(_rec(frame)))
        hl = 102 + (52 if full.is_data else 36) + (4 if full.imm is not None else 0)
        for n in range(len(frame) + 1):
            try:
                pkt, icrc = parse_captured(_cut(frame, n))
            except WireError as e:
                assert e.reason == "truncated", (n, e)
                assert n < hl
                continue
            assert n >= hl
            assert (pkt.opcode, pkt.psn, pkt.ev_index, pkt.dma_len, pkt.length) == (
                full.opcode, full.psn, full.ev_index, full.dma_len, full.length)
            assert icrc == (full.icrc if n == len(frame) else "truncated")


def test_cut_after_the_udp_payload_is_a_whole_packet() -> None:
    """Ethernet padding or a trailer that the snaplen cut leaves the MRC packet whole: ICRC checked."""
    write = sample_frames(1, seed=0)[0]
    c = split_captured(_rec(write, len(write) + 4))  # 4 bytes of FCS not captured
    assert not c.truncated
    assert parse_captured(c)[1] == "ok"


def test_envelope_matches_split_ether_for_whole_frames() -> None:
    for frame in [*sample_frames(1, seed=2), envelope(b"\x00" * 60, HOST_A, HOST_B, 5)]:
        assert split_captured(_rec(frame)).frame == split_ether(frame)


def test_mutated_cut_frames_give_a_packet_or_a_wire_error() -> None:
    """Seeded mutations of sample frames, cut anywhere, with any claimed wire length and link type:
    `split_captured` + `parse_captured` return a packet or raise WireError, nothing else."""
    rng = random.Random(20)
    frames = sample_frames(2, seed=1)
    for _ in range(3000):
        f = bytearray(rng.choice(frames))
        for _ in range(rng.randrange(4)):
            f[rng.randrange(len(f))] = rng.randrange(256)
        cap = rng.randrange(len(f) + 1)
        orig = rng.choice([len(f), max(0, len(f) + rng.randrange(-50, 5000)), rng.randrange(1 << 32)])
        lt = rng.choice([LINKTYPE_ETHERNET, LINKTYPE_ETHERNET, LINKTYPE_RAW, LINKTYPE_LINUX_SLL2, 0])
        with contextlib.suppress(WireError):
            parse_captured(split_captured(Record(0.0, bytes(f[:cap]), orig, lt)))


def test_mutated_pcapng_files_give_records_or_a_pcap_error(tmp_path: Path) -> None:
    rng = random.Random(21)
    frames = sample_frames(1, seed=1)
    e = "<"
    src = _shb(e) + _idb(e, 1, 0, _opt(e, 9, b"\x09")) + b"".join(
        _epb(e, 0, i, f[:200], len(f)) for i, f in enumerate(frames)) + _spb(e, 10, b"0123456789")
    p = tmp_path / "m.pcapng"
    for _ in range(1500):
        b = bytearray(src)
        for _ in range(rng.randrange(1, 5)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        if rng.random() < 0.3:
            b = b[: rng.randrange(len(b))]
        p.write_bytes(b)
        try:
            for rec in read_capture(p):
                assert len(rec.data) <= rec.orig_len
        except PcapError:
            pass


def test_an_outer_ipv6_length_that_is_not_what_it_carries_is_bad_length() -> None:
    """The outer IPv6 header is no part of the ICRC: its payload length must be the routing header plus
    the inner packet. One of 20 passed (`wire decode` showed the probe inside as ok) where Wireshark
    calls the frame malformed and shows no MRC packet."""
    frame = bytearray(sample_frames(1, seed=2)[0])
    assert split_ether(frame).outer is not None
    for bad in (20, struct.unpack_from("!H", frame, ETH_LEN + 4)[0] - 8):
        f = bytearray(frame)
        struct.pack_into("!H", f, ETH_LEN + 4, bad)  # the outer header's payload length
        with pytest.raises(WireError, match="outer IPv6 payload length") as e:
            split_ether(f)
        assert e.value.reason == "bad_length"
        with pytest.raises(WireError, match="outer IPv6 payload length"):
            split_captured(_rec(bytes(f)))
