"""Why the engine dropped a datagram: one closed set, the label `reason` of `mrc_engine_drops_total`.

It is the wire parser's `Reason` set (`mrc.wire.errors`, what `parse` rejects) plus what the engine itself
refuses after a packet parsed: stray feedback, packets outside the window, packets for a QP that cannot
take them. A str enum, so `Context.drops` keys still compare equal to (and serialise as) their names; a
new failure mode gets a member here, never a free-form string, so exporters can publish every reason at 0
from the start and alerts can name them.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from mrc.wire.errors import REASONS


class EngineDrop(StrEnum):
    # the wire parser's reasons (mrc.wire.errors.REASONS), in its order
    TRUNCATED = "truncated"
    BAD_VERSION = "bad_version"
    BAD_OPCODE = "bad_opcode"
    BAD_LENGTH = "bad_length"
    BAD_ICRC = "bad_icrc"
    BAD_FIELD = "bad_field"
    BAD_IP = "bad_ip"
    # addressing: the datagram names no QP that may take it
    UNKNOWN_QPN = "unknown_qpn"  # no QP with that number (never created, or destroyed)
    QP_STATE = "qp_state"  # the QP is not in RTR/RTS
    FOREIGN_SRC = "foreign_src"  # from an address other than the QP's peer
    BAD_PKEY = "bad_pkey"  # a P_Key outside the QP's partition (IBA 10.9.3; checked after the ICRC)
    PORT_DISABLED = "port_disabled"  # arrived on a port administratively down
    # responder: data outside what it can place
    STALE = "stale"  # below the cumulative PSN (answered with a duplicate SACK)
    DUPLICATE = "duplicate"  # already placed (answered with a duplicate SACK)
    OUT_OF_WINDOW = "out_of_window"  # beyond the MPR window (NACK OUT_OF_WINDOW)
    BAD_RKEY = "bad_rkey"  # NACK BAD_RKEY
    BAD_VA = "bad_va"  # NACK BAD_VA
    NO_RECV_BUFFER = "no_recv_buffer"  # a WRITE-with-immediate with no posted receive (RNR NACK)
    # requester: feedback that refers to nothing this QP sent (stray or forged)
    SACK_UNMATCHED = "sack_unmatched"
    SACK_AHEAD = "sack_ahead"  # a cumulative PSN beyond what was sent
    NACK_UNMATCHED = "nack_unmatched"
    NACK_STALE = "nack_stale"  # a NACK for a transmission that has been superseded
    PROBE_REPLY_UNMATCHED = "probe_reply_unmatched"
    PORT_STATUS_STALE = "port_status_stale"  # an epoch not newer than the last accepted
    PORT_STATUS_BAD_PORT = "port_status_bad_port"  # names a port the QP does not have


#: What the wire parser raises, as members (its order): every one must be a member above.
WIRE_DROPS: Final = tuple(EngineDrop(r) for r in REASONS)
