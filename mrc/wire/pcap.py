"""Classic pcap files (the libpcap format tcpdump writes; `tshark -F pcap`, `editcap -F pcap`).

Why our own and not scapy's: `mrcctl wire decode` must survive any file an operator hands it and say
exactly where it is broken (file and byte offset) instead of a struct.error or a silently short read,
and the sample writer must not pull scapy's import time into the CLI. The format is small enough to
read with two Structs::

    global header (24 bytes)    magic        0xa1b2c3d4 (microsecond timestamps) or 0xa1b23c4d
                                             (nanosecond); read in the writer's byte order, either
                                version      2.4
                                thiszone     GMT offset, 0 in practice (ignored)
                                sigfigs      0 (ignored)
                                snaplen      largest record the capture kept
                                network      link type (LINKTYPE_ETHERNET 1 for what we write)
    record header (16 bytes)    ts_sec, ts_frac (us or ns), incl_len (bytes stored), orig_len (on wire)
    record data                 incl_len bytes

`write_pcap` writes Ethernet, microsecond or nanosecond, little-endian. `read_pcap_records` reads any
link type and keeps each record's on-the-wire length (`orig_len`), which a snaplen-cut capture needs;
pcapng (the default of dumpcap, tshark and editcap) is in `pcapng.py`, and `capture.read_capture`
reads either, choosing by the magic number.
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Iterable, Iterator
from os import PathLike
from typing import BinaryIO, Final, NamedTuple

from mrc.errors import MrcError

LINKTYPE_ETHERNET: Final = 1
MAGIC_USEC: Final = 0xA1B2C3D4
MAGIC_NSEC: Final = 0xA1B23C4D
PCAPNG_MAGIC: Final = 0x0A0D0D0A
VERSION: Final = (2, 4)
#: snaplen written into our files: the libpcap default, larger than any frame MRC sends (9000 MTU).
SNAPLEN: Final = 262144
#: Records larger than this are corrupt whatever the header's snaplen says (guards huge reads).
MAX_RECORD: Final = 1 << 24

GLOBAL_HDR_LEN: Final = 24
RECORD_HDR_LEN: Final = 16

_GLOBAL_LE: Final = struct.Struct("<IHHiIII")
_GLOBAL_BE: Final = struct.Struct(">IHHiIII")
_RECORD_LE: Final = struct.Struct("<IIII")
_RECORD_BE: Final = struct.Struct(">IIII")

StrPath = str | PathLike[str]


class PcapError(MrcError):
    """A pcap file that cannot be read: the message names the file and the byte offset."""


def write_pcap(
    path: StrPath,
    frames: Iterable[tuple[float, bytes | bytearray | memoryview]],
    *,
    nanoseconds: bool = False,
) -> int:
    """Write Ethernet `frames` as (timestamp in seconds since the epoch, frame bytes) to a classic pcap
    in little-endian order; returns the number of records. `nanoseconds` selects the 0xa1b23c4d
    magic, for captures whose timestamps need better than microseconds. A file that cannot be
    written raises `PcapError`; a bad frame (negative time, longer than the snaplen) ValueError."""
    scale = 1_000_000_000 if nanoseconds else 1_000_000
    count = 0
    try:
        with open(path, "wb") as f:
            f.write(
                _GLOBAL_LE.pack(MAGIC_NSEC if nanoseconds else MAGIC_USEC, *VERSION, 0, 0, SNAPLEN,
                                LINKTYPE_ETHERNET)
            )
            for ts, frame in frames:
                if ts < 0:
                    raise ValueError(f"record {count}: negative timestamp {ts}")
                n = len(frame)
                if n > SNAPLEN:
                    raise ValueError(f"record {count}: frame of {n} bytes exceeds snaplen {SNAPLEN}")
                # Integer arithmetic on the rounded total, so 0.9999999 never gives frac = 10**6.
                sec, frac = divmod(round(ts * scale), scale)
                f.write(_RECORD_LE.pack(sec, frac, n, n))
                f.write(frame)
                count += 1
    except OSError as e:
        raise PcapError(f"{path}: cannot write: {e.strerror or e}") from e
    return count


class Record(NamedTuple):
    """One captured packet, from a classic pcap or a pcapng file.

    `data` holds the `len(data)` bytes the capture kept; `orig_len` is the packet's length on the wire
    (larger when the capture's snaplen cut it, `editcap -s`, `tcpdump -s`): decoders report lengths
    from it and must not mistake a cut packet for a malformed one. `time` is seconds since the epoch,
    None where the format has none (pcapng Simple Packet Blocks). `interface` is the pcapng interface
    index (0 in a classic pcap) and `linktype` that interface's LINKTYPE_* value."""

    time: float | None
    data: bytes
    orig_len: int
    linktype: int
    interface: int = 0

    @property
    def truncated(self) -> bool:
        """True when the capture kept fewer bytes than were on the wire."""
        return self.orig_len > len(self.data)


def read_pcap_records(
    path: StrPath, f: BinaryIO | None = None, *, linktypes: Collection[int] | None = None
) -> Iterator[Record]:
    """Yield a `Record` for every record of a classic pcap, of any link type.

    Microsecond and nanosecond files in either byte order are read. Anything else (missing file,
    pcapng, a header or record cut short, an absurd record length) raises `PcapError` naming the
    file and the byte offset where the problem is; records already yielded stay valid, so a caller
    may count what came before a truncated tail. `f`, when given, is an open file positioned at the
    start (the caller keeps ownership); otherwise `path` is opened and closed here. `linktypes`, when
    given, are the link types the caller accepts: another is a `PcapError` at the global header."""
    name = str(path)
    own = f is None
    if f is None:
        try:
            f = open(path, "rb")  # noqa: SIM115 -- closed in the finally below; a generator owns it
        except OSError as e:
            raise PcapError(f"{name}: cannot open: {e.strerror or e}") from e
    try:
        head = f.read(GLOBAL_HDR_LEN)
        if len(head) < 4:
            raise PcapError(f"{name}: offset 0: not a pcap file ({len(head)} bytes, no magic number)")
        (magic_le,) = struct.unpack_from("<I", head)
        (magic_be,) = struct.unpack_from(">I", head)
        if magic_le in (MAGIC_USEC, MAGIC_NSEC):
            ghdr, rhdr, magic = _GLOBAL_LE, _RECORD_LE, magic_le
        elif magic_be in (MAGIC_USEC, MAGIC_NSEC):
            ghdr, rhdr, magic = _GLOBAL_BE, _RECORD_BE, magic_be
        elif magic_le == PCAPNG_MAGIC:
            raise PcapError(
                f"{name}: offset 0: pcapng file, not a classic pcap "
                "(mrc.wire.capture.read_capture reads both)"
            )
        else:
            raise PcapError(f"{name}: offset 0: not a pcap file (magic {head[:4].hex()})")
        if len(head) < GLOBAL_HDR_LEN:
            raise PcapError(
                f"{name}: offset {len(head)}: truncated global header "
                f"({len(head)} of {GLOBAL_HDR_LEN} bytes)"
            )
        _, major, minor, _, _, snaplen, network = ghdr.unpack(head)
        if major != VERSION[0]:
            raise PcapError(f"{name}: offset 4: unsupported pcap version {major}.{minor}")
        linktype = network & 0xFFFF  # upper bits may carry FCS information
        if linktypes is not None and linktype not in linktypes:
            accepted = ", ".join(str(t) for t in sorted(linktypes))
            raise PcapError(f"{name}: offset 20: link type {linktype}, only {accepted} is supported")
        scale = 1e-9 if magic == MAGIC_NSEC else 1e-6
        limit = min(max(snaplen, SNAPLEN), MAX_RECORD)
        offset = GLOBAL_HDR_LEN
        index = 0
        while True:
            rec = f.read(RECORD_HDR_LEN)
            if not rec:
                return
            if len(rec) < RECORD_HDR_LEN:
                raise PcapError(
                    f"{name}: offset {offset}: record {index}: truncated record header "
                    f"({len(rec)} of {RECORD_HDR_LEN} bytes)"
                )
            sec, frac, incl, orig = rhdr.unpack(rec)
            if incl > limit:
                raise PcapError(
                    f"{name}: offset {offset}: record {index}: length {incl} exceeds the limit {limit} "
                    "(corrupt record header)"
                )
            data = f.read(incl)
            if len(data) < incl:
                raise PcapError(
                    f"{name}: offset {offset + RECORD_HDR_LEN}: record {index}: truncated data "
                    f"({len(data)} of {incl} bytes)"
                )
            # orig_len below incl_len is a writer's bug, not a packet longer than it was: keep incl.
            yield Record(sec + frac * scale, data, max(orig, incl), linktype)
            offset += RECORD_HDR_LEN + incl
            index += 1
    except OSError as e:
        raise PcapError(f"{name}: read error: {e.strerror or e}") from e
    finally:
        if own:
            f.close()


def read_pcap(path: StrPath) -> Iterator[tuple[float, bytes]]:
    """Yield (timestamp in seconds, frame bytes) for every record of a classic Ethernet pcap (the
    files `write_pcap` writes). As `read_pcap_records`, and a link type other than Ethernet is a
    `PcapError` (offset 20). Reading any capture, pcapng included: `mrc.wire.capture.read_capture`."""
    for rec in read_pcap_records(path, linktypes=(LINKTYPE_ETHERNET,)):
        yield rec.time or 0.0, rec.data
