"""Quantities typed by people: rates, sizes and delays in topology files and on the command line.

One parser per kind, so `64K` means the same bytes in a topology file, `mrcctl port set --buffer` and
`mrcctl sim loopback --size`. Sizes are binary (K = KB = KiB = 1024, as perftest, nccl-tests and tc read
them); rates are tc's units in bits per second (decimal). Each raises ValueError with examples."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

RATE_UNITS: Final = {
    "": 1, "bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12,
    "k": 10**3, "m": 10**6, "g": 10**9,  # bare prefixes: bits, as in the topology files
    "bps": 8, "kbps": 8 * 10**3, "mbps": 8 * 10**6, "gbps": 8 * 10**9,  # tc: bytes per second
}
SIZE_UNITS: Final = {
    "": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
    "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
}
DELAY_UNITS_US: Final = {"": 1, "ns": 1e-3, "us": 1, "ms": 10**3, "s": 10**6}

#: larger than any rate, size or delay mrc takes (each caller checks its own range), small enough that
#: int() of it is exact enough and never meets a float's infinity
MAX_QUANTITY: Final = 1e30
_NUMBER_UNIT: Final = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*")


def _quantity(value: Any, what: str, units: Mapping[str, float], examples: str) -> float:
    """value (an int, or a number with an optional unit from `units`) times its unit."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"not a {what}: {value!r} (examples: {examples})")
    if isinstance(value, int):
        if abs(value) > MAX_QUANTITY:
            # not the value itself: str() of an int over 4300 digits raises
            raise ValueError(f"{what} of {value.bit_length()} bits is out of range "
                             f"(at most {MAX_QUANTITY:.0e})")
        return float(value)
    m = _NUMBER_UNIT.fullmatch(value)
    if not m or m.group(2).lower() not in units:
        raise ValueError(f"not a {what}: {value!r} (examples: {examples})")
    q = float(m.group(1)) * units[m.group(2).lower()]
    if not q <= MAX_QUANTITY:  # a digit string too long for a float is inf
        raise ValueError(f"{what} {value!r} is out of range (at most {MAX_QUANTITY:.0e})")
    return q


def parse_rate(value: Any) -> int:
    """A rate in bit/s: an integer, or a string in tc's units (``"100mbit"``, ``"2.5gbit"``)."""
    bits = int(_quantity(value, "rate", RATE_UNITS, "100mbit, 1gbit, 500000"))
    if bits <= 0:
        raise ValueError(f"rate must be positive, got {value!r}")
    return bits


def parse_size(value: Any) -> int:
    """A size in bytes: an integer or a string (``"131072"``, ``"128K"``, ``"64KiB"``, ``"1.5M"``)."""
    n = _quantity(value, "size", SIZE_UNITS, "131072, 128K, 64KiB, 16M, 1G")
    if n != int(n):
        raise ValueError(f"size {value!r} is not a whole number of bytes")
    if n <= 0:
        raise ValueError(f"size must be positive, got {value!r}")
    return int(n)


def parse_delay_us(value: Any) -> int:
    """A delay in whole microseconds: an integer (µs) or a string (``"0"``, ``"50us"``, ``"2ms"``,
    ``"3000ns"``). A fraction of a microsecond is refused: it was rounded away ("0.5us" became 0, and
    "500ns", the simulator's default link delay, was refused as an unknown unit)."""
    q = _quantity(value, "delay", DELAY_UNITS_US, "0, 50us, 2ms")
    if q < 0:
        raise ValueError(f"delay must not be negative, got {value!r}")
    us = round(q)
    if abs(q - us) > 1e-9 * max(1.0, q):
        raise ValueError(f"delay must be whole microseconds (a topology keeps them in us), got {value!r} "
                         f"= {q:g} us")
    return us
