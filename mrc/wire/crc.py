"""CRC-32 (IEEE, zlib's polynomial and conventions) from the fastest implementation installed.

The ICRC covers every byte of every packet and the quantized codec frames every message with the same
CRC, so this one function is a large share of a simulated packet's cost. zlib's ``crc32`` as Debian 12
ships it (1.2.13, table-driven) runs about 0.7 us per 4 KiB packet on this machine; ISA-L's
(``isal.isal_zlib.crc32``, PCLMULQDQ folding) about 0.1 us, the same values. `isal` is a dependency; the
fallback to zlib keeps a wheel-less platform working, only slower. `CRC32_IMPL` names the one in use.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

crc32: Callable[..., int] = zlib.crc32
CRC32_IMPL = "zlib"
try:
    from isal import isal_zlib
except ImportError:  # no wheel for this platform: zlib gives the same values
    pass
else:
    crc32 = isal_zlib.crc32
    CRC32_IMPL = "isal"


def _check(impl: Callable[..., Any]) -> bool:
    """The values this module relies on: zlib's, for a chained call on a memoryview slice too."""
    data = bytes(range(256)) * 5
    return bool(impl(memoryview(data)[3:1001], impl(data[:3])) == zlib.crc32(data[:1001]))


if CRC32_IMPL != "zlib" and not _check(crc32):  # never seen; a wrong CRC would drop every packet
    crc32, CRC32_IMPL = zlib.crc32, "zlib"

__all__ = ["CRC32_IMPL", "crc32"]
