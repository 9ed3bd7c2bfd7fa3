"""Hostile but legal inputs to the collectives (outside audit, 2026-12-05): partial sums that overflow
float32, fp16 buckets whose average crosses fp16's range, numpy integer steps and seeds, short one-shot
messages, 2-D inputs to the hierarchy, ranks with buffers of different lengths, finite inputs near
float32's maximum, and numpy's overflow warnings on the one-shot path. Each test fails without its fix."""

from __future__ import annotations

import threading
import warnings
from typing import Any

import numpy as np
import pytest

from mrc.collective import Config, allreduce, run_inproc, vnmse
from mrc.collective.hier import simulate
from mrc.collective.ring import derive_seed
from mrc.collective.transport import InProcHub, Transport
from mrc.errors import UsageError
from mrc.quant.codec import CodecError, decode, encode

F32_MAX = float(np.finfo(np.float32).max)
DEADLINE_S = 60.0  # the transports' deadline: a rank left waiting would take this long to fail


def _every_rank(n: int, fn: Any,
                timeout_s: float = DEADLINE_S) -> tuple[list[Any], list[BaseException | None], int]:
    """fn(transport) on n ranks in threads WITHOUT the hub's failure shortcut (run_inproc tells the
    others when one rank raises; a real transport does not): (values, errors) per rank, and how many
    messages were sent but never received. A rank left waiting for a peer that gave up fails at the
    hub's deadline with TransportError, so `errors == [None] * n` says no rank waited for nothing,
    without measuring time (a fresh checkout compiles the codec's float64 kernels on this path: tens of
    seconds on busy CPUs, which is not what these tests are about)."""
    hub = InProcHub(n, timeout_s)
    values: list[Any] = [None] * n
    errors: list[BaseException | None] = [None] * n

    def body(r: int) -> None:
        try:
            values[r] = fn(hub.endpoint(r))
        except BaseException as e:
            errors[r] = e

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 30)
    unread = sum(q.qsize() for q in hub._q.values())
    return values, errors, unread


# 1. a partial sum that overflows float32 in a compressed ring ------------------------------------------

@pytest.mark.parametrize("partial_sums", ["naive", "aware", "measured"])
@pytest.mark.parametrize("residual", [False, True])
def test_overflowing_partial_sum_reaches_every_rank_promptly(partial_sums: str, residual: bool) -> None:
    """Each rank's buffer is finite (3e38) but the sum is not: the hop that adds its own chunk to the
    incoming partial sum used to raise CodecError on one rank while the others waited out the deadline.
    Now every rank returns promptly with the same result, NaN where the sum overflowed (the module's
    NONFINITE contract, as for a non-finite gradient), finite elsewhere."""
    n, length = 4, 4 * 1024
    bufs = [np.full(length, 1.0, np.float32) for _ in range(n)]
    for b in bufs:
        b[:8] = 3e38  # in chunk 0: 4 x 3e38 is past float32
    cfg = Config("eden-unbiased", 4.0, partial_sums)
    values, errors, unread = _every_rank(n, lambda t: allreduce(t, bufs[t.rank], cfg, 7, residual=residual))
    assert errors == [None] * n, errors  # a rank left waiting fails at the deadline: not None
    assert unread == 0  # and no rank sent what no peer took
    outs = [v.out for v in values]
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])  # bit-identical, NaN in the same places
    assert np.isnan(outs[0][:8]).all()
    assert np.isfinite(outs[0][length // n :]).all()  # the other chunks are untouched
    if residual:
        assert all(np.isfinite(v.residual).all() for v in values)


# 2. the DDP hook saturates to the bucket's dtype ------------------------------------------------------

def test_ddp_hook_saturates_fp16_instead_of_inf(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch", reason="torch is not importable (make setup installs torch==2.13.0)")
    import torch.distributed as dist

    from mrc.collective.ddp import MrcHookState, mrc_hook

    n = 2
    ranks = threading.local()
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: n)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: ranks.r)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)

    class Bucket:
        def __init__(self, t: Any) -> None:
            self.t = t

        def buffer(self) -> Any:
            return self.t

        def index(self) -> int:
            return 0

        def is_last(self) -> bool:
            return True

    fp16_max = float(np.finfo(np.float16).max)
    rng = np.random.default_rng(3)
    grads = [np.clip(rng.normal(0, 1, 4096) * 40000 + 40000 * (1 - 2 * (np.arange(4096) % 2)),
                     -fp16_max, fp16_max).astype(np.float16) for _ in range(n)]
    grads[0][:4] = fp16_max
    grads[1][:4] = fp16_max

    def rank(t: Transport) -> Any:
        ranks.r = t.rank
        state = MrcHookState(bits=1.0, scheme="eden-unbiased", start_iter=0, transport=t)
        return mrc_hook(state, Bucket(torch.from_numpy(grads[t.rank].copy()))).value()

    outs = run_inproc(n, rank, 60.0)
    for o in outs:
        assert o.dtype == torch.float16
        v = o.numpy()
        assert np.isfinite(v).all(), f"{np.count_nonzero(~np.isfinite(v))} non-finite values"
    np.testing.assert_array_equal(outs[0].numpy(), outs[1].numpy())
    assert float(np.abs(outs[0].numpy()).max()) == fp16_max  # saturated, at least somewhere


def test_ddp_hook_keeps_a_real_overflow() -> None:
    """Saturation is for what the all-reduce made of finite gradients; an inf the model produced must
    still reach GradScaler (as NaN through the codec, module docs) -- not be clipped to 65504."""
    torch = pytest.importorskip("torch", reason="torch is not importable (make setup installs torch==2.13.0)")
    from mrc.collective import ddp

    buf = torch.tensor([1.0, np.inf, -np.inf, np.nan, 70000.0], dtype=torch.float32).to(torch.float16)
    got = ddp._to_bucket_dtype(np.array([1.0, np.inf, -np.inf, np.nan, 70000.0], np.float32), buf)
    v = got.numpy()
    assert v[0] == 1.0 and v[1] == np.inf and v[2] == -np.inf and np.isnan(v[3])
    assert v[4] == float(np.finfo(np.float16).max)


# 3. numpy integer steps and seeds ---------------------------------------------------------------------

@pytest.mark.parametrize("kind", [np.int64, np.uint64, np.int32])
def test_numpy_integer_step_and_seed(kind: Any) -> None:
    x = [np.arange(2048, dtype=np.float32) * (r + 1) for r in range(2)]
    cfg = Config("eden-unbiased", 4.0, seed=kind(5))
    got = run_inproc(2, lambda t: allreduce(t, x[t.rank], cfg, kind(3)).out)
    ref = run_inproc(2, lambda t: allreduce(t, x[t.rank], Config("eden-unbiased", 4.0, seed=5), 3).out)
    np.testing.assert_array_equal(got[0], ref[0])
    assert derive_seed(np.int64(-1), np.uint64(2**64 - 1)) == derive_seed(-1, 2**64 - 1)


@pytest.mark.parametrize("step", [-1, 2**64, np.int64(-3)])
def test_step_out_of_range_is_a_usage_error(step: Any) -> None:
    with pytest.raises(UsageError, match="step"):
        run_inproc(2, lambda t: allreduce(t, np.ones(8, np.float32), Config("eden-unbiased", 4.0), step))


# 4. one-shot: a message whose length is not a multiple of 4 -------------------------------------------

class _Truncating:
    """A transport that delivers every message one byte short."""

    def __init__(self, t: Transport) -> None:
        self.t = t
        self.rank, self.world_size = t.rank, t.world_size

    def send(self, dst: int, tag: int, data: Any) -> None:
        self.t.send(dst, tag, bytes(data)[:-1])

    def recv(self, src: int, tag: int) -> bytes:
        return self.t.recv(src, tag)

    def flush(self) -> None:
        self.t.flush()


def test_oneshot_odd_message_length_names_the_sizes() -> None:
    cfg = Config("none", algorithm="oneshot")
    with pytest.raises(UsageError, match=r"4095 bytes.*4096"):
        run_inproc(2, lambda t: allreduce(_Truncating(t), np.ones(1024, np.float32), cfg))


# 5. the hierarchy validates input as the ring does and keeps the caller's shape -----------------------

def test_hier_accepts_2d_and_restores_shape() -> None:
    bufs = [np.arange(12, dtype=np.float64).reshape(3, 4) * (r + 1) for r in range(4)]
    res = simulate(bufs, 2, Config("none", average=False), timeout_s=30)
    want = np.sum(bufs, axis=0)
    for r in res:
        assert r.out.dtype == np.float32
        assert r.out.shape == (3, 4)
        np.testing.assert_array_equal(r.out, want.astype(np.float32))


@pytest.mark.parametrize("bad", [np.ones(4, complex), np.array(["a", "b"]), np.full(4, 1e300)])
def test_hier_refuses_what_the_ring_refuses(bad: Any) -> None:
    with pytest.raises(UsageError):
        run_inproc(2, lambda t: allreduce(t, bad, Config("none")))
    with pytest.raises(UsageError):
        simulate([bad, bad], 1, Config("none"), timeout_s=30)


# 6. ranks with buffers of different lengths -----------------------------------------------------------

@pytest.mark.parametrize("scheme,algorithm,partial_sums", [
    ("eden-unbiased", "ring", "naive"), ("eden-unbiased", "ring", "aware"),
    ("eden-unbiased", "ring", "measured"), ("eden-unbiased", "oneshot", "naive"),
])
def test_mismatched_lengths_are_a_usage_error_naming_sizes(scheme: str, algorithm: str,
                                                          partial_sums: str) -> None:
    lengths = [3000, 2000]
    cfg = Config(scheme, 4.0, partial_sums, algorithm=algorithm)
    with pytest.raises(UsageError) as ei:
        run_inproc(2, lambda t: allreduce(t, np.ones(lengths[t.rank], np.float32), cfg), 30)
    msg = str(ei.value)
    assert "length" in msg or "elements" in msg
    assert any(str(s) in msg for s in (1500, 1000, 3000, 2000)), msg


# 7. finite inputs near float32's maximum encode, accurately -------------------------------------------

def _near_max(seed: int, div: float = 4) -> np.ndarray:
    """Finite float32, Gaussian with a spread of float32's maximum / `div`, clipped to the range."""
    return np.clip(np.random.default_rng(seed).normal(0, 1, 4096) * (F32_MAX / div), -F32_MAX,
                   F32_MAX).astype(np.float32)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("group", [None, 256])
def test_codec_encodes_inputs_near_float32_max(backend: str, group: int | None) -> None:
    """This input's rotation overflowed float32 in the reference's partial sums and encode refused it
    as non-finite; scaled by a power of two first, it encodes and decodes with exactly the relative error
    of its copy scaled down by 2^-100 (a power of two changes no rounding)."""
    if backend == "numba":
        pytest.importorskip("numba")
    big = _near_max(1)
    small = big * np.float32(2.0**-100)
    errs = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for x in (big, small):
            d = np.asarray(decode(encode(x, "eden-unbiased", 4.0, seed=1, backend=backend, group=group),
                                  dtype=np.float64, backend=backend), np.float64)
            assert np.isfinite(d).all()
            errs.append(vnmse(d, x))
    assert errs[0] < 0.02 and errs[0] == pytest.approx(errs[1], rel=1e-6)


@pytest.mark.parametrize("x", [_near_max(5, 3), np.full(4096, 1e38, np.float32)], ids=["gauss", "const"])
def test_codec_refuses_at_encode_what_no_decoder_accepts(x: np.ndarray) -> None:
    """Finite values whose reconstruction passes float32's range: refused by encode, naming why (the
    first used to give a frame every decoder refused, DecodeOverflow; the second "non-finite")."""
    with pytest.raises(CodecError, match="beyond what a float32 frame can represent"):
        encode(x, "eden-unbiased", 4.0, seed=1)


@pytest.mark.parametrize("seed", range(1, 9))
def test_codec_frames_near_float32_max_decode_or_are_refused(seed: int) -> None:
    """At a spread of float32's maximum / 4 the reconstruction's peak lands on either side of the maximum
    (by seed, and by the CPU's summation order): whichever side, encode either refuses, naming why, or
    gives a frame both decoders accept with finite values, never a frame a receiver refuses."""
    x = _near_max(seed)
    try:
        frame = encode(x, "eden-unbiased", 4.0, seed=1)
    except CodecError as e:
        assert "beyond what a float32 frame can represent" in str(e)
        return
    for backend in ("numpy", "numba"):
        if backend == "numba":
            pytest.importorskip("numba")
        assert np.isfinite(np.asarray(decode(frame, backend=backend))).all()


def test_ring_all_reduces_inputs_near_float32_max() -> None:
    """Finite inputs whose sum is finite but whose rotation passes float32's range: the codec refused
    them as non-finite and the ring failed; now they go as float64 frames (ring._encode_finite), with
    the relative error of a scaled-down copy."""
    x = [np.full(4096, 1e38, np.float32) * np.float32(0.2 + 0.1 * r) for r in range(2)]
    x[1][::3] = 1.3e38  # rotated: a spread of ~1e38, past float32's range at its Gaussian tails
    out = run_inproc(2, lambda t: allreduce(t, x[t.rank], Config("eden-unbiased", 4.0, average=False)).out)
    assert np.isfinite(out[0]).all()
    want = x[0].astype(np.float64) + x[1]
    small = [v * np.float32(2.0**-100) for v in x]  # exact: a power of two
    cfg = Config("eden-unbiased", 4.0, average=False)
    ref = run_inproc(2, lambda t: allreduce(t, small[t.rank], cfg).out)
    err, err_ref = vnmse(out[0], want), vnmse(ref[0], want * 2.0**-100)
    assert err < 0.05 and err == pytest.approx(err_ref, rel=1e-3)


# 8. the one-shot path is warning-clean ----------------------------------------------------------------

@pytest.mark.parametrize("scheme", ["none", "eden-unbiased"])
def test_oneshot_overflow_is_warning_clean(scheme: str) -> None:
    x = [np.full(2048, 3e38, np.float32) for _ in range(2)]
    cfg = Config(scheme, 4.0, algorithm="oneshot", average=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        out = run_inproc(2, lambda t: allreduce(t, x[t.rank], cfg, residual=True))
    np.testing.assert_array_equal(out[0].out, out[1].out)
    # past float32: IEEE's inf uncompressed; compressed, NaN (NONFINITE) on every rank
    assert not np.isfinite(out[0].out).any()
    assert all(r.residual is not None and np.isfinite(r.residual).all() for r in out)
