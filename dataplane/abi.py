"""The Python mirror of bpf/include/mrc_abi.h's dataplane part: ctypes structs with the same fields in the
same order, and the enums. tests/unit/test_abi_structs.py parses the header and fails when the two
disagree (names, types, array lengths, and therefore offsets and sizes)."""

from __future__ import annotations

import ctypes as ct
from enum import IntEnum, IntFlag
from typing import Final

MAX_PORTS: Final = 1024
MAX_HOSTS: Final = 256
PATHS_MAX: Final = 65536
QPS_MAX: Final = 65536
EV_BUCKETS: Final = 32
FAULT_ANY_EV: Final = 0xFFFFFFFF


class DropReason(IntEnum):
    """Why a program dropped a packet: the closed set behind the metric label `reason`."""

    TRUNCATED = 1
    BAD_IP = 2
    BAD_LENGTH = 3
    BAD_VERSION = 4
    BAD_OPCODE = 5
    FOREIGN_QPN = 6
    NO_PATH = 7
    ENCAP_FAILED = 8
    BUFFER = 9
    FAULT = 10
    BLACKHOLE = 11

    @property
    def label(self) -> str:
        return self.name.lower()


DROP_MAX: Final = 12


class SwitchAction(IntEnum):
    """What a switch port did with a packet (one per packet)."""

    FORWARD = 0
    ECN_MARK = 1
    TRIM = 2
    DROP_BUFFER = 3
    DROP_FAULT = 4
    DROP_BLACKHOLE = 5

    @property
    def label(self) -> str:
        return self.name.lower()


SW_ACT_MAX: Final = 6


class PortFlag(IntFlag):
    QP_FILTER = 0x1
    XDP_DECAP = 0x2


# C names of the macros above, for the header check
DEFINES: Final[dict[str, int]] = {
    "MRC_MAX_PORTS": MAX_PORTS,
    "MRC_MAX_HOSTS": MAX_HOSTS,
    "MRC_PATHS_MAX": PATHS_MAX,
    "MRC_QPS_MAX": QPS_MAX,
    "MRC_EV_BUCKETS": EV_BUCKETS,
    "MRC_FAULT_ANY_EV": FAULT_ANY_EV,
    "MRC_DROP_MAX": DROP_MAX,
    "MRC_SW_ACT_MAX": SW_ACT_MAX,
    **{f"MRC_DROP_{r.name}": int(r) for r in DropReason},
    **{f"MRC_SW_{a.name}": int(a) for a in SwitchAction},
    **{f"MRC_PORT_F_{f.name}": int(f) for f in PortFlag if f.name},
}


class Counter(ct.Structure):
    _c_name_ = "mrc_counter"
    _fields_ = [("packets", ct.c_uint64), ("bytes", ct.c_uint64)]


class PathKey(ct.Structure):
    _c_name_ = "mrc_path_key"
    _fields_ = [("netns_cookie", ct.c_uint64), ("dst", ct.c_uint8 * 16), ("ev_index", ct.c_uint32),
                ("pad", ct.c_uint32)]


class PathEntry(ct.Structure):
    _c_name_ = "mrc_path"
    _fields_ = [
        ("ifindex", ct.c_uint32), ("port_id", ct.c_uint32), ("smac", ct.c_uint8 * 6),
        ("dmac", ct.c_uint8 * 6), ("src", ct.c_uint8 * 16), ("container", ct.c_uint8 * 16),
        ("plane", ct.c_uint32),
    ]


class InPort(ct.Structure):
    _c_name_ = "mrc_in_port"
    _fields_ = [("port_id", ct.c_uint32), ("host_id", ct.c_uint32), ("plane", ct.c_uint32),
                ("flags", ct.c_uint32)]


class QpKey(ct.Structure):
    _c_name_ = "mrc_qp_key"
    _fields_ = [("host_id", ct.c_uint32), ("qpn", ct.c_uint32)]


class EvCounters(ct.Structure):
    _c_name_ = "mrc_ev_counters"
    _fields_ = [("packets", ct.c_uint64), ("bytes", ct.c_uint64), ("ce", ct.c_uint64),
                ("trimmed", ct.c_uint64)]


class SwPort(ct.Structure):
    _c_name_ = "mrc_sw_port"
    _fields_ = [
        ("port_id", ct.c_uint32), ("pad", ct.c_uint32), ("rate_bps", ct.c_uint64), ("ecn_k", ct.c_uint32),
        ("trim_t", ct.c_uint32), ("buffer", ct.c_uint32), ("pad2", ct.c_uint32),
    ]


class Vq(ct.Structure):
    _c_name_ = "mrc_vq"
    _fields_ = [("last_ns", ct.c_uint64), ("backlog", ct.c_uint64)]


class Fault(ct.Structure):
    _c_name_ = "mrc_fault"
    _fields_ = [("drop_prob", ct.c_uint32), ("blackhole", ct.c_uint32), ("ev_index", ct.c_uint32),
                ("pad", ct.c_uint32)]


STRUCTS: Final[tuple[type[ct.Structure], ...]] = (
    Counter, PathKey, PathEntry, InPort, QpKey, EvCounters, SwPort, Vq, Fault,
)


def mac_key(mac: str | bytes) -> ct.c_uint64:
    """The key of mrc_in_ports and mrc_sw_ports: the MAC's six bytes in memory order in a u64 (as the
    programs copy it)."""
    raw = mac if isinstance(mac, bytes) else bytes(int(x, 16) for x in mac.split(":"))
    if len(raw) != 6:
        raise ValueError(f"bad MAC {mac!r}")
    return ct.c_uint64(int.from_bytes(raw + b"\0\0", "little"))


def drop_prob_fixed(p: float) -> int:
    """A drop probability as the program compares it (fraction of 2^32 - 1)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"drop probability must be within 0..1, got {p}")
    return min(0xFFFFFFFF, round(p * 0xFFFFFFFF))
