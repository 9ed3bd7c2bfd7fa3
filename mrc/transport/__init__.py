"""The sans-I/O MRC transport engine (docs/design.md §4; driver interface in docs/transport.md).

Objects mirror the MRC APIs: `Context` (mrc_context: the engine one host runs), `MemoryRegion` (with an
R_Key, over any writable buffer), `CompletionQueue`, `QueuePair` (WRITE / WRITE-with-immediate, pre-posted
receives); from the controller API: `EvProfile` with EV states GOOD / ASSUMED_BAD / DENIED / UNKNOWN and
`EvEvent`s carrying drop counts, CC profiles (`NsccConfig`, the 13 fields of mrc_ctl_cc_nscc_cfg, or the
null algorithm).
"""

from .cc import CongestionControl, Nscc, NsccConfig, NullCC
from .engine import AsyncEvent, Context
from .paths import EvEntry, EvEvent, EvField, EvMode, EvProfile, EvState, PathSet, ProbeResult, expand_ev
from .qp import Datagram, QueuePair
from .verbs import (
    ACK_TIMEOUT_UNIT_NS,
    EXP_CNT_INFINITE,
    MPR_UNIT,
    Access,
    AsyncEventKind,
    CompletionChannel,
    CompletionQueue,
    MemoryRegion,
    QpAttr,
    QpState,
    QueueFull,
    WcOpcode,
    WcStatus,
    WorkCompletion,
)

__all__ = [
    "ACK_TIMEOUT_UNIT_NS",
    "EXP_CNT_INFINITE",
    "MPR_UNIT",
    "Access",
    "AsyncEvent",
    "AsyncEventKind",
    "CompletionChannel",
    "CompletionQueue",
    "CongestionControl",
    "Context",
    "Datagram",
    "EvEntry",
    "EvEvent",
    "EvField",
    "EvMode",
    "EvProfile",
    "EvState",
    "MemoryRegion",
    "Nscc",
    "NsccConfig",
    "NullCC",
    "PathSet",
    "ProbeResult",
    "QpAttr",
    "QpState",
    "QueueFull",
    "QueuePair",
    "WcOpcode",
    "WcStatus",
    "WorkCompletion",
    "expand_ev",
]
