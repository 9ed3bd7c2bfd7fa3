"""RoCEv2 invariant CRC (ICRC) over the inner IPv6 packet.

The ICRC is the IEEE CRC-32 (zlib.crc32 values; mrc.wire.crc picks the implementation) of::

    8 bytes of 0xFF                      stands in for the InfiniBand LRH, which RoCEv2 does not carry
    IPv6 header                          Traffic Class, Flow Label and Hop Limit masked to all ones
    UDP header                           checksum masked to 0xFFFF
    BTH                                  byte 4 (FECN, BECN, Resv6) masked to 0xFF
    everything after BTH up to the ICRC  (RETH, ImmDt, MXH, payload, pad; or a control body)

and is carried in the last 4 bytes of the UDP payload, least significant byte first (the byte order
of the kernel's rxe driver and of scapy.contrib.roce). The masked fields are the ones a switch may
rewrite (ECN bits, flow label, TTL); everything else is covered end to end.

MRC's host egress program rewrites the UDP source port to 0xC000 | EV index; the ports are not masked,
so the sender computes the ICRC with that final source port (see `ev_sport`).
"""

from __future__ import annotations

import struct
from typing import Final

from .consts import BTH_LEN, EV_INDEX_MAX, EV_SPORT_BASE, ICRC_LEN, ROCEV2_UDP_PORT, UDP_LEN
from .crc import crc32

#: 8 x 0xFF pseudo-LRH, then IPv6 (ver/tc/flow masked, payload length, next header 17, hop limit masked,
#: src, dst), then UDP (sport, dport, length, checksum masked).
_PSEUDO: Final = struct.Struct("!8sIHBB16s16sHHHH")
_PSEUDO_LEN: Final = _PSEUDO.size  # 8 + 40 + 8 = 56
_LRH: Final = b"\xff" * 8
_VTF_MASKED: Final = 0x6FFFFFFF
_ICRC: Final = struct.Struct("<I")
#: BTH byte 4 (FECN, BECN, Resv6) as the ICRC sees it.
_BTH4_MASKED: Final = b"\xff"
#: Bound on cached pseudo-header CRCs per context: (length, source port) pairs, i.e. packet sizes x EVs
#: in use. Past it the cache starts over, which costs one 56-byte CRC per pair again.
_PREFIX_CACHE_MAX: Final = 8192
#: BTH byte 4 zero instead of masked, in the start value: for any bytes b0-b3 and start value v,
#: crc32(b0-b3 + b"\x00", v ^ _BTH4_ZERO) == crc32(b0-b3 + b"\xff", v). (The CRC is affine in its start
#: value and its data, so the two differ by one constant: this one, the CRC run back over 5 bytes.)
_BTH4_ZERO: Final = 0x0F6A70D9
#: crc32(m + the 4 bytes of crc32(m, v) least significant first, v), for every message m and start value
#: v: the residue of this CRC. So a packet is checked by one crc32 over it, its ICRC included.
CRC32_RESIDUE: Final = 0x2144DF1C


def ev_sport(ev_index: int) -> int:
    """The UDP source port a packet sprayed on EV index `ev_index` carries on the fabric."""
    return EV_SPORT_BASE | (ev_index & EV_INDEX_MAX)


class IcrcContext:
    """The parts of the IPv6/UDP envelope the ICRC covers that the MRC payload does not carry:
    source and destination addresses (16 bytes each) and the UDP ports.

    One context per peer. Everything before BTH (pseudo-LRH, masked IPv6, UDP) depends only on the
    packet length and the source port, so its CRC is cached per (length, sport) -- a CRC over 56 bytes
    costs a good part of a 4 KiB one, and a peer sees few lengths times the EVs it sprays on. What
    remains per packet is three crc32 calls in `compute` (BTH bytes 0-3, the masked byte 4, bytes 5 up
    to the ICRC), one in `compute_w0`, and for data packets as endpoints send them one over the whole
    packet from `start` (the data path of wire.packet), with no copy of the packet."""

    __slots__ = ("_dport", "_dst", "_head", "_prefix", "_scratch", "_src", "_start")

    def __init__(self, src: bytes, dst: bytes, dport: int = ROCEV2_UDP_PORT) -> None:
        if len(src) != 16 or len(dst) != 16:
            raise ValueError("IcrcContext needs 16-byte IPv6 addresses")
        self._src = bytes(src)
        self._dst = bytes(dst)
        self._dport = dport
        self._scratch = bytearray(_PSEUDO_LEN)
        self._prefix: dict[tuple[int, int], int] = {}
        self._head: dict[int, int] = {}  # (end, sport, BTH word 0) packed in one int -> CRC through BTH[4]
        #: sport << 32 | end -> the start value of `start`. One int, not an (end, sport) tuple: the
        #: compiled data path (mrc/transport/_fastc.c) reads and fills this dict per packet, and an int key
        #: is one object to make, hash and compare.
        self._start: dict[int, int] = {}

    # The envelope fields are properties so that changing one drops the CRCs cached for the old value.
    @property
    def src(self) -> bytes:
        return self._src

    @src.setter
    def src(self, value: bytes) -> None:
        self._src = bytes(value)
        self._prefix.clear()
        self._head.clear()
        self._start.clear()

    @property
    def dst(self) -> bytes:
        return self._dst

    @dst.setter
    def dst(self, value: bytes) -> None:
        self._dst = bytes(value)
        self._prefix.clear()
        self._head.clear()
        self._start.clear()

    @property
    def dport(self) -> int:
        return self._dport

    @dport.setter
    def dport(self, value: int) -> None:
        self._dport = value
        self._prefix.clear()
        self._head.clear()
        self._start.clear()

    def _prefix_crc(self, end: int, sport: int) -> int:
        """CRC of pseudo-LRH + masked IPv6 + UDP for a datagram of UDP length end + 8 + 4 (slow path)."""
        udp_len = UDP_LEN + end + ICRC_LEN
        s = self._scratch
        _PSEUDO.pack_into(
            s, 0, _LRH, _VTF_MASKED, udp_len, 17, 0xFF, self._src, self._dst, sport, self._dport, udp_len,
            0xFFFF,
        )
        crc = crc32(s)
        if len(self._prefix) >= _PREFIX_CACHE_MAX:
            self._prefix.clear()
        self._prefix[(end, sport)] = crc
        return crc

    def compute(self, mrc: bytes | bytearray | memoryview, end: int, sport: int) -> int:
        """ICRC of `mrc[0:end]` (BTH up to, not including, the ICRC) as sent with UDP source `sport`.
        The UDP length the ICRC sees is that of the full datagram: end + ICRC."""
        if end < BTH_LEN:
            raise ValueError(f"ICRC needs at least a BTH: end {end} < {BTH_LEN}")
        crc = self._prefix.get((end, sport))
        if crc is None:
            crc = self._prefix_crc(end, sport)
        mv = mrc if isinstance(mrc, memoryview) else memoryview(mrc)
        crc = crc32(mv[0:4], crc)
        crc = crc32(_BTH4_MASKED, crc)
        return crc32(mv[5:end], crc)

    def compute_w0(self, mv: memoryview, end: int, sport: int, w0: int) -> int:
        """`compute` for the packet paths that already hold the first BTH word `w0` (bytes 0-3 as a
        big-endian integer) and a byte memoryview `mv` with end >= BTH_LEN: the CRC up to and including
        the masked byte 4 depends only on (end, sport, w0) and is cached, so what remains per packet is
        one crc32 over bytes 5 up to the ICRC. Same value as `compute`."""
        key = (((w0 << 16) | sport) << 32) | end
        crc = self._head.get(key)
        if crc is None:
            crc = self._prefix.get((end, sport))
            if crc is None:
                crc = self._prefix_crc(end, sport)
            crc = crc32(_BTH4_MASKED, crc32(w0.to_bytes(4, "big"), crc))
            if len(self._head) >= _PREFIX_CACHE_MAX:
                self._head.clear()
            self._head[key] = crc
        return crc32(mv[5:end], crc)

    def start(self, end: int, sport: int) -> int:
        """The crc32 start value v for which crc32(pkt[0:end], v) is the ICRC of a packet `pkt` (end >=
        BTH_LEN) sent with UDP source `sport` whose BTH byte 4 is zero, as an endpoint sends it (no FECN,
        BECN): the envelope's CRC with the masking of byte 4 folded in, cached per (end, sport). So the
        sender's ICRC is one crc32 over the packet from byte 0, without a slice at byte 5, and such a
        packet is checked by one call over all of it: crc32(pkt, v) == CRC32_RESIDUE iff its ICRC is
        right."""
        key = (sport << 32) | end
        v = self._start.get(key)
        if v is None:
            crc = self._prefix.get((end, sport))
            v = (self._prefix_crc(end, sport) if crc is None else crc) ^ _BTH4_ZERO
            if len(self._start) >= _PREFIX_CACHE_MAX:
                self._start.clear()
            self._start[key] = v
        return v

    def write(self, buf: bytearray | memoryview, end: int, sport: int) -> int:
        """Compute the ICRC of buf[0:end] and store it at buf[end:end+4]; returns end + 4."""
        _ICRC.pack_into(buf, end, self.compute(buf, end, sport))
        return end + ICRC_LEN

    def check(self, mrc: bytes | bytearray | memoryview, sport: int) -> bool:
        """True when the last 4 bytes of `mrc` are the ICRC of the rest."""
        end = len(mrc) - ICRC_LEN
        if end < BTH_LEN:
            return False
        return bool(_ICRC.unpack_from(mrc, end)[0] == self.compute(mrc, end, sport))


def read_icrc(mrc: bytes | bytearray | memoryview) -> int:
    """The last 4 bytes read in network order: the number Wireshark and scapy display as the ICRC
    (the byte swap of the CRC value, because the CRC is stored least significant byte first)."""
    return int(struct.unpack_from("!I", mrc, len(mrc) - ICRC_LEN)[0])


def icrc_of_ipv6(pkt: bytes | bytearray | memoryview) -> int:
    """ICRC of a whole inner IPv6/UDP/BTH... packet (ICRC trailer present, not included). Uses the
    packet's own header bytes, masked; for checks of captured packets."""
    mv = memoryview(pkt)
    end = len(mv) - ICRC_LEN
    hdr = bytearray(_LRH)
    hdr += mv[0 : 40 + 8 + BTH_LEN]
    # IPv6: version stays, traffic class + flow label -> all ones; hop limit -> 0xFF
    hdr[8] = (hdr[8] & 0xF0) | 0x0F
    hdr[9:12] = b"\xff\xff\xff"
    hdr[8 + 7] = 0xFF
    # UDP checksum
    hdr[8 + 40 + 6 : 8 + 40 + 8] = b"\xff\xff"
    # BTH byte 4
    hdr[8 + 48 + 4] = 0xFF
    crc = crc32(hdr)
    return crc32(mv[40 + 8 + BTH_LEN : end], crc)
