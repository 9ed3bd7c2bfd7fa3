"""The measured claims (issue 3 acceptance), with tolerances from the trial counts.

Conventions: every check compares a mean over T independent trials (fixed seeds, so the test is
deterministic) with a value; the tolerance is Z standard errors of that mean, Z = 4.5 (a two-sided
Gaussian tail of 7e-6 per check — with ~40 checks here a false alarm would be < 3e-4 even if the seeds
were redrawn), and each test also asserts that its standard error is small, so a check cannot pass by
being uninformative. Asymptotic (D -> inf) theory is used at D >= 1024; its O(1/D) corrections are below
1e-3 relative, far inside the tolerances.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from mrc.quant import bench, codec
from mrc.quant.adaptive import gamma_ratio, rho_threshold
from mrc.quant.lloydmax import distortion
from mrc.quant.turboquant import qjl_block

Z = 4.5


def _vnmse(x: np.ndarray, scheme: str, bits: float, trials: int, rotations: int | str = "auto",
           seed0: int = 1000) -> tuple[float, float, list[float], list[int]]:
    errs, rots = [], []
    x64 = x.astype(np.float64)
    for t in range(trials):
        buf = codec.encode(x, scheme, bits, seed=seed0 + t, rotations=rotations)
        xh = codec.decode(buf).astype(np.float64)
        errs.append(float(np.sum((x64 - xh) ** 2) / np.sum(x64 * x64)))
        rots.append(codec.parse(buf).rotations)
    a = np.asarray(errs)
    se = float(a.std(ddof=1) / math.sqrt(trials)) if trials > 1 else math.nan
    return float(a.mean()), se, errs, rots


def _gauss(d: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(d).astype(np.float32)


# ---------------------------------------------------------------------------------- vNMSE vs theory

THEORY_CASES = [
    *[("eden-biased", b) for b in (0.5, 1, 2, 2.5, 3, 4)],
    *[("eden-unbiased", b) for b in (0.5, 1, 2, 2.5, 3, 4)],
    ("drive", 1),
    *[("turboquant-mse", b) for b in (1, 2, 3, 4)],
]


@pytest.mark.parametrize(("scheme", "bits"), THEORY_CASES)
def test_vnmse_matches_lloyd_max_theory(scheme: str, bits: float) -> None:
    """biased / TurboQuant_mse -> D_b, unbiased / DRIVE -> D_b / (1 - D_b): 40 vectors of D = 8192.
    One vector's vNMSE has a relative sd of ~1-3% here, so SE/theory < 1%."""
    th = bench.theory(scheme, bits)
    assert th is not None
    m, se, _, _ = _vnmse(_gauss(8192, 1), scheme, bits, 40)
    assert se < 0.01 * th
    assert abs(m - th) <= Z * se, (m, th, se)


@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_turboquant_prod_matches_qjl_theory(bits: int) -> None:
    """(b-1)-bit TurboQuant_mse residual r, ||r||^2 ~ D_{b-1} ||x||^2, plus a dense QJL sketch (D = 1024
    fits) with error (pi/2)(B - 2/pi)/B ||r||^2: vNMSE = (pi/2 - 1/B) D_{b-1}. 25 vectors; one
    vector's vNMSE has a relative sd of ~5-8% (the sketch), so SE/theory < 2.5%."""
    d = 1024
    assert qjl_block(d) == d  # fully dense here
    prev = distortion(bits - 1) if bits > 1 else 1.0
    th = (math.pi / 2 - 1 / d) * prev
    m, se, _, _ = _vnmse(_gauss(d, 2), "turboquant-prod", bits, 25)
    assert se < 0.025 * th
    assert abs(m - th) <= Z * se, (m, th, se)


# ------------------------------------------------------------------------------------- unbiasedness


@pytest.mark.parametrize(
    ("scheme", "bits", "dist", "trials"),
    [
        ("eden-unbiased", 2, "gauss", 2000),
        ("eden-unbiased", 2, "lognormal", 2000),
        ("eden-unbiased", 0.5, "gauss", 2000),
        ("eden-unbiased", 2.5, "lognormal", 2000),
        ("drive", 1, "lognormal", 2000),
        ("turboquant-prod", 2, "gauss", 600),
        ("turboquant-prod", 3, "lognormal", 600),
    ],
)
def test_mean_of_decodings_converges_to_x(scheme: str, bits: float, dist: str, trials: int) -> None:
    """With T independent seeds, mean error e_bar = mean(x_hat) - x has E||e_bar||^2 = E||e||^2 / T
    + ||bias||^2. R = T ||e_bar||^2 / mean||e||^2 is ~1 for an unbiased scheme, with sd ~sqrt(2/d)
    = 0.13 at d = 128 (the error is spread over all coordinates by the rotation); R < 1.8 is > 6 sd.
    A biased scheme with the same budget gives R in the hundreds (checked below as the control)."""
    d = 128
    x = bench.sample(dist, d, np.random.default_rng(3)).astype(np.float64)
    acc = np.zeros(d)
    sq = 0.0
    for t in range(trials):
        xh = codec.decode(codec.encode(x, scheme, bits, seed=5000 + t)).astype(np.float64)
        acc += xh
        sq += float(np.sum((xh - x) ** 2))
    r = trials * float(np.sum((acc / trials - x) ** 2)) / (sq / trials)
    assert r < 1.8, r


def test_biased_control_is_detected() -> None:
    d, trials = 128, 500
    x = bench.sample("gauss", d, np.random.default_rng(3)).astype(np.float64)
    acc = np.zeros(d)
    sq = 0.0
    for t in range(trials):
        xh = codec.decode(codec.encode(x, "eden-biased", 2, seed=5000 + t)).astype(np.float64)
        acc += xh
        sq += float(np.sum((xh - x) ** 2))
    # E[x_hat] ~ (1 - D_2) x: ||bias||^2 / E||e||^2 ~ D_2^2 / D_2 = 0.12, times T = 500 -> R ~ 60
    assert trials * float(np.sum((acc / trials - x) ** 2)) / (sq / trials) > 10


# ------------------------------------------------------------------------------- scheme comparisons


@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_eden_biased_never_worse_than_turboquant_mse(bits: int) -> None:
    """Same seed -> same rotation and the same indices; EDEN's S is the least-squares scale for them,
    TurboQuant_mse's is fixed, so EDEN-biased <= TurboQuant_mse vector by vector (exact, up to float
    round-off of 1e-6 relative)."""
    for t in range(20):
        x = _gauss(4096, 100 + t)
        _, _, e_eden, _ = _vnmse(x, "eden-biased", bits, 1, seed0=t)
        _, _, e_tq, _ = _vnmse(x, "turboquant-mse", bits, 1, seed0=t)
        assert e_eden[0] <= e_tq[0] * (1 + 1e-6)


def test_eden_biased_beats_turboquant_mse_at_small_d() -> None:
    """Where the fixed scale is off the optimum (small d), the gain is measurable: d = 64, 200 trials,
    paired differences (same seeds) so their SE is what matters."""
    x = _gauss(64, 7)
    _, _, e_eden, _ = _vnmse(x, "eden-biased", 2, 200, rotations=2)
    _, _, e_tq, _ = _vnmse(x, "turboquant-mse", 2, 200, rotations=2)
    diff = np.asarray(e_tq) - np.asarray(e_eden)
    assert np.all(diff >= -1e-7)
    assert diff.mean() > Z * diff.std(ddof=1) / math.sqrt(diff.size)


def test_two_bit_eden_unbiased_beats_three_bit_turboquant_prod() -> None:
    """Theory: D_2/(1 - D_2) = 0.133 vs (pi/2) D_2 = 0.184. Measured at D = 1024 (dense QJL sketch),
    25 vectors each; the gap must exceed Z combined standard errors."""
    x = _gauss(1024, 11)
    m_e, se_e, _, _ = _vnmse(x, "eden-unbiased", 2, 25)
    m_t, se_t, _, _ = _vnmse(x, "turboquant-prod", 3, 25)
    assert m_t - m_e > Z * math.hypot(se_e, se_t), (m_e, m_t)
    assert m_e < 0.75 * m_t


# ------------------------------------------------------------------------------------ rotation count


@pytest.mark.parametrize("dist", ["spike", "two-spikes"])
@pytest.mark.parametrize(("scheme", "bits"), [("eden-biased", 2), ("eden-unbiased", 1), ("eden-unbiased", 4)])
def test_sparse_inputs_need_two_rotations(dist: str, scheme: str, bits: int) -> None:
    """One RHT maps a spike to a flat vector (and two spikes to a two-level one): the coordinates are not
    Gaussian and the vNMSE is far from theory (the deterministic deviation is > 8%, see docs/quant.md).
    Two rotations match theory within Z SE (30 trials, SE/theory < 2%). `auto` picks 2 for two spikes;
    for one spike the flat vector is reproduced exactly by one rotation and EDEN's optimised scale
    (vNMSE 0 for every seed: no error, so no bias), and `auto` keeps that one rotation (issue 19)."""
    x = bench.sample(dist, 4096, np.random.default_rng(21))
    th = bench.theory(scheme, bits)
    assert th is not None
    m1, _, _, _ = _vnmse(x, scheme, bits, 10, rotations=1)
    assert abs(m1 - th) > 0.08 * th, (m1, th)
    m2, se2, _, _ = _vnmse(x, scheme, bits, 30, rotations=2)
    assert se2 < 0.02 * th
    assert abs(m2 - th) <= Z * se2, (m2, th, se2)
    ma, sea, _, rots = _vnmse(x, scheme, bits, 30, rotations="auto")
    if dist == "spike":
        assert m1 < 1e-10 and set(rots) == {1} and ma < 1e-10, (m1, rots, ma)
    else:
        assert set(rots) == {2}
        assert abs(ma - th) <= Z * sea


@pytest.mark.parametrize("d", [1024, 1 << 14, 1 << 16])
def test_auto_picks_one_rotation_on_gaussian_input(d: int) -> None:
    for seed in range(5):
        for scheme, bits in (("eden-unbiased", 2), ("eden-biased", 4), ("drive", 1), ("eden-unbiased", 0.5),
                             ("eden-unbiased", 8), ("eden-biased", 2.5)):
            buf = codec.encode(_gauss(d, seed), scheme, bits, seed=seed)
            h = codec.parse(buf)
            assert h.auto and h.rotations == 1


def test_auto_catches_lattice_inputs_after_one_rotation() -> None:
    """100 equal spikes: rho = 0.01 passes rule (a), but one rotation leaves a lattice that aliases with
    the 4-bit cells (+6.6% vNMSE at D = 2^18); rule (b) sees the realized error and rotates again."""
    d = 1 << 18
    x = np.zeros(d, np.float32)
    x[np.random.default_rng(100).choice(d, 100, replace=False)] = 1.0
    th = bench.theory("eden-biased", 4)
    assert th is not None
    m1, se1, _, _ = _vnmse(x, "eden-biased", 4, 4, rotations=1)
    assert m1 - th > 0.03 * th and m1 - th > Z * se1
    ma, sea, _, rots = _vnmse(x, "eden-biased", 4, 4, rotations="auto")
    assert set(rots) == {2}
    assert abs(ma - th) <= max(Z * sea, 0.01 * th)


def test_threshold_derivation_values() -> None:
    # gamma_b / D_b rises from ~3.5 (b = 1) to the high-resolution value 12; rho*_b = 0.12 / ratio
    ratios = [gamma_ratio(b) for b in range(1, 5)]
    assert ratios[0] == pytest.approx(3.504, abs=0.01)
    assert all(np.diff(ratios) > 0) and ratios[-1] < 12
    assert rho_threshold(1) == pytest.approx(0.0342, abs=5e-4)
    assert all(rho_threshold(b) > 0.0101 for b in range(1, 5))


# --------------------------------------------------------------------------------- mean estimation


def test_mean_estimation_unbiased_error_falls_as_one_over_n() -> None:
    """n clients with independent seeds: unbiased NMSE = vNMSE / n (the errors are independent). The
    biased scheme keeps a floor D_b^2 ||x_bar||^2 / mean||x_i||^2 (E[x_hat] ~ (1 - D_b) x), which for
    LogNormal inputs (||x_bar||^2 / mean||x_i||^2 ~ e^-1) dominates by n = 32."""
    rows = bench.run(["eden-unbiased", "eden-biased"], [2], dim=1024, trials=8, dist="lognormal",
                     clients=32, seed=4)
    unb, bia = rows
    th = bench.theory("eden-unbiased", 2)
    assert th is not None
    assert unb["mean_theory"] == pytest.approx(th / 32)
    assert unb["mean_nmse_stderr"] < 0.05 * unb["mean_theory"]
    assert abs(unb["mean_nmse"] - unb["mean_theory"]) <= Z * unb["mean_nmse_stderr"]
    gap = bia["mean_nmse"] - unb["mean_nmse"]
    assert gap > Z * math.hypot(bia["mean_nmse_stderr"], unb["mean_nmse_stderr"])
