"""Secure noise (mechanisms/secure_noise.py): exact laws, agreement with OpenDP, exact lattice outputs, and the
low-order-bit distinguishing test of issue 12 (Mironov 2012) that the float sampler fails."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from ldpfl import mechanisms as mech
from ldpfl.mechanisms import secure_noise as sn

P_REJECT = 1e-6  # chi-square tests reject at this p-value (fixed seeds; OpenDP's side is unseeded)


# --------------------------------------------------------------------------------------------------
# Exact pmfs and a chi-square goodness-of-fit test with pooled tails.


def discrete_gaussian_pmf(sigma: float, k: np.ndarray) -> np.ndarray:
    half = math.ceil(40 * sigma) + 2
    support = np.arange(-half, half + 1, dtype=np.float64)
    norm = np.exp(-(support**2) / (2 * sigma**2)).sum()
    return np.exp(-(np.asarray(k, dtype=np.float64) ** 2) / (2 * sigma**2)) / norm


def discrete_laplace_pmf(scale: float, k: np.ndarray) -> np.ndarray:
    return math.tanh(1.0 / (2.0 * scale)) * np.exp(-np.abs(np.asarray(k, dtype=np.float64)) / scale)


def chi_square_pvalue(samples: np.ndarray, pmf) -> float:
    """Goodness of fit of integer samples to ``pmf`` over bins with expected count ≥ 5 (tails pooled)."""
    n = samples.size
    k = np.arange(-100_000, 100_001)
    expected = pmf(k) * n
    inner = k[expected >= 5]
    low, high = int(inner.min()), int(inner.max())
    observed = np.bincount(np.clip(samples, low - 1, high + 1) - (low - 1), minlength=high - low + 3)
    exp_inner = pmf(np.arange(low, high + 1)) * n
    exp_low = pmf(np.arange(-100_000, low)).sum() * n
    exp_high = pmf(np.arange(high + 1, 100_001)).sum() * n
    expected = np.concatenate([[exp_low], exp_inner, [exp_high]])
    keep = expected > 0
    if not keep[0]:
        assert observed[0] == 0
    if not keep[-1]:
        assert observed[-1] == 0
    stat = float((((observed - expected) ** 2)[keep] / expected[keep]).sum())
    return float(stats.chi2.sf(stat, int(keep.sum()) - 1))


@pytest.mark.parametrize("sigma", [0.6, 3.0, 20.5])
def test_discrete_gaussian_matches_exact_pmf(sigma: float) -> None:
    z = sn.discrete_gaussian(sigma, 400_000, rng=np.random.default_rng(101))
    assert z.dtype == np.int64
    assert chi_square_pvalue(z, lambda k: discrete_gaussian_pmf(sigma, k)) > P_REJECT


@pytest.mark.parametrize("scale", [0.2, 3.0, 40.0])
def test_discrete_laplace_matches_exact_pmf(scale: float) -> None:
    z = sn.discrete_laplace(scale, 400_000, rng=np.random.default_rng(202))
    assert z.dtype == np.int64
    assert chi_square_pvalue(z, lambda k: discrete_laplace_pmf(scale, k)) > P_REJECT


def test_chi_square_has_power_against_near_misses() -> None:
    """The same test at the same size rejects what a careless sampler would produce: the rounded continuous
    Gaussian (for σ = 0.6 its mass at 0 is 0.594 instead of 0.6628) and a 3 % wrong scale."""
    rng = np.random.default_rng(303)
    rounded = np.rint(0.6 * rng.standard_normal(400_000)).astype(np.int64)
    assert chi_square_pvalue(rounded, lambda k: discrete_gaussian_pmf(0.6, k)) < P_REJECT
    wrong_scale = sn.discrete_laplace(3.09, 400_000, rng=rng)
    assert chi_square_pvalue(wrong_scale, lambda k: discrete_laplace_pmf(3.0, k)) < P_REJECT
    wrong_sigma = sn.discrete_gaussian(20.5 * 1.02, 400_000, rng=rng)
    assert chi_square_pvalue(wrong_sigma, lambda k: discrete_gaussian_pmf(20.5, k)) < P_REJECT


def test_large_sigma_moments() -> None:
    """σ = 4·10^8 grid units (gaussian-wu's σ on a 2^-20 grid): mean 0 and variance σ² within 5 SE."""
    sigma, n = 4e8, 200_000
    z = sn.discrete_gaussian(sigma, n, rng=np.random.default_rng(404)).astype(np.float64)
    assert abs(z.mean()) < 5 * sigma / math.sqrt(n)
    assert abs(z.var() / sigma**2 - 1.0) < 5 * math.sqrt(2.0 / n)


# --------------------------------------------------------------------------------------------------
# OpenDP as an independent reference (samples, not code).


def _opendp():
    dp = pytest.importorskip("opendp.prelude")
    dp.enable_features("contrib")
    return dp


def two_sample_pvalue(a: np.ndarray, b: np.ndarray) -> float:
    """Chi-square test of homogeneity between two integer samples, bins with ≥ 5 expected in both pooled."""
    low, high = int(min(a.min(), b.min())), int(max(a.max(), b.max()))
    ca = np.bincount(a - low, minlength=high - low + 1).astype(np.float64)
    cb = np.bincount(b - low, minlength=high - low + 1).astype(np.float64)
    total = ca + cb
    # Merge bins from both ends until every merged bin has ≥ 10 pooled counts.
    edges, acc_a, acc_b, acc_t = [], 0.0, 0.0, 0.0
    for i in range(total.size):
        acc_a += ca[i]
        acc_b += cb[i]
        acc_t += total[i]
        if acc_t >= 10:
            edges.append((acc_a, acc_b))
            acc_a = acc_b = acc_t = 0.0
    if acc_t and edges:
        last_a, last_b = edges.pop()
        edges.append((last_a + acc_a, last_b + acc_b))
    table = np.array(edges).T
    return float(stats.chi2_contingency(table)[1])


def test_discrete_gaussian_agrees_with_opendp() -> None:
    dp = _opendp()
    sigma, n = 3.5, 20_000
    meas = dp.m.make_gaussian(dp.vector_domain(dp.atom_domain(T="i64")), dp.l2_distance(T="i64"), scale=sigma)
    theirs = np.asarray(meas([0] * n), dtype=np.int64)
    ours = sn.discrete_gaussian(sigma, 100_000, rng=np.random.default_rng(505))
    assert two_sample_pvalue(ours, theirs) > P_REJECT
    assert chi_square_pvalue(theirs, lambda k: discrete_gaussian_pmf(sigma, k)) > P_REJECT  # both match the pmf


def test_discrete_laplace_agrees_with_opendp() -> None:
    dp = _opendp()
    scale, n = 2.5, 50_000
    meas = dp.m.make_laplace(dp.vector_domain(dp.atom_domain(T="i64")), dp.l1_distance(T="i64"), scale=scale)
    theirs = np.asarray(meas([0] * n), dtype=np.int64)
    ours = sn.discrete_laplace(scale, 100_000, rng=np.random.default_rng(606))
    assert two_sample_pvalue(ours, theirs) > P_REJECT
    assert chi_square_pvalue(theirs, lambda k: discrete_laplace_pmf(scale, k)) > P_REJECT


# --------------------------------------------------------------------------------------------------
# Randomized rounding, lattice outputs, reproducibility, validation.


def test_randomized_round_is_unbiased_and_adjacent() -> None:
    rng = np.random.default_rng(707)
    grid = 2.0**-3
    x = np.full(200_000, 0.3)  # 0.3/grid = 2.4: 2 with prob 0.6, 3 with prob 0.4
    k = sn.randomized_round(x, grid, rng=rng)
    assert k.dtype == np.int64
    assert set(np.unique(k).tolist()) == {2, 3}
    p_up = float((k == 3).mean())
    assert abs(p_up - 0.4) < 5 * math.sqrt(0.24 / k.size)
    # Values already on the grid are kept exactly; float32 input is widened exactly.
    on_grid = np.array([-4.0, -0.125, 0.0, 0.375, 3.875], dtype=np.float32)
    assert np.array_equal(sn.randomized_round(on_grid, grid, rng=rng), (on_grid.astype(np.float64) / grid))


def test_mechanism_outputs_are_exact_grid_multiples() -> None:
    rng = np.random.default_rng(808)
    grid = 2.0**-20
    x = rng.uniform(-4, 4, size=(50, 40))
    for y in (sn.add_discrete_gaussian(x, 38.76, grid, rng=rng), sn.add_discrete_laplace(x, 5.0, grid, rng=rng)):
        assert y.dtype == np.float64
        k = y / grid
        assert np.array_equal(k, np.floor(k))
        assert np.array_equal(k.astype(np.int64).astype(np.float64) * grid, y)


def test_same_seed_same_noise_different_seed_different() -> None:
    a = sn.discrete_gaussian(7.0, 1000, rng=np.random.default_rng(1))
    b = sn.discrete_gaussian(7.0, 1000, rng=np.random.default_rng(1))
    c = sn.discrete_gaussian(7.0, 1000, rng=np.random.default_rng(2))
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert sn.discrete_laplace(2.0, (3, 4), rng=np.random.default_rng(1)).shape == (3, 4)
    assert sn.discrete_gaussian(2.0, 0, rng=np.random.default_rng(1)).shape == (0,)


def test_refusals_name_the_parameter() -> None:
    rng = np.random.default_rng(0)
    for bad in (0.3, 0.0, -0.5, math.inf, 3.0, 2.0**-1010):
        with pytest.raises(ValueError, match="grid"):
            sn.randomized_round(np.zeros(3), bad, rng=rng)
    with pytest.raises(ValueError, match=r"x/grid must stay within"):
        sn.randomized_round(np.array([1.0]), 2.0**-53, rng=rng)
    with pytest.raises(ValueError, match="finite"):
        sn.randomized_round(np.array([np.nan]), 1.0, rng=rng)
    for bad in (0.0, -1.0, math.nan, 2.0**45):
        with pytest.raises(ValueError, match="sigma"):
            sn.discrete_gaussian(bad, 3, rng=rng)
    for bad in (2.0**-6, 2.0**45):
        with pytest.raises(ValueError, match="scale"):
            sn.discrete_laplace(bad, 3, rng=rng)
    with pytest.raises(ValueError, match="size"):
        sn.discrete_laplace(1.0, -1, rng=rng)
    with pytest.raises(ValueError, match=r"2\*\*53"):
        sn.lattice_values(np.array([2**53 + 1], dtype=np.int64), 1.0)
    with pytest.raises(TypeError, match="Generator"):
        sn.discrete_gaussian(1.0, 3, rng=np.random.RandomState(0))


# --------------------------------------------------------------------------------------------------
# The distinguishing test (issue 12, Done-when 1).


def low_bit_event(y: np.ndarray, a: float, grid: float | None = None) -> np.ndarray:
    """Mironov's event: |y| < a/2 and y off the ulp(a/2) grid (in y's own float type); with ``grid``, also
    the more general "y is not a multiple of the grid"."""
    half = np.asarray(a / 2, dtype=y.dtype)
    ulp = np.spacing(half)
    off_ulp = (np.abs(y) < half) & (np.mod(y, ulp) != 0)
    if grid is None:
        return off_ulp
    return off_ulp | (np.mod(y.astype(np.float64), grid) != 0)


def float_gaussian(x: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """The old sampler of mechanisms/real.py: x + σ·N(0, 1) in x's float type."""
    noise = rng.standard_normal(x.shape, dtype=x.dtype)
    noise *= x.dtype.type(sigma)
    return x + noise


# The additive-noise mechanisms with the settings the issue audited: (name, params, a).
ADDITIVE = [
    ("gaussian", {"epsilon": 1.0, "delta": 1e-5, "clip": 4.0}, 4.0),
    ("gaussian-wu", {}, 2.0),
    ("fedaw-gaussian", {"epsilon": 1.0, "delta": 1e-5, "sensitivity": 2.0}, 1.0),
]
N_DRAWS = 1_000_000


@pytest.mark.parametrize(("name", "params", "a"), ADDITIVE, ids=[a[0] for a in ADDITIVE])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_no_low_bit_event_above_delta(name: str, params: dict, a: float, dtype) -> None:
    """≥ 10^6 outputs of the mechanism for the neighbouring inputs 0 and a: the low-bit event (and, in float64,
    "y is not a multiple of the mechanism's grid") has frequency ≤ δ for both."""
    m = mech.create_mechanism(name, dim=1, **params)
    rng = np.random.default_rng(909)
    for value in (0.0, a):
        y = m.randomize(np.full((N_DRAWS, 1), value, dtype=dtype), rng=rng)
        assert y.dtype == dtype
        rate = float(low_bit_event(y, a, m.grid if dtype == np.float64 else None).mean())
        assert rate <= m.delta, (name, value, rate)


@pytest.mark.parametrize(("name", "params", "a"), ADDITIVE, ids=[a[0] for a in ADDITIVE])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_float_sampler_fails_the_same_check(name: str, params: dict, a: float, dtype) -> None:
    """The same check on ``x + sigma * rng.standard_normal(...)``: input 0 hits the event far above δ while
    input a never does, so the float mechanism is not (ε, δ)-DP for any ε."""
    m = mech.create_mechanism(name, dim=1, **params)
    rng = np.random.default_rng(909)
    rates = {}
    for value in (0.0, a):
        x = m.preprocess(np.full((N_DRAWS, 1), value, dtype=dtype))
        rates[value] = float(low_bit_event(float_gaussian(x, m.sigma, rng), a).mean())
    assert rates[a] == 0.0
    assert rates[0.0] > m.delta


def test_discrete_laplace_has_no_low_bit_event() -> None:
    """The same check for the discrete Laplace on a grid (the sampler the private-features Laplace uses)."""
    rng = np.random.default_rng(910)
    grid, a = 2.0**-12, 1.0
    for value in (0.0, a):
        y = sn.add_discrete_laplace(np.full(N_DRAWS, value), 2.0, grid, rng=rng)
        assert float(low_bit_event(y, a, grid).mean()) == 0.0
