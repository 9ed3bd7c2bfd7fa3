"""Numbers of the MRC wire format (docs/design.md §3). Field-by-field layouts are in the header modules
and in docs/wire.md; this module only names the constants they share."""

from __future__ import annotations

from enum import IntEnum, IntFlag
from typing import Final

ROCEV2_UDP_PORT: Final = 4791
#: UDP source ports carry 0xC000 | EV index (14 bits), written by the host egress program.
EV_SPORT_BASE: Final = 0xC000
EV_INDEX_BITS: Final = 14
EV_INDEX_MAX: Final = (1 << EV_INDEX_BITS) - 1

PSN_BITS: Final = 24
PSN_MOD: Final = 1 << PSN_BITS
PSN_MASK: Final = PSN_MOD - 1
QPN_MASK: Final = (1 << 24) - 1
DEFAULT_PKEY: Final = 0xFFFF
#: the bits of a P_Key that name the partition (bit 15 is the membership: 1 full, 0 limited)
PKEY_PARTITION: Final = 0x7FFF


def pkey_matches(key: int, own: int = DEFAULT_PKEY) -> bool:
    """Whether a packet's P_Key `key` admits it to a QP whose key is `own` (IBA 10.9.3): the same
    partition, not the invalid one (0), and not both limited members. Every MRC QP holds the default
    key (full member of partition 0x7FFF), so a packet passes when its low 15 bits are all ones."""
    part = key & PKEY_PARTITION
    return part == own & PKEY_PARTITION and part != 0 and bool((key | own) & 0x8000)


MXH_VERSION: Final = 1
#: Default path MTU payload (RoCE's largest IB MTU); the format allows up to MAX_PAYLOAD.
DEFAULT_PAYLOAD: Final = 4096
#: Largest payload one packet may carry: a 9000-byte fabric MTU less both IPv6 headers and ours.
MAX_PAYLOAD: Final = 8192
#: Smallest path MTU payload (IB's smallest MTU, 256); every payload size a QP uses is a power of two
#: in MIN_PAYLOAD..MAX_PAYLOAD, as IB's MTU enumeration (256..4096) extended by one step.
MIN_PAYLOAD: Final = 256

BTH_LEN: Final = 12
RETH_LEN: Final = 16
IMMDT_LEN: Final = 4
MXH_LEN: Final = 24
ICRC_LEN: Final = 4
IPV6_LEN: Final = 40
UDP_LEN: Final = 8

#: Body sizes of the control packets (after MXH, before ICRC).
SACK_FIXED_LEN: Final = 20
SACK_MAX_WORDS: Final = 16  # 16 x 64 bits = 1024 PSNs = MPR 8 x 128
NACK_LEN: Final = 16
PROBE_LEN: Final = 8
PROBE_REPLY_LEN: Final = 20
PORT_STATUS_LEN: Final = 8


class Opcode(IntEnum):
    """BTH opcodes MRC uses. Data packets are standard RC opcodes so dissectors read BTH/RETH/ImmDt;
    control packets use the manufacturer-specific range 0xC0-0xFF."""

    RDMA_WRITE_ONLY = 0x0A
    RDMA_WRITE_ONLY_IMM = 0x0B
    SACK = 0xC0
    NACK = 0xC1
    PROBE = 0xC2
    PROBE_REPLY = 0xC3
    PORT_STATUS = 0xC4


DATA_OPCODES: Final = frozenset({Opcode.RDMA_WRITE_ONLY, Opcode.RDMA_WRITE_ONLY_IMM})
CONTROL_OPCODES: Final = frozenset(
    {Opcode.SACK, Opcode.NACK, Opcode.PROBE, Opcode.PROBE_REPLY, Opcode.PORT_STATUS}
)


class MxhFlag(IntFlag):
    """MXH flags (one byte)."""

    TRIMMED = 0x01  # payload cut by a congested switch; headers intact, ICRC not checked
    RETX = 0x02  # a retransmission (the sender's view; lets the receiver skip RTT echo trust)
    FIRST = 0x04  # first packet of its message
    LAST = 0x08  # last packet of its message
    ACK_REQ_NOW = 0x10  # receiver should acknowledge at once (tail of a burst)
    PRIO = 0x20  # sent at high priority (set by the switch together with TRIMMED)


class SackFlag(IntFlag):
    """Echo flags of a SACK: what the receiver saw on the packet that triggered it."""

    ECN_CE = 0x01  # the triggering packet arrived with ECN-CE
    RETX = 0x02  # the triggering packet was a retransmission
    DUPLICATE = 0x04  # the triggering packet was a duplicate (already placed)


class NackCode(IntEnum):
    """Why a NACK was sent."""

    TRIMMED = 1  # payload trimmed in the fabric: retransmit this PSN now, the path is not bad
    OUT_OF_WINDOW = 2  # PSN beyond the receiver's MPR window
    BAD_RKEY = 3  # R_Key unknown or not matching the region
    BAD_VA = 4  # address range outside the memory region
    BAD_LENGTH = 5  # DMA length disagrees with the payload
    NO_RECV_BUFFER = 6  # WRITE-with-immediate with no posted receive (max_wimm exceeded)
    BAD_QPN = 7  # destination QP does not exist or is not connected


#: NACK codes after which the requester must not retry: the operation itself is wrong.
FATAL_NACK_CODES: Final = frozenset(
    {NackCode.BAD_RKEY, NackCode.BAD_VA, NackCode.BAD_LENGTH, NackCode.BAD_QPN}
)


class ProbeReplyFlag(IntFlag):
    SERVICE_TIME_VALID = 0x01  # service_time_ns is meaningful and should be subtracted from the RTT


class PortState(IntEnum):
    DOWN = 0
    UP = 1
