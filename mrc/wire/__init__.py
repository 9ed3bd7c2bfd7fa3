"""MRC wire format (docs/design.md §3): BTH/RETH/ImmDt, the MRC extension header, control packets, ICRC.

Build functions write into preallocated buffers and return lengths; `parse` returns one `MrcPacket`
or raises `WireError` with a reason from `REASONS`. Field-by-field documentation lives in the
modules (bth, mxh, control, icrc, ip) and in docs/wire.md.
"""

from .consts import (
    DEFAULT_PAYLOAD,
    MAX_PAYLOAD,
    PSN_MASK,
    PSN_MOD,
    ROCEV2_UDP_PORT,
    MxhFlag,
    NackCode,
    Opcode,
    PortState,
    ProbeReplyFlag,
    SackFlag,
)
from .control import Nack, PortStatus, Probe, ProbeReply, Sack
from .errors import REASONS, Reason, WireError
from .icrc import IcrcContext, ev_sport
from .packet import (
    MrcPacket,
    build_nack,
    build_port_status,
    build_probe,
    build_probe_reply,
    build_sack,
    build_write,
    header_len,
    parse,
    trim_in_place,
)

__all__ = [
    "DEFAULT_PAYLOAD",
    "MAX_PAYLOAD",
    "PSN_MASK",
    "PSN_MOD",
    "REASONS",
    "ROCEV2_UDP_PORT",
    "IcrcContext",
    "MrcPacket",
    "MxhFlag",
    "Nack",
    "NackCode",
    "Opcode",
    "PortState",
    "PortStatus",
    "Probe",
    "ProbeReply",
    "ProbeReplyFlag",
    "Reason",
    "Sack",
    "SackFlag",
    "WireError",
    "build_nack",
    "build_port_status",
    "build_probe",
    "build_probe_reply",
    "build_sack",
    "build_write",
    "ev_sport",
    "header_len",
    "parse",
    "trim_in_place",
]
