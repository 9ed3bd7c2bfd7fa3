"""Compressed chunks as they cross the wire between ranks.

A chunk of the buffer is cut into segments (`segments`): pieces of at most `MAX_SEGMENT` elements whose
sizes are powers of two where possible, so that the zero-padding to a power of two (what the RHT needs)
wastes little. A message is the concatenation of its segments' frames, each prefixed by its length
(u32). A frame is one `mrc.quant` codec buffer (`encode`/`decode`: its own header, rotation seed and
CRC), so a receiver checks every frame and raises CodecError on anything inconsistent.
"""

from __future__ import annotations

import struct

from mrc.quant.codec import CodecError

MAX_SEGMENT = 1 << 20
MIN_SPLIT = 1 << 12

_U32 = struct.Struct("<I")


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


def split(message: bytes, count: int) -> list[memoryview]:
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
