"""The simulators' seeded payloads: deterministic, seed-dependent, any length, their own memory."""

from __future__ import annotations

import numpy as np
import pytest

from mrc.sim.payload import seeded_bytes


def test_seeded_bytes_are_a_function_of_the_seed_and_prefix_stable() -> None:
    a = seeded_bytes(1000, 7)
    assert a.dtype == np.uint8 and a.shape == (1000,) and a.flags.c_contiguous and a.flags.writeable
    assert np.array_equal(a, seeded_bytes(1000, 7))
    assert not np.array_equal(a, seeded_bytes(1000, 8))
    # a shorter draw is a prefix of a longer one (one raw word stream), for lengths not a multiple of 8
    for n in (0, 1, 7, 9, 999):
        assert np.array_equal(seeded_bytes(n, 7), a[:n])
    # roughly uniform bytes (a stuck generator or a zero buffer would fail): every value occurs
    assert np.unique(seeded_bytes(1 << 16, 3)).size == 256


def test_seeded_bytes_own_their_memory_and_refuse_a_negative_size() -> None:
    a, b = seeded_bytes(64, 1), seeded_bytes(64, 1)
    a[:] = 0
    assert b.any()
    with pytest.raises(ValueError, match="size"):
        seeded_bytes(-1, 1)
