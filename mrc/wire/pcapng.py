"""pcapng files (the default format of dumpcap, tshark and editcap), read block by block.

Why our own reader and not scapy's `PcapNgReader` or dpkt: `mrcctl wire decode` must say exactly where
a file is broken (file, byte offset, block number and type, the problem) instead of raising
struct.error or reading a silently short packet, must bound every length it reads before allocating
it, must keep each packet's on-the-wire length (snaplen-cut captures, `editcap -s`), and must not pull
scapy's import time into the CLI. The part of the format a packet reader needs is small::

    every block         type (4), total length (4, a multiple of 4, >= 12), body, total length again
    Section Header      type 0x0a0d0d0a; byte-order magic 0x1a2b3c4d written in the writer's order
    (SHB)               (the only way to know how to read the rest of the section), version 1.x,
                        section length (8, ignored), options. A file may hold several sections, each
                        with its own byte order and interfaces.
    Interface           link type (2), reserved (2), snaplen (4), options; the n-th IDB of a section is
    Description (IDB)   interface n. Options read: if_tsresol (9: 10^-v s, or 2^-v s when the high
                        bit is set; default microseconds) and if_tsoffset (14: seconds added).
    Enhanced Packet     interface (4), timestamp high and low (4 + 4, in the interface's units),
    (EPB, type 6)       captured length (4), original length (4), data padded to 4, options
    Simple Packet       original length (4), data: captured length = min(original length, interface
    (SPB, type 3)       0's snaplen, what the block holds); no interface field, no timestamp
    Packet (type 2)     obsolete EPB: interface (2), drops (2), then as EPB
    anything else       name resolution, statistics, decryption secrets, custom...: skipped

Option lists are walked inside their block only; an option that overruns its block is an error.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import BinaryIO, Final

from .pcap import MAX_RECORD, PcapError, Record, StrPath

SHB_TYPE: Final = 0x0A0D0D0A
IDB_TYPE: Final = 0x00000001
PB_TYPE: Final = 0x00000002  # obsolete Packet Block
SPB_TYPE: Final = 0x00000003
EPB_TYPE: Final = 0x00000006
BYTE_ORDER_MAGIC: Final = 0x1A2B3C4D
#: Option codes read from an IDB.
OPT_ENDOFOPT: Final = 0
IF_TSRESOL: Final = 9
IF_TSOFFSET: Final = 14

#: Blocks larger than this are corrupt (a packet block holds at most MAX_RECORD bytes of packet plus
#: its options); the limit is checked before a block is read, so a bad length never allocates.
MAX_BLOCK: Final = MAX_RECORD + (1 << 16)
#: Interfaces one section may describe (real captures have a handful); bounds the interface table.
MAX_INTERFACES: Final = 1 << 16
#: if_tsresol exponents above these are no clock (10^-19 s, 2^-64 s): corrupt options.
MAX_TSRESOL_DEC: Final = 18
MAX_TSRESOL_BIN: Final = 63

_BLOCK_NAMES: Final = {
    SHB_TYPE: "section header", IDB_TYPE: "interface description", PB_TYPE: "packet",
    SPB_TYPE: "simple packet", EPB_TYPE: "enhanced packet",
}


class _Interface:
    """What the packet blocks of one interface need from its IDB."""

    __slots__ = ("divisor", "linktype", "offset", "snaplen")

    def __init__(self, linktype: int, snaplen: int, divisor: int, offset: int) -> None:
        self.linktype = linktype
        self.snaplen = snaplen
        self.divisor = divisor  # timestamp units per second
        self.offset = offset  # if_tsoffset, seconds


def _block_name(btype: int) -> str:
    return _BLOCK_NAMES.get(btype, f"type {btype:#010x}")


def read_pcapng(path: StrPath, f: BinaryIO | None = None) -> Iterator[Record]:
    """Yield a `Record` for every packet (EPB, SPB, obsolete PB) of a pcapng file, in file order.

    Both byte orders, several sections and several interfaces (each with its link type, snaplen and
    timestamp resolution) are read. A file that is not pcapng, a block cut short, a length that is not
    a multiple of 4, beyond the limits or different at the two ends of a block, a packet that names an
    interface no IDB described, an option that overruns its block: `PcapError` naming the file, the
    byte offset and number of the block and the problem. Packets already yielded stay valid. `f`, when
    given, is an open file at the start (the caller keeps ownership)."""
    name = str(path)
    own = f is None
    if f is None:
        try:
            f = open(path, "rb")  # noqa: SIM115 -- closed in the finally below; a generator owns it
        except OSError as e:
            raise PcapError(f"{name}: cannot open: {e.strerror or e}") from e
    try:
        yield from _blocks(name, f)
    except OSError as e:
        raise PcapError(f"{name}: read error: {e.strerror or e}") from e
    finally:
        if own:
            f.close()


def _blocks(name: str, f: BinaryIO) -> Iterator[Record]:
    offset = 0
    index = 0
    endian = ""  # "<" or ">" once the first SHB is read
    interfaces: list[_Interface] = []
    while True:
        where = f"{name}: offset {offset}: block {index}"
        head = f.read(8)
        if not head:
            if index == 0:
                raise PcapError(f"{name}: offset 0: empty file, not a pcapng file")
            return
        if len(head) < 8:
            raise PcapError(f"{where}: truncated block header ({len(head)} of 8 bytes)")
        (btype_le,) = struct.unpack_from("<I", head)
        if btype_le == SHB_TYPE:  # a palindrome: the same in both byte orders
            bom = f.read(4)
            if len(bom) < 4:
                raise PcapError(f"{where} (section header): truncated byte-order magic")
            if struct.unpack("<I", bom)[0] == BYTE_ORDER_MAGIC:
                endian = "<"
            elif struct.unpack(">I", bom)[0] == BYTE_ORDER_MAGIC:
                endian = ">"
            else:
                raise PcapError(f"{where} (section header): bad byte-order magic {bom.hex()}")
            interfaces = []
            prefix = bom
        elif index == 0:
            raise PcapError(f"{name}: offset 0: not a pcapng file (block type {head[:4].hex()})")
        else:
            prefix = b""
        (btype, total) = struct.unpack_from(endian + "II", head)
        what = f"{where} ({_block_name(btype)})"
        least = 28 if btype == SHB_TYPE else 12  # a section header: magic, versions, section length
        if total < least or total % 4:
            raise PcapError(f"{what}: block length {total} is not a multiple of 4 of at least {least}")
        if total > MAX_BLOCK:
            raise PcapError(f"{what}: block length {total} exceeds the limit {MAX_BLOCK}")
        want = total - 8 - len(prefix)
        rest = f.read(want)
        if len(rest) < want:
            raise PcapError(f"{what}: truncated block ({8 + len(prefix) + len(rest)} of {total} bytes)")
        body = prefix + rest[:-4]
        (trailer,) = struct.unpack_from(endian + "I", rest, len(rest) - 4)
        if trailer != total:
            raise PcapError(f"{what}: trailing block length {trailer} != leading {total}")
        if btype == SHB_TYPE:
            _section(what, body, endian)
        elif btype == IDB_TYPE:
            if len(interfaces) >= MAX_INTERFACES:
                raise PcapError(f"{what}: more than {MAX_INTERFACES} interfaces in one section")
            interfaces.append(_interface(what, body, endian))
        elif btype in (EPB_TYPE, PB_TYPE, SPB_TYPE):
            yield _packet(what, btype, body, endian, interfaces)
        offset += total
        index += 1


def _section(what: str, body: bytes, endian: str) -> None:
    if len(body) < 16:
        raise PcapError(f"{what}: section header body of {len(body)} bytes, 16 needed")
    major, minor = struct.unpack_from(endian + "HH", body, 4)
    if major != 1:
        raise PcapError(f"{what}: unsupported pcapng version {major}.{minor}")


def _options(what: str, body: bytes, start: int, endian: str) -> Iterator[tuple[int, bytes]]:
    """(code, value) of each option in body[start:], stopping at opt_endofopt or the body's end."""
    pos = start
    fmt = endian + "HH"
    while pos + 4 <= len(body):
        code, length = struct.unpack_from(fmt, body, pos)
        if code == OPT_ENDOFOPT:
            return
        end = pos + 4 + length
        if end > len(body):
            raise PcapError(f"{what}: option {code} of {length} bytes overruns the block")
        yield code, body[pos + 4 : end]
        pos = end + (-length & 3)


def _interface(what: str, body: bytes, endian: str) -> _Interface:
    if len(body) < 8:
        raise PcapError(f"{what}: interface description body of {len(body)} bytes, 8 needed")
    linktype, _, snaplen = struct.unpack_from(endian + "HHI", body)
    divisor, tsoffset = 1_000_000, 0
    for code, value in _options(what, body, 8, endian):
        if code == IF_TSRESOL:
            if len(value) != 1:
                raise PcapError(f"{what}: if_tsresol of {len(value)} bytes, 1 expected")
            v = value[0]
            if v & 0x80:
                if v & 0x7F > MAX_TSRESOL_BIN:
                    raise PcapError(f"{what}: if_tsresol 2^-{v & 0x7F} s is out of range")
                divisor = 1 << (v & 0x7F)
            else:
                if v > MAX_TSRESOL_DEC:
                    raise PcapError(f"{what}: if_tsresol 10^-{v} s is out of range")
                divisor = 10**v
        elif code == IF_TSOFFSET:
            if len(value) != 8:
                raise PcapError(f"{what}: if_tsoffset of {len(value)} bytes, 8 expected")
            (tsoffset,) = struct.unpack(endian + "q", value)
    return _Interface(linktype, snaplen, divisor, tsoffset)


def _packet(what: str, btype: int, body: bytes, endian: str, interfaces: list[_Interface]) -> Record:
    if btype == SPB_TYPE:
        if len(body) < 4:
            raise PcapError(f"{what}: simple packet body of {len(body)} bytes, 4 needed")
        if not interfaces:
            raise PcapError(f"{what}: simple packet before any interface description")
        (orig,) = struct.unpack_from(endian + "I", body)
        iface = interfaces[0]
        caplen = min(orig, len(body) - 4)
        if iface.snaplen:
            caplen = min(caplen, iface.snaplen)
        return Record(None, body[4 : 4 + caplen], max(orig, caplen), iface.linktype, 0)
    if btype == EPB_TYPE:
        if len(body) < 20:
            raise PcapError(f"{what}: enhanced packet body of {len(body)} bytes, 20 needed")
        ifno, hi, lo, caplen, orig = struct.unpack_from(endian + "IIIII", body)
        start = 20
    else:
        if len(body) < 20:
            raise PcapError(f"{what}: packet body of {len(body)} bytes, 20 needed")
        ifno, _, hi, lo, caplen, orig = struct.unpack_from(endian + "HHIIII", body)
        start = 20
    if ifno >= len(interfaces):
        raise PcapError(
            f"{what}: interface {ifno}, but the section describes {len(interfaces)} interface(s)"
        )
    if caplen > len(body) - start:
        raise PcapError(
            f"{what}: captured length {caplen} exceeds the {len(body) - start} bytes the block holds"
        )
    iface = interfaces[ifno]
    sec, frac = divmod(hi << 32 | lo, iface.divisor)  # integer split: nanoseconds survive the float
    ts = sec + iface.offset + frac / iface.divisor
    return Record(ts, body[start : start + caplen], max(orig, caplen), iface.linktype, ifno)
