"""The ranges of every quantity a simulation's input controls (docs/sim.md, "Options and their ranges").

The simulator allocates in proportion to its inputs: buffers of the transfer size, WRITE queues that keep
a NIC busy for the whole run (rate x duration), one timeline row per bin, one event per link flap. An
unchecked rate of 1e12 Gb/s asked for billions of queued WRITEs and ran out of memory; NaN and infinity
failed deep in integer arithmetic. So the config objects (`FabricConfig`, `LoopbackConfig`, `FabricSpec`,
`RunSpec`) and the experiments check their inputs against these ranges and raise ValueError naming the
field, and `mrcctl sim` checks its options against the same numbers before it builds anything. The
ranges hold every real fabric (a 1.6 Tbit/s port, a second of delay, thousands of hosts) with room, and
keep one run within a few GiB of memory."""

from __future__ import annotations

import math
from typing import Final

from mrc import topology

MIN_RATE_GBPS: Final = topology.MIN_RATE_BPS / 1e9  # 1 kbit/s, as a topology file
MAX_RATE_GBPS: Final = topology.MAX_RATE_BPS / 1e9  # 1.6 Tbit/s
MAX_DELAY_NS: Final = topology.MAX_DELAY_US * 1_000  # one second, as a topology file
MAX_SIM_NS: Final = 10_000_000_000  # simulated time of one run: 10 s
MAX_BUFFER_BYTES: Final = topology.MAX_BUFFER_BYTES  # a switch port's buffer: 1 GiB
MAX_LOOPBACK_BYTES: Final = 1 << 30  # one loopback WRITE: source, destination and random bytes ~3 GiB
MAX_BUFFERS_BYTES: Final = 1 << 30  # incast senders x size, all-reduce ranks x size (real buffers)
MAX_OFFERED_BYTES: Final = 1 << 38  # flows x NIC rate x duration of long-lived flows (queued WRITEs)
MAX_BINS: Final = 100_000  # timeline rows of the failover experiment
MAX_LINK_CHANGES: Final = 10_000  # scheduled up/down events of a flapping link
MAX_BLACKHOLES: Final = 64
MAX_EVS: Final = 1 << 14  # EVs in one QP profile
MAX_SEED: Final = 2**32 - 1  # seeds feed numpy's generators, which take non-negative integers
MAX_LOOPBACK_PLANES: Final = 64
MAX_TIMEOUT_EXP: Final = 24  # ACK timeout 1.024 us x 2^24 = 17 s


def number(name: str, value: object, lo: float, hi: float, *, lo_open: bool = False,
           hi_open: bool = False, unit: str = "") -> float:
    """`value` if it is a finite number in [lo, hi] (open ends where asked), else ValueError naming
    `name`, the range and the value. NaN compares false with everything, so it is refused by name."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    if value < lo or value > hi or (lo_open and value == lo) or (hi_open and value == hi):
        left, right = "(" if lo_open else "[", ")" if hi_open else "]"
        raise ValueError(f"{name} must be in {left}{lo:g}, {hi:g}{right}{unit}, got {value:g}{unit}")
    return value


def integer(name: str, value: object, lo: int, hi: int, unit: str = "") -> int:
    """`value` if it is an int in lo..hi, else ValueError naming `name`, the range and the value."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be {lo}..{hi}{unit}, got {value}{unit}")
    return value


def probability(name: str, value: object, *, one: bool = False) -> float:
    """A probability in [0, 1) (a loss or trim rate: 1 would stop every packet), or (0, 1] with `one`
    (a marking rate)."""
    if one:
        return number(name, value, 0.0, 1.0, lo_open=True)
    return number(name, value, 0.0, 1.0, hi_open=True)


def rate_gbps(name: str, value: object, *, zero_is_infinite: bool = False) -> float:
    if zero_is_infinite and value == 0 and not isinstance(value, bool):
        return 0.0
    return number(name, value, MIN_RATE_GBPS, MAX_RATE_GBPS, unit=" Gb/s")


def nanoseconds(name: str, value: object, hi: int = MAX_SIM_NS, lo: int = 0) -> int:
    return integer(name, value, lo, hi, " ns")


def seed(name: str, value: object) -> int:
    return integer(name, value, 0, MAX_SEED)
