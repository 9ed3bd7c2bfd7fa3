"""Representative MRC frames exactly as they cross the fabric, for captures, dissector tests and
operators who want to see the format in Wireshark (`mrcctl wire sample`).

Every frame is Ethernet / outer IPv6 / inner IPv6 / UDP / MRC (docs/design.md §3):

* outer IPv6: src = the sender's plane-port address, dst = a micro-SID container in the F3216 format
  (32-bit block fcbb:bbbb, then 16-bit node IDs: source leaf, spine, destination leaf, destination
  host), flow label = EV index, ECN = ECT(0);
* inner IPv6: the two hosts' MRC addresses;
* UDP: sport = 0xC000 | EV index (what the host egress program writes), dport 4791, checksum 0;
* MRC: BTH ... ICRC, built by `mrc.wire.packet`, the ICRC computed with the final source port.

One round is eight frames, in the order they would be seen (see `ROUND`): host A sends a three-packet
message to host B -- a WRITE, a WRITE that a switch trimmed, then a WRITE-with-immediate that ends it --;
B answers the trimmed packet with a NACK (code TRIMMED) and the last one with a SACK whose nonzero
bitmap reports the hole; then A's PROBE, B's PROBE_REPLY and A's PORT_STATUS. Rounds vary PSNs (the
first straddles the 2^24 wrap), EVs, spines and payload sizes (the first has a full 4096-byte payload
and an odd size that needs BTH PadCnt); everything comes from `random.Random(seed)`, so a seed always
gives the same bytes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Final

from .consts import (
    DEFAULT_PAYLOAD,
    EV_INDEX_MAX,
    ICRC_LEN,
    PSN_MASK,
    PSN_MOD,
    MxhFlag,
    NackCode,
    PortState,
    ProbeReplyFlag,
)
from .icrc import IcrcContext, ev_sport
from .ip import addr16, encap, ether, ipv6_udp
from .packet import (
    WRITE_IMM_HDR_LEN,
    build_nack,
    build_port_status,
    build_probe,
    build_probe_reply,
    build_sack,
    build_write,
    trim_in_place,
)

#: Kinds of frame in one round, in order. A trimmed WRITE is its own kind (same opcode as WRITE).
ROUND: Final[tuple[str, ...]] = (
    "WRITE",
    "WRITE_TRIMMED",
    "NACK",
    "WRITE_IMM",
    "SACK",
    "PROBE",
    "PROBE_REPLY",
    "PORT_STATUS",
)

#: F3216 micro-SID locator block (32 bits) shared by every node ID in a container.
USID_BLOCK: Final = "fcbb:bbbb"


@dataclass(frozen=True, slots=True)
class Host:
    """One end of the sample conversation: its MRC address, plane-port address, MAC and uSID node IDs."""

    mrc_addr: bytes
    port_addr: bytes
    mac: str
    leaf: int
    node: int


HOST_A: Final = Host(addr16("fd00:0:0:1::1"), addr16("2001:db8:0:1::1"), "02:00:00:00:01:01", 0x100, 0x1)
HOST_B: Final = Host(addr16("fd00:0:0:2::1"), addr16("2001:db8:0:2::1"), "02:00:00:00:02:01", 0x300, 0x1)
#: Spine node IDs of the sample plane; the EV chooses the spine.
SPINES: Final = (0x200, 0x201, 0x202, 0x203)
#: MAC of the leaf the hosts send to (the next hop of every sample frame).
LEAF_MAC: Final = "02:00:00:00:ff:01"

# Largest MRC packet we build: WRITE-with-immediate headers + the largest sample payload + pad + ICRC.
_BUF_LEN: Final = WRITE_IMM_HDR_LEN + DEFAULT_PAYLOAD + 3 + ICRC_LEN


def container(src: Host, spine: int, dst: Host) -> bytes:
    """The micro-SID container of the path src leaf -> spine -> dst leaf -> dst host, e.g.
    fcbb:bbbb:100:200:300:1:: (F3216: 32-bit block, 16-bit node IDs, zero-filled)."""
    return addr16(f"{USID_BLOCK}:{src.leaf:x}:{spine:x}:{dst.leaf:x}:{dst.node:x}::")


def envelope(mrc: bytes | bytearray | memoryview, src: Host, dst: Host, ev_index: int) -> bytes:
    """Wrap an MRC packet (the UDP payload) as on the fabric; all lengths come from `len(mrc)`."""
    inner = ipv6_udp(src.mrc_addr, dst.mrc_addr, ev_sport(ev_index), mrc)
    outer = encap(inner, src.port_addr, container(src, SPINES[ev_index % len(SPINES)], dst), ev_index)
    return ether(LEAF_MAC, src.mac, outer)


def _round(rng: random.Random, r: int, psn: int, out: list[bytes]) -> int:
    """Append the eight frames of round `r`, whose data PSNs start at `psn`; returns the next PSN."""
    a2b = IcrcContext(HOST_A.mrc_addr, HOST_B.mrc_addr)
    b2a = IcrcContext(HOST_B.mrc_addr, HOST_A.mrc_addr)
    buf = bytearray(_BUF_LEN)
    qpn_b, qpn_a = 0x000112 + r, 0x000221 + r  # QPN on B (the responder) and on A (the requester)
    rkey = 0x1A2B0000 | rng.randrange(1 << 16)
    base_va = 0x7F00_0000_0000 + rng.randrange(1 << 20) * 4096
    ts = 1_700_000_000_000_000_000 + r * 1_000_000 + rng.randrange(1000)
    if r == 0:  # full-MTU payloads and an odd size that needs PadCnt 3
        sizes = [DEFAULT_PAYLOAD, DEFAULT_PAYLOAD, 1021]
    else:
        sizes = [rng.choice((DEFAULT_PAYLOAD, rng.randrange(1, DEFAULT_PAYLOAD + 1))) for _ in range(3)]
    msg_len = sum(sizes)
    offsets = [0, sizes[0], sizes[0] + sizes[1]]
    evs = [rng.randrange(EV_INDEX_MAX + 1) for _ in range(3)]
    psns = [(psn + i) & PSN_MASK for i in range(3)]

    def data(i: int, imm: int | None, flags: int) -> bytearray:
        n = build_write(
            buf, a2b, dqpn=qpn_b, psn=psns[i], ev_index=evs[i], va=base_va + offsets[i], rkey=rkey,
            payload=rng.randbytes(sizes[i]), msn=r, msg_len=msg_len, msg_offset=offsets[i],
            timestamp_ns=ts + 100 * i, flags=flags, ackreq=imm is not None, imm=imm,
        )
        return bytearray(buf[:n])

    # One three-packet message sprayed on three EVs: WRITE (FIRST), a WRITE that a switch trimmed
    # (headers up to MXH survive; B answers with NACK TRIMMED), and the WRITE-with-immediate that
    # ends the message (LAST; B answers with a SACK that reports the hole at the trimmed PSN).
    out.append(envelope(data(0, None, MxhFlag.FIRST), HOST_A, HOST_B, evs[0]))
    trimmed = data(1, None, 0)
    out.append(envelope(trimmed[: trim_in_place(trimmed, len(trimmed))], HOST_A, HOST_B, evs[1]))
    ack_ev = rng.randrange(EV_INDEX_MAX + 1)
    n = build_nack(
        buf, b2a, dqpn=qpn_a, psn=psns[1], ev_index=ack_ev, code=NackCode.TRIMMED, echo_ev_index=evs[1],
        cum_psn=psns[1], echo_timestamp_ns=ts + 100, timestamp_ns=ts + 5000,
    )
    out.append(envelope(buf[:n], HOST_B, HOST_A, ack_ev))
    out.append(envelope(data(2, 0xC0DE0000 | r, MxhFlag.LAST | MxhFlag.ACK_REQ_NOW), HOST_A, HOST_B, evs[2]))
    # cum_psn = the trimmed PSN (lowest missing); bit 0 (cum_psn + 1) = the WRITE_IMM's PSN. Odd
    # rounds send two bitmap words, so variable-length SACKs appear in the capture too.
    words = 1 + r % 2
    bitmap = 1
    n = build_sack(
        buf, b2a, dqpn=qpn_a, psn=psns[2], ev_index=ack_ev, cum_psn=psns[1], echo_ev_index=evs[2],
        echo_timestamp_ns=ts + 200, bitmap=bitmap, words=words, echo_flags=0x01 if r % 3 == 1 else 0,
        service_time_ns=1500 + r, timestamp_ns=ts + 6000,
    )
    out.append(envelope(buf[:n], HOST_B, HOST_A, ack_ev))

    probe_ev = rng.randrange(EV_INDEX_MAX + 1)
    request_id = rng.randrange(1 << 16)
    n = build_probe(
        buf, a2b, dqpn=qpn_b, ev_index=probe_ev, request_id=request_id, reply_qpn=qpn_a,
        timestamp_ns=ts + 7000,
    )
    out.append(envelope(buf[:n], HOST_A, HOST_B, probe_ev))
    n = build_probe_reply(
        buf, b2a, dqpn=qpn_a, ev_index=ack_ev, request_id=request_id, echo_ev_index=probe_ev,
        echo_timestamp_ns=ts + 7000, service_time_ns=800 + r, flags=ProbeReplyFlag.SERVICE_TIME_VALID,
        timestamp_ns=ts + 8000,
    )
    out.append(envelope(buf[:n], HOST_B, HOST_A, ack_ev))
    n = build_port_status(
        buf, a2b, dqpn=qpn_b, ev_index=probe_ev, request_id=(request_id + 1) & 0xFFFF, port=r % 4,
        state=PortState.DOWN if r % 2 else PortState.UP, epoch=1 + r, timestamp_ns=ts + 9000,
    )
    out.append(envelope(buf[:n], HOST_A, HOST_B, probe_ev))
    return (psn + 3) & PSN_MASK


def sample_frames(count: int = 1, seed: int = 0) -> list[bytes]:
    """`count` rounds of the eight frame kinds of `ROUND` (so 8 * count frames), deterministic in
    `seed`. The first round's data PSNs are 2^24 - 2, 2^24 - 1 and 0, across the wrap."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    rng = random.Random(seed)
    out: list[bytes] = []
    psn = PSN_MOD - 2
    for r in range(count):
        psn = _round(rng, r, psn, out)
        psn = (psn + rng.randrange(1, 1000)) & PSN_MASK
    return out
