"""Partial-sum options of the compressed ring (issue 19): grouped scales (codec version-2 frames), bits
per hop measured from the data, and the hierarchical all-reduce. Behaviour only: round trips, bytes as
accounted, errors within the codec theory's bound, rank agreement, fused == three-pass."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mrc.collective import Config, Result, Transport, allreduce, frame, run_inproc, vnmse
from mrc.collective.bench import exact_mean, make_inputs
from mrc.collective.hier import HierResult, allreduce_hosts, simulate
from mrc.collective.ring import max_message_bytes
from mrc.collective.schedule import STEP, aware_bits, measured_bits, model_error
from mrc.collective.transport import SubTransport, TransportError
from mrc.errors import UsageError
from mrc.quant import codec
from mrc.quant.bench import theory
from mrc.wire.crc import crc32


def _x(d: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(d).astype(np.float32)


# --- grouped scales -------------------------------------------------------------------------------

@pytest.mark.parametrize("scheme", ["eden-unbiased", "eden-biased", "drive"])
@pytest.mark.parametrize("group", [1 << 12, 1 << 14])
def test_grouped_frame_round_trips_with_its_scales_accounted(scheme: str, group: int) -> None:
    d = 1 << 16
    x = _x(d)
    bits = 1.0 if scheme == "drive" else 3.0
    f = codec.encode(x, scheme, bits, seed=5, group=group)
    one = codec.encode(x, scheme, bits, seed=5)
    h = codec.parse(f)
    assert f[4] == codec.VERSION_GROUPED and h.group == group and len(h.scales) == d // group
    # the same payload size, 8 bytes per extra scale
    assert len(f) - len(one) == 8 * (d // group - 1)
    for backend in ("numpy", "numba"):
        y = codec.decode(f, backend=backend)
        assert y.shape == x.shape and np.all(np.isfinite(y))
    err = float(np.sum((codec.decode(f) - x) ** 2) / np.sum(x**2))
    v = theory(scheme, bits)
    assert v is not None and err < 1.2 * v + 0.01  # per-block scales keep the one-scale error bound


def test_grouped_unbiased_mean_over_seeds() -> None:
    x = _x(1 << 13, 1)
    est = np.mean([codec.decode(codec.encode(x, "eden-unbiased", 2, seed=s, group=1 << 10))
                   for s in range(300)], axis=0)
    v = theory("eden-unbiased", 2.0)
    assert v is not None
    # E||mean - x||^2 = v ||x||^2 / 300 for an unbiased estimator; a bias would not shrink with seeds
    assert float(np.sum((est - x) ** 2) / np.sum(x**2)) < 3 * v / 300


def test_group_at_or_above_the_padded_size_is_the_version_1_frame() -> None:
    x = _x(5000)
    assert codec.encode(x, "eden-unbiased", 2, seed=1, group=1 << 13) == codec.encode(x, "eden-unbiased", 2,
                                                                                        seed=1)


def test_grouped_frame_checks() -> None:
    with pytest.raises(codec.CodecValueError):
        codec.encode(_x(1 << 12), "eden-unbiased", 2, seed=1, group=1000)
    with pytest.raises(codec.CodecValueError):
        codec.encode(_x(1 << 12), "turboquant-mse", 2, seed=1, group=1 << 10)
    f = bytearray(codec.encode(_x(1 << 12), "eden-unbiased", 2, seed=1, group=1 << 10))
    f[4] = 1  # a version-1 header cannot carry 4 scales
    f[-4:] = crc32(bytes(f[:-4])).to_bytes(4, "little")
    with pytest.raises(codec.CodecError, match="scales"):
        codec.decode(bytes(f))


# --- measured bits --------------------------------------------------------------------------------

def test_measured_bits_spend_the_naive_budget() -> None:
    # a chain where every hop sees the model's weight spends what is left, ending within a STEP
    n, bits = 8, 2.0
    spent = aware_bits("eden-unbiased", bits, n, 0.0)[0]
    for k in range(2, n + 1):
        b = measured_bits("eden-unbiased", bits, n, k, spent, float(k), 0.0)
        spent += b * (n - 1 if k == n else 1)
    assert 2 * (n - 1) * bits - STEP * (n - 1) <= spent <= 2 * (n - 1) * bits + 1e-9


@pytest.mark.parametrize("dist", ["iid", "correlated"])
def test_measured_ring_agrees_and_sends_aware_bytes(dist: str) -> None:
    n, d = 6, 1 << 15
    xs = make_inputs(n, d, dist, 3, 0)
    ex = exact_mean(xs)
    res = {}
    for ps in ("aware", "measured"):
        cfg = Config("eden-unbiased", 2, ps, seed=3)

        def body(t: Transport, cfg: Config = cfg) -> Result:
            return allreduce(t, xs[t.rank], cfg, 0)

        out = run_inproc(n, body)
        assert all(np.array_equal(out[0].out, r.out) for r in out)
        res[ps] = (vnmse(out[0].out, ex), sum(r.wire_bytes for r in out))
    # the stats prefixes are paid from the budget: within 1 % of aware's bytes
    assert abs(res["measured"][1] - res["aware"][1]) < 0.01 * res["aware"][1]
    rho = 0.5 if dist == "correlated" else 0.0
    naive_model = model_error("eden-unbiased", (2.0,) * n, rho) / (n * (1 + rho * (n - 1)))
    assert res["measured"][0] < 1.5 * naive_model


def test_measured_residual_is_what_was_left_out() -> None:
    n, d = 4, 1 << 13
    xs = make_inputs(n, d, "iid", 1, 0)
    cfg = Config("eden-unbiased", 3, "measured", seed=1, average=False)
    out = run_inproc(n, lambda t: allreduce(t, xs[t.rank], cfg, 0, residual=True))
    total = np.sum(np.asarray(xs, np.float64), axis=0)
    resid = np.sum([r.residual for r in out if r.residual is not None], axis=0)
    assert np.allclose(out[0].out + resid, total, atol=1e-3)


def test_stats_prefix_is_checked() -> None:
    msg = frame.join_stats((1.0, 0.0, 0.0, 1.0), [b"abc"])
    assert len(msg) == frame.STATS.size + 4 + 3
    assert frame.split_stats(msg, 1)[0] == (1.0, 0.0, 0.0, 1.0)
    with pytest.raises(codec.CodecError):
        frame.split_stats(msg[:10], 1)
    with pytest.raises(codec.CodecError, match="non-finite"):
        frame.split_stats(frame.join_stats((math.nan, 0.0, 0.0, 1.0), [b"abc"]), 1)


@pytest.mark.parametrize("ps,group", [("aware", 1 << 12), ("naive", 1 << 12), ("measured", 0), ("aware", 0)])
def test_ring_is_the_same_on_both_hop_paths(ps: str, group: int, monkeypatch: pytest.MonkeyPatch) -> None:
    n, d = 4, 1 << 17
    xs = make_inputs(n, d, "correlated", 2, 0)
    cfg = Config("eden-unbiased", 2, ps, seed=2, group=group)
    outs = []
    for path in ("fused", "three-pass"):
        monkeypatch.setenv("MRC_HOP_KERNEL", path)
        r = run_inproc(n, lambda t: allreduce(t, xs[t.rank], cfg, 0))
        outs.append((r[0].out, r[0].wire_bytes))
    assert np.array_equal(outs[0][0], outs[1][0]) and outs[0][1] == outs[1][1]


def test_config_checks_the_group() -> None:
    with pytest.raises(UsageError):
        Config("eden-unbiased", 2, "aware", group=1000)
    with pytest.raises(UsageError):
        Config("none", 2, group=1 << 12)


# --- hierarchy ------------------------------------------------------------------------------------

@pytest.mark.parametrize("intra", ["none", "eden-unbiased"])
def test_hier_agrees_and_counts_bytes_apart(intra: str) -> None:
    hosts, per, d = 3, 4, 1 << 14
    xs = make_inputs(hosts * per, d, "correlated", 4, 0)
    cfg = Config("eden-unbiased", 4, "aware", seed=4, correlation=0.5)
    res = simulate(xs, hosts, cfg, intra=intra, intra_bits=8.0)
    assert all(np.array_equal(res[0].out, r.out) for r in res)
    leaders = [res[h * per] for h in range(hosts)]
    others = [r for i, r in enumerate(res) if i % per]
    assert all(r.inter_bytes == 0 for r in others)
    # inter-host: exactly the H-rank ring of the host sums
    sums = [np.sum(np.asarray(xs[h * per:(h + 1) * per], np.float64), axis=0).astype(np.float32)
            for h in range(hosts)]
    sum_cfg = Config("eden-unbiased", 4, "aware", seed=4, correlation=0.5, average=False)
    ring = run_inproc(hosts, lambda t: allreduce(t, sums[t.rank], sum_cfg, 0))
    assert [r.inter_bytes for r in leaders] == [r.wire_bytes for r in ring]
    # intra-host: the raw broadcast (4 bytes per element to each local rank) plus the uploads
    up = 4 * d if intra == "none" else len(codec.encode(xs[1], "eden-unbiased", 8.0, seed=1))
    assert all(r.intra_bytes == 4 * d * (per - 1) for r in leaders)
    assert all(abs(r.intra_bytes - up) <= 16 for r in others)
    err = vnmse(res[0].out, exact_mean(xs))
    if intra == "none":
        assert np.allclose(res[0].out, ring[0].out / (hosts * per))
    # the error of an H-rank ring of the host sums: the model's, at the worst correlation in [0, 1]
    bound = max(model_error("eden-unbiased", aware_bits("eden-unbiased", 4.0, hosts, r), r)
                / (hosts * (1 + r * (hosts - 1))) for r in (0.0, 1.0))
    assert err < 1.5 * bound + 1e-3


def test_hier_single_host_is_exact_with_fp32() -> None:
    xs = make_inputs(4, 1000, "iid", 0, 0)
    res = simulate(xs, 1, Config("eden-unbiased", 2, "aware"))
    exact = exact_mean(xs)
    assert np.allclose(res[0].out, exact, atol=1e-6) and all(r.inter_bytes == 0 for r in res)


def test_hier_over_one_transport_is_the_per_host_transports_hierarchy() -> None:
    """MRC ranks see every rank through one transport: the groups cut from it (SubTransport) give the
    result and the bytes of the hierarchy over per-host transports, bit for bit."""
    hosts, per, d = 3, 2, 3000
    names = [f"h{h}" for h in range(hosts) for _ in range(per)]
    xs = make_inputs(hosts * per, d, "correlated", 2, 0)
    cfg = Config("eden-unbiased", 2, "aware", seed=6)
    def over_one(intra: str) -> list[HierResult]:
        return run_inproc(hosts * per, lambda t: allreduce_hosts(t, names, xs[t.rank], cfg, intra=intra))

    for intra in ("none", "eden-unbiased"):
        ref = simulate(xs, hosts, cfg, intra=intra)
        got = over_one(intra)
        for r, g in zip(ref, got, strict=True):
            assert np.array_equal(r.out, g.out)
            assert (r.inter_bytes, r.intra_bytes) == (g.inter_bytes, g.intra_bytes)
    with pytest.raises(UsageError, match="different numbers"):
        run_inproc(3, lambda t: allreduce_hosts(t, ["a", "a", "b"], xs[t.rank], cfg))


class _Recording:
    """A transport that records the size of every message it carries."""

    def __init__(self, t: Transport, sizes: list[int]) -> None:
        self.t, self.sizes = t, sizes

    rank = property(lambda self: self.t.rank)
    world_size = property(lambda self: self.t.world_size)

    def send(self, dst: int, tag: int, data: bytes | memoryview) -> None:
        self.sizes.append(len(data))
        self.t.send(dst, tag, data)

    def recv(self, src: int, tag: int) -> bytes:
        return self.t.recv(src, tag)

    def flush(self) -> None:
        self.t.flush()


@pytest.mark.parametrize("intra", ["none", "eden-unbiased"])
def test_hier_messages_are_segments_no_larger_than_the_rings(intra: str) -> None:
    """A buffer longer than one segment goes to and from the leader segment by segment, so a transport
    with slots sized for the ring (MRC ranks: max_message_bytes of a one-rank ring) carries it."""
    d = frame.MAX_SEGMENT + 4099
    xs = make_inputs(4, d, "iid", 1, 0)
    sizes: list[list[int]] = [[] for _ in range(4)]
    cfg = Config("eden-unbiased", 2, "aware")
    res = run_inproc(4, lambda t: allreduce_hosts(_Recording(t, sizes[t.rank]), ["a", "a", "b", "b"],
                                                  xs[t.rank], cfg, intra=intra))
    segs = len(frame.segments(d))
    assert segs > 1
    assert all(np.array_equal(r.out, res[0].out) for r in res)
    assert max(max(s) for s in sizes) <= max_message_bytes(d, 1)
    assert len(sizes[1]) == len(sizes[3]) == segs  # a non-leader uploads one message per segment
    assert res[1].messages == segs and res[0].messages >= segs + 2  # the leader: its ring and broadcast
    if intra == "none":
        assert res[0].intra_bytes == res[1].intra_bytes == 4 * d


def test_sub_transport_maps_ranks_and_refuses_outsiders() -> None:
    def body(t: Transport) -> bytes | None:
        if t.rank not in (1, 3):
            with pytest.raises(ValueError, match="not among"):
                SubTransport(t, [1, 3])
            return None
        sub = SubTransport(t, [3, 1])  # rank 3 is rank 0 here
        assert sub.world_size == 2 and sub.rank == (0 if t.rank == 3 else 1)
        with pytest.raises(TransportError, match="bad peer"):
            sub.send(sub.rank, 0, b"x")
        if sub.rank == 0:
            sub.send(1, 7, b"from 3")
            return None
        return sub.recv(0, 7)

    assert run_inproc(4, body)[1] == b"from 3"
    with pytest.raises(ValueError, match="distinct"):
        run_inproc(2, lambda t: SubTransport(t, [0, 0]))


def test_hier_writes_into_the_callers_buffers() -> None:
    """`out` and `work` (MRC ranks keep them across iterations): the same result, in `out`; buffers that
    overlap the input or each other are refused."""
    xs = make_inputs(4, 5000, "iid", 3, 0)
    cfg = Config("eden-unbiased", 4, "aware", seed=2)
    names = ["a", "a", "b", "b"]
    plain = run_inproc(4, lambda t: allreduce_hosts(t, names, xs[t.rank], cfg))
    outs = [np.full(5000, np.nan, np.float32) for _ in range(4)]
    works = [np.full(5000, np.nan, np.float32) for _ in range(4)]
    kept = run_inproc(4, lambda t: allreduce_hosts(t, names, xs[t.rank], cfg, out=outs[t.rank],
                                                   work=works[t.rank]))
    for r, p, k in zip(range(4), plain, kept, strict=True):
        assert k.out is outs[r] and np.array_equal(k.out, p.out)
    def with_buffers(out: np.ndarray, work: np.ndarray | None) -> list[HierResult]:
        return run_inproc(2, lambda t: allreduce_hosts(t, ["a", "a"], xs[0], cfg, out=out, work=work))

    for out, work in ((xs[0], None), (outs[0], outs[0]), (np.zeros(4999, np.float32), None)):
        with pytest.raises(UsageError):
            with_buffers(out, work)
