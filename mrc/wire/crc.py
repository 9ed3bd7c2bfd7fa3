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


def isal_crc32_address() -> int:
    """The address of ISA-L's ``crc32_gzip_refl(init, buf, len)`` in python-isal's extension module, for
    compiled code to call (the engine's C fast path, the batch receive kernel), or 0 where that build
    does not export it or its values are not zlib's (checked here, once per call)."""
    import ctypes

    try:
        from isal import isal_zlib

        addr = ctypes.cast(ctypes.CDLL(isal_zlib.__file__).crc32_gzip_refl, ctypes.c_void_p).value
    except (ImportError, OSError, AttributeError):
        return 0
    if not addr:
        return 0
    f = ctypes.CFUNCTYPE(ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_uint64)(addr)
    probe = (ctypes.c_char * 1001).from_buffer_copy(bytes(range(256)) * 3 + bytes(233))
    if f(0x1234, ctypes.addressof(probe), 1001) != zlib.crc32(bytes(probe), 0x1234):
        return 0
    return int(addr)


__all__ = ["CRC32_IMPL", "crc32", "isal_crc32_address"]
