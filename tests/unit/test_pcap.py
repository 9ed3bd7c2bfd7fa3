"""mrc.wire.pcap: classic pcap round trips, both magics and byte orders, interop with scapy, and every
kind of broken file reported as PcapError (an MrcError) naming the file and the byte offset."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from mrc.errors import MrcError
from mrc.wire.pcap import (
    GLOBAL_HDR_LEN,
    LINKTYPE_ETHERNET,
    MAGIC_NSEC,
    MAGIC_USEC,
    RECORD_HDR_LEN,
    PcapError,
    read_pcap,
    write_pcap,
)

FRAMES = [
    (1_700_000_000.25, b"\x02" * 60),
    (1_700_000_000.500001, bytes(range(256)) * 4),
    (1_700_000_001.0, b""),
    (1_700_000_002.999999, b"\xff" * 9014),
]


def _handmade(
    path: Path, endian: str, magic: int, records: list[tuple[int, int, bytes]], linktype: int = 1
) -> None:
    """A pcap written independently of write_pcap, in any byte order, from (sec, frac, data)."""
    out = struct.pack(endian + "IHHiIII", magic, 2, 4, 0, 0, 65535, linktype)
    for sec, frac, data in records:
        out += struct.pack(endian + "IIII", sec, frac, len(data), len(data)) + data
    path.write_bytes(out)


def test_round_trip_microseconds(tmp_path: Path) -> None:
    p = tmp_path / "a.pcap"
    assert write_pcap(p, FRAMES) == len(FRAMES)
    got = list(read_pcap(p))
    assert [d for _, d in got] == [d for _, d in FRAMES]
    for (ts, _), (want, _) in zip(got, FRAMES, strict=True):
        assert ts == pytest.approx(want, abs=1e-6)
    head = p.read_bytes()[:GLOBAL_HDR_LEN]
    assert struct.unpack("<IHHiIII", head) == (MAGIC_USEC, 2, 4, 0, 0, 262144, LINKTYPE_ETHERNET)


def test_round_trip_nanoseconds(tmp_path: Path) -> None:
    p = tmp_path / "ns.pcap"
    write_pcap(p, [(12.123456789, b"x" * 20)], nanoseconds=True)
    raw = p.read_bytes()
    assert struct.unpack_from("<I", raw)[0] == MAGIC_NSEC
    assert struct.unpack_from("<II", raw, GLOBAL_HDR_LEN) == (12, 123456789)
    ((ts, data),) = list(read_pcap(p))
    assert data == b"x" * 20 and ts == pytest.approx(12.123456789, abs=1e-9)


def test_fraction_rounding_carries_into_seconds(tmp_path: Path) -> None:
    p = tmp_path / "r.pcap"
    write_pcap(p, [(4.9999999, b"a")])
    assert struct.unpack_from("<II", p.read_bytes(), GLOBAL_HDR_LEN) == (5, 0)


@pytest.mark.parametrize("endian", ["<", ">"])
@pytest.mark.parametrize(("magic", "frac", "seconds"), [(MAGIC_USEC, 250_000, 0.25), (MAGIC_NSEC, 7, 7e-9)])
def test_reads_both_byte_orders_and_magics(
    tmp_path: Path, endian: str, magic: int, frac: int, seconds: float
) -> None:
    p = tmp_path / "h.pcap"
    _handmade(p, endian, magic, [(100, frac, b"abc"), (101, 0, b"\x00" * 70)])
    got = list(read_pcap(p))
    assert [d for _, d in got] == [b"abc", b"\x00" * 70]
    assert got[0][0] == pytest.approx(100 + seconds, abs=1e-12)
    assert got[1][0] == 101.0


def test_scapy_reads_ours_and_we_read_scapys(tmp_path: Path) -> None:
    from scapy.layers.l2 import Ether
    from scapy.utils import PcapWriter, RawPcapReader

    ours = tmp_path / "ours.pcap"
    write_pcap(ours, FRAMES)
    with RawPcapReader(str(ours)) as reader:
        got = [(data, meta) for data, meta in reader]
    assert reader.linktype == LINKTYPE_ETHERNET
    assert [d for d, _ in got] == [d for _, d in FRAMES]
    assert got[1][1].sec + got[1][1].usec * 1e-6 == pytest.approx(FRAMES[1][0], abs=1e-6)

    # scapy writing big-endian with nanosecond timestamps (its `usec` argument is then nanoseconds).
    theirs = tmp_path / "theirs.pcap"
    frame = bytes(Ether(dst="02:00:00:00:00:01", src="02:00:00:00:00:02", type=0x86DD) / bytes(40))
    w = PcapWriter(str(theirs), linktype=LINKTYPE_ETHERNET, nano=True, endianness=">", sync=True)
    w.write_header(None)  # write_packet alone does not write the global header
    w.write_packet(frame, sec=1_700_000_000, usec=123_456_789)
    w.close()
    assert struct.unpack_from(">I", theirs.read_bytes())[0] == MAGIC_NSEC
    ((ts, data),) = list(read_pcap(theirs))
    assert data == frame
    assert ts == pytest.approx(1_700_000_000.123456789, abs=1e-6)


def _expect_error(path: Path, *fragments: str) -> PcapError:
    with pytest.raises(PcapError) as ei:
        list(read_pcap(path))
    msg = str(ei.value)
    assert str(path) in msg
    for frag in fragments:
        assert frag in msg, msg
    assert isinstance(ei.value, MrcError)
    return ei.value


def test_missing_file(tmp_path: Path) -> None:
    _expect_error(tmp_path / "nope.pcap", "cannot open")


def test_empty_and_short_files(tmp_path: Path) -> None:
    p = tmp_path / "e.pcap"
    p.write_bytes(b"")
    _expect_error(p, "offset 0", "not a pcap")
    p.write_bytes(struct.pack("<I", MAGIC_USEC) + b"\x02\x00")
    _expect_error(p, "offset 6", "truncated global header")


def test_bad_magic_and_pcapng(tmp_path: Path) -> None:
    p = tmp_path / "m.pcap"
    p.write_bytes(b"GIF89a" + b"\x00" * 40)
    _expect_error(p, "offset 0", "not a pcap", "474946")
    p.write_bytes(struct.pack("<I", 0x0A0D0D0A) + b"\x00" * 40)
    _expect_error(p, "offset 0", "pcapng file, not a classic pcap", "read_capture")


def test_wrong_link_type_and_version(tmp_path: Path) -> None:
    p = tmp_path / "l.pcap"
    _handmade(p, "<", MAGIC_USEC, [], linktype=101)  # LINKTYPE_RAW
    _expect_error(p, "offset 20", "link type 101")
    raw = bytearray(struct.pack("<IHHiIII", MAGIC_USEC, 3, 0, 0, 0, 65535, 1))
    p.write_bytes(raw)
    _expect_error(p, "offset 4", "version 3.0")


def test_truncated_record_header_and_data_name_offsets(tmp_path: Path) -> None:
    p = tmp_path / "t.pcap"
    write_pcap(p, [(1.0, b"a" * 100), (2.0, b"b" * 50)])
    full = p.read_bytes()
    second = GLOBAL_HDR_LEN + RECORD_HDR_LEN + 100
    # Cut inside the second record's header: the first record is still delivered, then the error.
    p.write_bytes(full[: second + 5])
    records: list[bytes] = []
    with pytest.raises(PcapError) as ei:
        for _, d in read_pcap(p):
            records.append(d)
    assert records == [b"a" * 100]
    assert f"offset {second}" in str(ei.value) and "record 1" in str(ei.value)
    assert "truncated record header (5 of 16 bytes)" in str(ei.value)
    # Cut inside the second record's data.
    p.write_bytes(full[: second + RECORD_HDR_LEN + 10])
    _expect_error(p, f"offset {second + RECORD_HDR_LEN}", "truncated data (10 of 50 bytes)")


def test_absurd_record_length(tmp_path: Path) -> None:
    p = tmp_path / "big.pcap"
    _handmade(p, "<", MAGIC_USEC, [])
    with p.open("ab") as f:
        f.write(struct.pack("<IIII", 0, 0, 0xFFFFFFF0, 0xFFFFFFF0) + b"x" * 10)
    _expect_error(p, f"offset {GLOBAL_HDR_LEN}", "exceeds the limit")


def test_every_truncation_is_clean_end_or_pcap_error(tmp_path: Path) -> None:
    """No cut of a valid file raises anything but PcapError (never struct.error), and a cut on a
    record boundary is a clean end."""
    src = tmp_path / "src.pcap"
    write_pcap(src, [(1.5, b"x" * 30), (2.5, b"y" * 7)])
    full = src.read_bytes()
    boundaries = {GLOBAL_HDR_LEN, GLOBAL_HDR_LEN + RECORD_HDR_LEN + 30, len(full)}
    cut = tmp_path / "cut.pcap"
    for n in range(len(full) + 1):
        cut.write_bytes(full[:n])
        if n in boundaries:
            assert len(list(read_pcap(cut))) == sorted(boundaries).index(n)
        else:
            with pytest.raises(PcapError):
                list(read_pcap(cut))


def test_write_rejects_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="negative"):
        write_pcap(tmp_path / "n.pcap", [(-1.0, b"a")])
    with pytest.raises(ValueError, match="snaplen"):
        write_pcap(tmp_path / "s.pcap", [(0.0, b"a" * 300_000)])
    with pytest.raises(PcapError, match="cannot write"):
        write_pcap(tmp_path / "no" / "such" / "dir.pcap", [(0.0, b"a")])
