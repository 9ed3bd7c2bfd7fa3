"""Compressed chunks as they cross the wire between ranks.

A chunk of the buffer is cut into segments (`segments`): pieces of at most `MAX_SEGMENT` elements whose
sizes are powers of two where possible — MAX_SEGMENT-sized ones, then powers of two down to
`MIN_SPLIT`, then one last segment. A segment is the ring's pipelining unit: one message per segment and
ring step (ring.py), each a round trip through the transport.

A segment is encoded as one or more codec frames, its pieces (`pieces`): the codec zero-pads a frame to
the next power of two (what the RHT needs), so a segment of 2,434 elements as one frame travels as
4,096 coordinates. `pieces` cuts a segment greedily into the largest power of two that fits, until the
rest is a power of two or padding it whole wastes at most `MIN_PIECE` (256) coordinates; that rest is the
last piece (padded by the codec). So no segment pads more than 256 coordinates, every piece but the last
is a power of two of at least 512 elements (distinct, decreasing), and a segment of L elements has at
most max(1, floor(log2 L) - 7) pieces (at most 12; at most 4 below MIN_SPLIT). A segment that is a
power of two — every one but a chunk's last — is one piece, its frame exactly as before.

Why 256: a frame costs 76 bytes besides its payload (its 72-byte header with one scale, codec.py, and
the 4-byte length below) — the payload of 152 coordinates at 4 bits, of 304 at 2 — so a piece is worth
cutting when padding the rest whole would waste about that much. Measured with the codec's frames over
every segment length 1..4095 (bytes sent / (bits x length / 8); EDEN, one scale): one frame per segment
1.48 at 2 bits, 1.41 at 4 bits; this rule with the bound at 64 / 128 / 256 / 512 / 1024 coordinates
1.46 / 1.40 / 1.35 / 1.32 / 1.35 (2 bits) and 1.23 / 1.21 / 1.20 / 1.20 / 1.26 (4 bits); a plain
"powers of two down to a minimum piece of 256, then pad the rest" 1.47 / 1.24. 256 is within 0.03 of
the best at both widths.

A message is the concatenation of its segment's frames, each prefixed by its length (u32), in piece
order. A frame is one `mrc.quant` codec buffer (`encode`/`decode`: its own header, rotation seed and
CRC), so a receiver checks every frame and raises CodecError on anything inconsistent, and checks each
frame's element count against its piece (ring.py: UsageError).

A reduce-scatter message of the `measured` partial-sum strategy (ring.py) starts with a statistics
prefix (`join_stats`): four float32 — the nominal bits spent on the chunk segment so far, and the running
sums the next hop estimates the ranks' correlation from. Both ends know from the ring's configuration
whether a message has it; its 16 bytes are on the wire and counted.
"""

from __future__ import annotations

import math
import struct

from mrc.quant.codec import F32_MAX, CodecError

MAX_SEGMENT = 1 << 20
MIN_SPLIT = 1 << 12
MIN_PIECE = 1 << 8

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


def pieces(length: int) -> list[int]:
    """Sizes of the codec frames of one segment of `length` elements (module doc): the largest power of
    two that fits, again and again, until the rest is a power of two or pads to one with at most
    MIN_PIECE zeros; that rest is the last piece. Sums to length; [] for 0."""
    out: list[int] = []
    r = length
    while r > 0:
        p = 1 << (r.bit_length() - 1)
        if p == r or 2 * p - r <= MIN_PIECE:
            out.append(r)
            break
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
    """A message with the statistics prefix (module doc) before the frames. A statistic beyond float32's
    range (energies summed in float64 over ranks whose chunks each fit: 4 x 2e38) is packed at the range's
    edge: it only steers the bit allocation, which then errs, where packing it raised OverflowError and
    the all-reduce failed on one rank."""
    return STATS.pack(*(min(max(v, -F32_MAX), F32_MAX) for v in stats)) + join(frames)


def split_stats(
    message: bytes | memoryview, count: int
) -> tuple[tuple[float, float, float, float], list[memoryview]]:
    """(statistics, frames) of a `join_stats` message; CodecError if it is malformed (too short, a
    non-finite statistic, or framing that does not add up)."""
    if len(message) < STATS.size:
        raise CodecError(f"message of {len(message)} bytes has no statistics prefix")
    stats = STATS.unpack_from(message, 0)
    if not all(math.isfinite(v) for v in stats):
        raise CodecError("non-finite partial-sum statistic")
    return stats, split(memoryview(message)[STATS.size :], count)
