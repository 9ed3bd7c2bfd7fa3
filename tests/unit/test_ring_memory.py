"""The ring's memory on the uncompressed path (docs/collective.md, "Rank memory"): messages are views of
the arrays they come from, the result goes into a buffer the caller keeps, and the rank processes'
malloc keeps multi-MiB blocks instead of handing them back to the kernel, which would zero fresh pages
for the next step. Results are the same bytes with the copies (MRC_RING_ZERO_COPY=0) and without."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mrc.collective import Config, Transport, allreduce, frame, ring, run_inproc
from mrc.collective.bench import make_inputs
from mrc.ctl.allreduce_mrc import RANK_MALLOC, rank_env
from mrc.errors import UsageError
from mrc.sim.collective import _Recorder

N = 4
SIZE = 3 << 19  # elements per rank: chunks of 393,216, so each chunk is several segments


class Recording(_Recorder):
    """The simulator's recording transport, also keeping the object each `send` was given (before the
    inner transport copies it)."""

    def __init__(self, inner: Transport) -> None:
        super().__init__(inner)
        self.sent: list[Any] = []

    def send(self, dst: int, tag: int, data: bytes | memoryview) -> None:
        self.sent.append(data)
        super().send(dst, tag, data)


def _run(zero_copy: bool, monkeypatch: pytest.MonkeyPatch, cfg: Config) -> list[Any]:
    monkeypatch.setattr(ring, "ZERO_COPY", zero_copy)
    bufs = make_inputs(N, SIZE, "iid", 7, 0)
    return run_inproc(N, lambda t: allreduce(t, bufs[t.rank], cfg, 3).out)


@pytest.mark.parametrize("scheme", ["none", "eden-unbiased"])
def test_zero_copy_gives_the_same_bytes_as_the_copies(scheme: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = Config(scheme, 2.0, "aware")
    fast = _run(True, monkeypatch, cfg)
    slow = _run(False, monkeypatch, cfg)
    for a, b in zip(fast, slow, strict=True):
        assert a.tobytes() == b.tobytes()
    exact = np.mean(np.stack(make_inputs(N, SIZE, "iid", 7, 0)).astype(np.float64), axis=0)
    if scheme == "none":
        assert np.allclose(fast[0], exact, rtol=1e-5, atol=1e-6)


def test_uncompressed_messages_are_views_not_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ring, "ZERO_COPY", True)
    bufs = make_inputs(N, SIZE, "iid", 1, 0)
    rec: dict[int, Recording] = {}

    def go(t: Transport) -> Any:
        rec[t.rank] = Recording(t)
        return allreduce(rec[t.rank], bufs[t.rank], Config("none"), 0)

    run_inproc(N, go)
    first = rec[0].sent[0]  # rank 0's first message: a segment of its own chunk 0, straight from its input
    assert isinstance(first, memoryview) and first.format == "B"
    assert np.shares_memory(np.frombuffer(first, np.float32), bufs[0])
    assert all(isinstance(m, (bytes, memoryview)) for m in rec[0].sent)
    # every reduce-scatter message after the first hop is a view of the hop's sum, not a bytes copy
    assert sum(isinstance(m, memoryview) for m in rec[0].sent) > len(rec[0].sent) // 2


def test_the_result_goes_into_the_callers_buffer() -> None:
    bufs = make_inputs(N, SIZE, "iid", 2, 0)
    outs = [np.full(SIZE, np.nan, np.float32) for _ in range(N)]
    got = run_inproc(N, lambda t: allreduce(t, bufs[t.rank], Config("none"), 0, out=outs[t.rank]))
    ref = run_inproc(N, lambda t: allreduce(t, bufs[t.rank], Config("none"), 0))
    for r in range(N):
        assert got[r].out is outs[r]
        assert outs[r].tobytes() == ref[r].out.tobytes()
    single = run_inproc(1, lambda t: allreduce(t, bufs[0], Config("none"), 0, out=outs[0]))
    assert single[0].out is outs[0] and np.array_equal(outs[0], bufs[0])


@pytest.mark.parametrize("partial", ["naive", "aware", "measured"])
def test_compressed_final_segments_are_decoded_in_their_place(
    partial: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every frame holding all n contributions (the all-gather's, and the owner's last reduce-scatter
    hop) is decoded straight into the result buffer: codec.decode's `out`, no segment array and copy."""
    from mrc.quant import codec

    bufs = make_inputs(N, SIZE, "iid", 4, 0)
    outs = [np.full(SIZE, np.nan, np.float32) for _ in range(N)]
    into: list[bool] = []
    real = codec.decode

    def spy(buf: Any, **kw: Any) -> Any:
        o = kw.get("out")
        into.append(o is not None and any(np.shares_memory(o, b) for b in outs))
        return real(buf, **kw)

    monkeypatch.setattr(ring, "ZERO_COPY", True)
    monkeypatch.setattr(ring, "decode", spy)
    cfg = Config("eden-unbiased", 2.0, partial)
    got = run_inproc(N, lambda t: allreduce(t, bufs[t.rank], cfg, 0, out=outs[t.rank]))
    monkeypatch.setattr(ring, "decode", real)
    ref = run_inproc(N, lambda t: allreduce(t, bufs[t.rank], cfg, 0))
    for r in range(N):
        assert outs[r].tobytes() == ref[r].out.tobytes() and got[r].out is outs[r]
    pieces = sum(len(frame.pieces(s)) for b, e in ring.chunk_bounds(SIZE, N) for s in frame.segments(e - b))
    assert sum(into) == N * pieces  # each rank decodes each piece of the whole vector once, in place


@pytest.mark.parametrize(("bad", "why"), [
    (np.zeros(SIZE, np.float64), "float32"),
    (np.zeros(SIZE - 1, np.float32), "elements"),
    (np.zeros(2 * SIZE, np.float32)[::2], "contiguous"),
])
def test_a_wrong_result_buffer_is_refused(bad: np.ndarray[Any, Any], why: str) -> None:
    x = np.ones(SIZE, np.float32)
    with pytest.raises(UsageError, match=why):
        run_inproc(2, lambda t: allreduce(t, x, Config("none"), 0, out=bad))


def test_the_result_buffer_may_not_overlap_the_input() -> None:
    x = np.ones(SIZE, np.float32)
    with pytest.raises(UsageError, match="overlap"):
        allreduce(_Solo(), x, Config("none"), 0, out=x)


class _Solo:
    rank = 0
    world_size = 1

    def send(self, dst: int, tag: int, data: bytes | memoryview) -> None:
        raise AssertionError("a world of one sends nothing")

    def recv(self, src: int, tag: int) -> bytes:
        raise AssertionError("a world of one receives nothing")

    def flush(self) -> None:
        pass


def test_rank_processes_get_the_malloc_setting_unless_told_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv("MRC_RING_ZERO_COPY", raising=False)
    assert rank_env()["GLIBC_TUNABLES"] == RANK_MALLOC
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    assert rank_env()["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2"  # the caller's own choice stays
    monkeypatch.delenv("GLIBC_TUNABLES")
    monkeypatch.setenv("MRC_RING_ZERO_COPY", "0")
    assert "GLIBC_TUNABLES" not in rank_env()


@pytest.mark.parametrize("dist", ["iid", "correlated"])
def test_inputs_and_exact_mean_fill_kept_buffers_with_the_same_values(dist: str) -> None:
    from mrc.collective.bench import exact_mean

    fresh = make_inputs(3, 5001, dist, 9, 4)
    kept = [np.full(5001, np.nan, np.float32) for _ in range(3)]
    again = make_inputs(3, 5001, dist, 9, 4, out=kept)
    assert again is kept and all(a.tobytes() == b.tobytes() for a, b in zip(fresh, kept, strict=True))
    acc = np.full(5001, np.nan)
    assert exact_mean(kept, out=acc) is acc
    assert np.array_equal(acc, np.mean(np.stack(fresh).astype(np.float64), axis=0))
    with pytest.raises(Exception, match="float32 buffers of 5001"):
        make_inputs(3, 5001, dist, 9, 4, out=kept[:2])


def test_vnmse_is_the_normalised_squared_error() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(1000)
    e = (x + 0.1 * rng.standard_normal(1000)).astype(np.float32)
    want = float(np.sum((e.astype(np.float64) - x) ** 2) / np.sum(x**2))
    assert ring.vnmse(e, x) == pytest.approx(want, rel=1e-12)
    assert ring.vnmse(np.zeros(3, np.float32), np.zeros(3)) == 0.0


@pytest.mark.parametrize("zero_copy", [True, False])
@pytest.mark.parametrize("length", [0, 3, 4 * 1000 - 1, 4 * 1000 + 4])
def test_an_uncompressed_segment_of_the_wrong_length_is_a_usage_error(
    zero_copy: bool, length: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ring, "ZERO_COPY", zero_copy)
    rep = ring._RawChunks()
    rep.sizes = {0: [1000]}
    with pytest.raises(UsageError, match="float32 values were expected"):
        rep.unpack(0, 0, bytes(length), 1)
    with pytest.raises(UsageError, match="float32 values were expected"):
        rep.advance(0, 0, bytes(length), np.zeros(1000, np.float32), 2, False)
    assert rep.unpack(0, 0, bytes(4000), 1).size == 1000
