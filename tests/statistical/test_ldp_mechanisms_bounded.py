"""Sampling of the bounded-vector LDP mechanisms (issue 17): duchi, piecewise, hybrid and laplace.

Unbiasedness and closed-form variances, output grids, k-of-d sampling and endpoint probability ratios, with
tolerances of K_SE standard errors (tests/ldp_stats.py) and fixed seeds.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from ldp_stats import DRAWS, K_SE, assert_unbiased, assert_variance, binomial_se, log_ratio_with_se

from ldpfl import mechanisms as mech
from ldpfl.mechanisms import calibration_ldp as cal

# --------------------------------------------------------------------------------------------------
# duchi.


@pytest.mark.parametrize("d", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_duchi_is_unbiased_with_outputs_plus_minus_b(d: int, eps: float) -> None:
    m = mech.create_mechanism("duchi", epsilon=eps, dim=d)
    x = np.linspace(-1.0, 1.0, d) if d > 1 else np.array([0.3])
    y = m.randomize(np.tile(x, (DRAWS, 1)), rng=mech.default_rng(20 + d))
    b = m.output_bound
    assert set(np.unique(np.abs(y))) == {b}
    assert b == pytest.approx(cal.duchi_1d_bound(eps) * cal.duchi_c_d(d), rel=1e-15)
    variance = m.expected_variance(x)
    np.testing.assert_allclose(variance, b**2 - x**2)  # outputs are ±B with mean x: Var = B² - x²
    assert_unbiased(y, x, variance)
    assert_variance(y, variance)


@pytest.mark.parametrize("d", [3, 4])
def test_duchi_output_law_at_a_vertex(d: int) -> None:
    """x = v = (1, ..., 1): P(z) = π/N on {z·v > 0}, (1-π)/N on {z·v < 0}, 1/N on ties, N = |T+|."""
    m = mech.create_mechanism("duchi", epsilon=1.0, dim=d)
    y = m.randomize(np.ones((DRAWS, d)), rng=mech.default_rng(30 + d))
    signs = (y > 0).astype(np.int64)
    code = signs @ (1 << np.arange(d))
    counts = np.bincount(code, minlength=2**d)
    pi = 1.0 - m.flip_threshold / 2.0**64
    n_half = 2 ** (d - 1) + (math.comb(d, d // 2) // 2 if d % 2 == 0 else 0)
    for index, tuple_bits in enumerate(itertools.product((0, 1), repeat=d)):
        z = 2 * np.array(tuple_bits[::-1]) - 1  # bit j of the code is coordinate j
        assert index == int(np.dot((z > 0), 1 << np.arange(d)))
        dot = int(z.sum())
        p = (pi if dot > 0 else (1 - pi) if dot < 0 else 1.0) / n_half
        assert abs(counts[index] / DRAWS - p) <= K_SE * binomial_se(p, DRAWS), (z, counts[index] / DRAWS, p)


def test_duchi_endpoint_ratio() -> None:
    """P(z = (B, B, B) | x = (1,1,1)) / P(z = (B, B, B) | x = -(1,1,1)) = π/(1-π) = e^ε."""
    m = mech.create_mechanism("duchi", epsilon=1.5, dim=3)
    up = m.randomize(np.ones((DRAWS, 3)), rng=mech.default_rng(40))
    down = m.randomize(-np.ones((DRAWS, 3)), rng=mech.default_rng(41))
    ratio, se = log_ratio_with_se(int(np.all(up > 0, axis=1).sum()), int(np.all(down > 0, axis=1).sum()), DRAWS)
    assert abs(ratio - m.report().exact_epsilon_per_record) <= K_SE * se


# --------------------------------------------------------------------------------------------------
# piecewise and hybrid.


@pytest.mark.parametrize("name", ["piecewise", "hybrid"])
@pytest.mark.parametrize("eps", [0.5, 2.0, 4.0])
def test_one_value_is_unbiased_with_the_closed_form_variance(name: str, eps: float) -> None:
    m = mech.create_mechanism(name, epsilon=eps, dim=1)
    assert m.k == 1 and m.scale == 1.0
    for j, x in enumerate((-1.0, -0.37, 0.0, 0.5, 1.0)):
        y = m.randomize(np.full((DRAWS, 1), x), rng=mech.default_rng(50 + j))
        variance = m.expected_variance(np.array([x]))
        assert_unbiased(y, np.array([x]), variance)
        assert_variance(y, variance)
    # The closed form is the paper's (WXY19 Lemma 1 for PM, III-C for HM) up to the grid.
    t = np.linspace(-1, 1, 5)
    paper = cal.piecewise_variance(t, eps) if name == "piecewise" else cal.hybrid_variance(t, eps)
    np.testing.assert_allclose(m.expected_variance(t), paper, rtol=2e-3)


@pytest.mark.parametrize(("name", "eps", "k"), [("piecewise", 5.0, 2), ("hybrid", 10.0, 4)])
def test_k_of_d_sampling_is_unbiased(name: str, eps: float, k: int) -> None:
    m = mech.create_mechanism(name, epsilon=eps, dim=10)
    assert m.k == k and m.scale == 10 / k
    x = np.linspace(-1.0, 1.0, 10)
    y = m.randomize(np.tile(x, (DRAWS, 1)), rng=mech.default_rng(60))
    nonzero = np.count_nonzero(y, axis=1)
    assert nonzero.max() == k and np.mean(nonzero == k) > 0.999  # a sampled value is 0 only if it draws 0
    # Every coordinate is reported by a share k/d of the records (binomial).
    share = np.count_nonzero(y, axis=0) / DRAWS
    assert np.all(np.abs(share - k / 10) <= K_SE * binomial_se(k / 10, DRAWS) + 1e-3)
    variance = m.expected_variance(x)
    np.testing.assert_allclose(variance, cal.sampled_variance(m.value_variance(x), x, 10, k))
    assert_unbiased(y, x, variance)
    assert_variance(y, variance)


@pytest.mark.parametrize(("d", "k"), [(10, 3), (200, 100)])  # Floyd's algorithm; a shuffle per row
def test_sample_dimensions_draws_distinct_uniform_dimensions(d: int, k: int) -> None:
    from ldpfl.mechanisms.ldp_common import sample_dimensions

    rows = 20_000 if k < 50 else 2_000
    index = sample_dimensions(rows, d, k, mech.default_rng(74))
    assert index.shape == (rows, k) and index.min() >= 0 and index.max() < d
    assert np.all(np.diff(np.sort(index, axis=1), axis=1) > 0)  # distinct within a row
    share = np.bincount(index.ravel(), minlength=d) / rows  # each dimension with probability k/d
    assert np.all(np.abs(share - k / d) <= K_SE * binomial_se(k / d, rows))


@pytest.mark.parametrize("x", [-1.0, -0.5, 0.25, 1.0])
def test_piecewise_point_probabilities_on_a_small_grid(x: float) -> None:
    """b = 3 (n = 8), inputs on the grid (no rounding noise): every output point j has probability p_high
    inside the window {i-h, ..., i+h} and p_low outside it, within binomial standard errors."""
    m = mech.create_mechanism("piecewise", epsilon=1.0, dim=1, grid_bits=3)
    g = m.grid
    i = round(x * g.n)
    j = np.rint(m.randomize(np.full((DRAWS, 1), x), rng=mech.default_rng(73)).ravel() / m.output_step)
    points = np.arange(-g.half_range, g.half_range + 1)
    freq = np.array([(j == p).sum() for p in points]) / DRAWS
    expected = np.where(np.abs(points - i) <= g.half_window, g.p_high, g.p_low)
    assert expected.sum() == pytest.approx(1.0, rel=1e-12)
    se = np.sqrt(expected * (1 - expected) / DRAWS)
    assert np.all(np.abs(freq - expected) <= K_SE * se), (freq, expected)


def test_piecewise_outputs_lie_on_the_grid() -> None:
    m = mech.create_mechanism("piecewise", epsilon=5.0, dim=10)
    x = mech.default_rng(70).uniform(-1.5, 1.5, size=(20_000, 10)).astype(np.float32)
    y = m.randomize(x.astype(np.float64), rng=mech.default_rng(71))
    assert y.dtype == np.float64
    j = np.rint(y / m.output_step)
    np.testing.assert_array_equal(j * m.output_step, y)  # y = j·step exactly, for integers j
    assert np.abs(j).max() <= m.grid.half_range
    y32 = m.randomize(x, rng=mech.default_rng(71))
    np.testing.assert_array_equal(y32, y.astype(np.float32))  # float32: the same integers, cast


def test_hybrid_outputs_are_grid_points_or_plus_minus_b() -> None:
    m = mech.create_mechanism("hybrid", epsilon=2.0, dim=1)
    y = m.randomize(np.full((DRAWS, 1), 0.25), rng=mech.default_rng(72)).ravel()
    b = m.duchi_bound
    duchi = np.abs(y) == b
    assert abs(duchi.mean() - (1 - m.alpha)) <= K_SE * binomial_se(1 - m.alpha, DRAWS)
    pm = y[~duchi]
    np.testing.assert_array_equal(np.rint(pm / m.grid.step) * m.grid.step, pm)


def test_piecewise_endpoint_ratios() -> None:
    """x = 1 vs x = -1: the window of i = n holds points of probability p_high for x = 1 and p_low for
    x = -1, a ratio of exactly e^ε; binned output frequencies never exceed e^ε (within SE)."""
    m = mech.create_mechanism("piecewise", epsilon=1.0, dim=1, grid_bits=6)
    g = m.grid
    up = np.rint(m.randomize(np.ones((DRAWS, 1)), rng=mech.default_rng(80)).ravel() / m.output_step)
    down = np.rint(m.randomize(-np.ones((DRAWS, 1)), rng=mech.default_rng(81)).ravel() / m.output_step)
    window = (g.n - g.half_window, g.n + g.half_window)
    in_up = int(((up >= window[0]) & (up <= window[1])).sum())
    in_down = int(((down >= window[0]) & (down <= window[1])).sum())
    ratio, se = log_ratio_with_se(in_up, in_down, DRAWS)
    exact = m.report().exact_epsilon_per_record
    assert abs(ratio - exact) <= K_SE * se
    edges = np.linspace(-g.half_range, g.half_range + 1, 12)
    h_up, _ = np.histogram(up, edges)
    h_down, _ = np.histogram(down, edges)
    for a, b in zip(h_up, h_down, strict=True):
        r, s = log_ratio_with_se(int(a), int(b), DRAWS)
        assert abs(r) <= exact + K_SE * s


# --------------------------------------------------------------------------------------------------
# laplace.


def test_laplace_is_unbiased_on_the_grid_with_the_closed_form_variance() -> None:
    m = mech.create_mechanism("laplace", epsilon=2.0, dim=4, clip=1.0, grid_bits=8)
    x = np.array([-1.0, -0.123456789, 0.5, 1.0])
    y = m.randomize(np.tile(x, (DRAWS, 1)), rng=mech.default_rng(90))
    steps = y * 2.0**8
    np.testing.assert_array_equal(steps, np.rint(steps))  # exact multiples of g = 2^-8
    variance = m.expected_variance(x)
    assert variance[0] == pytest.approx(2.0**-16 * cal.discrete_laplace_variance(m.scale), rel=1e-15)
    assert_unbiased(y, x, variance)
    assert_variance(y, variance)


def test_laplace_clips_before_the_noise() -> None:
    m = mech.create_mechanism("laplace", epsilon=1.0, dim=3, clip=2.0)
    wild = np.array([[-100.0, 100.0, 1.5]])
    clipped = np.array([[-2.0, 2.0, 1.5]])
    np.testing.assert_array_equal(m.randomize(wild, rng=mech.default_rng(5)),
                                  m.randomize(clipped, rng=mech.default_rng(5)))


def test_laplace_endpoint_ratio() -> None:
    """d = 1, c = 1, g = 1: inputs ±1 are the integers ±1; P(out = 1 | 1)/P(out = 1 | -1) = e^(2/t) = e^ε."""
    m = mech.create_mechanism("laplace", epsilon=1.0, dim=1, clip=1.0, grid_bits=0)
    assert m.scale == pytest.approx(2.0)
    up = m.randomize(np.ones((DRAWS, 1)), rng=mech.default_rng(91)).ravel()
    down = m.randomize(-np.ones((DRAWS, 1)), rng=mech.default_rng(92)).ravel()
    ratio, se = log_ratio_with_se(int((up == 1).sum()), int((down == 1).sum()), DRAWS)
    assert abs(ratio - m.report().exact_epsilon_per_record) <= K_SE * se
