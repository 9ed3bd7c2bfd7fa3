"""mrc.wire.crc: the fast CRC-32 gives zlib's values in every way the ICRC and the codec call it, and
the module falls back to zlib when ISA-L is missing."""

from __future__ import annotations

import importlib
import random
import sys
import zlib

import pytest

from mrc.wire import crc


@pytest.mark.parametrize("n", [0, 1, 3, 4, 5, 56, 255, 4096 + 52, 1 << 16])
def test_values_match_zlib(n: int) -> None:
    data = random.Random(n).randbytes(n)
    assert crc.crc32(data) == zlib.crc32(data)
    assert crc.crc32(bytearray(data), 0x12345678) == zlib.crc32(data, 0x12345678)
    mv = memoryview(bytearray(data))
    # chained over slices, as IcrcContext.compute does (BTH bytes 0-3, masked byte, the rest)
    a = crc.crc32(mv[5:], crc.crc32(b"\xff", crc.crc32(mv[0:4])))
    assert a == zlib.crc32(mv[5:], zlib.crc32(b"\xff", zlib.crc32(mv[0:4])))


def test_isal_is_used_when_installed() -> None:
    pytest.importorskip("isal")
    assert crc.CRC32_IMPL == "isal"


def test_falls_back_to_zlib_without_isal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "isal", None)  # import isal -> ImportError
    try:
        fresh = importlib.reload(crc)
        assert fresh.CRC32_IMPL == "zlib"
        assert fresh.crc32 is zlib.crc32
    finally:
        monkeypatch.undo()
        importlib.reload(crc)
