"""Compressed chunks as they cross the wire between ranks.

A chunk of the buffer is cut into segments (`segments`): pieces of at most `MAX_SEGMENT` elements whose
sizes are powers of two where possible, so that the zero-padding to a power of two (what the RHT needs)
wastes little. A message is the concatenation of its segments' frames, each prefixed by its length
(u32). A frame is one `mrc.quant` codec buffer (`encode`/`decode`: its own header, rotation seed and
CRC), so a receiver checks every frame and raises CodecError on anything inconsistent.

A reduce-scatter message of the `measured` partial-sum strategy (ring.py) starts with a statistics
prefix (`join_stats`): four float32 — the nominal bits spent on the chunk segment so far, and the running
sums the next hop estimates the ranks' correlation from. Both ends know from the ring's configuration
whether a message has it; its 16 bytes are on the wire and counted.
"""

from __future__ import annotations

import math
import struct

from mrc.quant.codec import CodecError

MAX_SEGMENT = 1 << 20
MIN_SPLIT = 1 << 12

_U32 = struct.Struct("<I")
STATS = struct.Struct("<4f")


def segments(length: int) -> list[int]:
    """Sizes of the segments of a chunk of `length` elements: MAX_SEGMENT-sized pieces, then powers of
    two down to MIN_SPLIT, then one last piece (padded by the codec to a power of two). Sums to length."""
    out: list[int] = []
    r = length
    while r > 0:
        if r >= MAX_SEGMENT:
            p = MAX_SEGMENT
        else:
            p = 1 << (r.bit_length() - 1)
            if p < MIN_SPLIT or p == r:
                p = r
        out.append(p)
        r -= p
    return out


def join(frames: list[bytes]) -> bytes:
    return b"".join(_U32.pack(len(f)) + f for f in frames)


def split(message: bytes | memoryview, count: int) -> list[memoryview]:
    """The `count` frames of a message; CodecError if the framing does not add up."""
    mv = memoryview(message)
    out: list[memoryview] = []
    pos = 0
    for _ in range(count):
        if pos + _U32.size > len(mv):
            raise CodecError(f"message truncated: {len(out)} of {count} frames")
        (n,) = _U32.unpack_from(mv, pos)
        pos += _U32.size
        if pos + n > len(mv):
            raise CodecError(f"frame {len(out)} runs past the message end")
        out.append(mv[pos : pos + n])
        pos += n
    if pos != len(mv):
        raise CodecError(f"{len(mv) - pos} trailing bytes after {count} frames")
    return out


def join_stats(stats: tuple[float, float, float, float], frames: list[bytes]) -> bytes:
    """A message with the statistics prefix (module doc) before the frames."""
    return STATS.pack(*stats) + join(frames)


def split_stats(message: bytes, count: int) -> tuple[tuple[float, float, float, float], list[memoryview]]:
    """(statistics, frames) of a `join_stats` message; CodecError if it is malformed (too short, a
    non-finite statistic, or framing that does not add up)."""
    if len(message) < STATS.size:
        raise CodecError(f"message of {len(message)} bytes has no statistics prefix")
    stats = STATS.unpack_from(message, 0)
    if not all(math.isfinite(v) for v in stats):
        raise CodecError("non-finite partial-sum statistic")
    return stats, split(memoryview(message)[STATS.size :], count)
