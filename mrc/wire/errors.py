"""The one exception the wire parsers raise, with a reason from a closed set.

Receive loops count rejected packets by `reason` (the Prometheus label of the same name), so the
set is closed and small: a new failure mode gets a new name here, never a free-form string.
"""

from __future__ import annotations

from typing import Final, Literal

Reason = Literal[
    "truncated",  # fewer bytes than the headers (or a length field) say
    "bad_version",  # MXH version we do not speak
    "bad_opcode",  # BTH opcode that is not an MRC opcode
    "bad_length",  # a length field disagrees with the bytes present or exceeds a limit
    "bad_icrc",  # invariant CRC mismatch
    "bad_field",  # a field outside its range (reserved bits set, bad P_Key, bad code, ...)
    "bad_ip",  # the IPv6/UDP envelope is not MRC (wrong next header, port, version)
]

REASONS: Final[tuple[Reason, ...]] = (
    "truncated",
    "bad_version",
    "bad_opcode",
    "bad_length",
    "bad_icrc",
    "bad_field",
    "bad_ip",
)


class WireError(ValueError):
    """A packet that is malformed, truncated or not ours. `reason` is one of `REASONS`."""

    __slots__ = ("reason",)

    def __init__(self, reason: Reason, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason: Reason = reason
