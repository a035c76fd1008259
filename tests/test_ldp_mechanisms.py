"""Low-dimensional LDP mechanisms (issue 17): krr, oue-label, duchi, piecewise, hybrid, laplace.

Formulas by hand, exact ε from the sampled integers, empirical rates, unbiasedness and variance with
tolerances of K_SE standard errors (binomial or normal), endpoint probability ratios, grids, validation.
"""

from __future__ import annotations

import itertools
import json
import math
import re

import numpy as np
import pytest
from click.testing import CliRunner

import mechanisms as mech
from ldpfl.cli import cli
from mechanisms import calibration_ldp as cal
from mechanisms.calibration_ldp import THRESHOLD_SCALE

K_SE = 5.0
DRAWS = 200_000
LDP_NAMES = ("krr", "oue-label", "duchi", "piecewise", "hybrid", "laplace")


def binomial_se(p: float, n: int) -> float:
    return math.sqrt(p * (1.0 - p) / n)


def assert_unbiased(y: np.ndarray, x: np.ndarray, variance: np.ndarray) -> None:
    """Column means of y (n, d) within K_SE standard errors sqrt(Var/n) of the inputs x (d,)."""
    se = np.sqrt(np.asarray(variance) / y.shape[0])
    z = (y.mean(axis=0) - x) / se
    assert np.all(np.abs(z) <= K_SE), z


def assert_variance(y: np.ndarray, variance: np.ndarray) -> None:
    """Column sample variances within K_SE standard errors of the closed form; SE from the sample's own
    fourth central moment, sqrt((m4 - s^4)/n) (asymptotically normal)."""
    centred = y - y.mean(axis=0)
    s2 = (centred**2).mean(axis=0)
    m4 = (centred**4).mean(axis=0)
    se = np.sqrt(np.maximum(m4 - s2**2, 0.0) / y.shape[0])
    assert np.all(np.abs(s2 - variance) <= K_SE * se), (s2, variance, se)


def log_ratio_with_se(hits_a: int, hits_b: int, n: int) -> tuple[float, float]:
    """ln(p̂_a/p̂_b) for two binomial proportions over n draws each, and its delta-method SE."""
    pa, pb = hits_a / n, hits_b / n
    return math.log(pa / pb), math.sqrt((1 - pa) / (n * pa) + (1 - pb) / (n * pb))


# --------------------------------------------------------------------------------------------------
# Calibration by hand.


def test_quantize64_clamps_and_is_exact() -> None:
    assert cal.quantize64(0.5) == 1 << 63
    assert cal.quantize64(0.25) == 1 << 62
    assert cal.quantize64(0.0) == 1 and cal.quantize64(0.0, allow_zero=True) == 0
    assert cal.quantize64(1.0) == THRESHOLD_SCALE - 1
    assert abs(cal.quantize64(1 / 3) / THRESHOLD_SCALE - 1 / 3) <= 2.0**-64
    with pytest.raises(ValueError, match=r"probability must lie in \[0, 1\], got 1.5"):
        cal.quantize64(1.5)


def test_grr_and_oue_formulas_by_hand() -> None:
    """e^ε = 3, k = 3: p = 3/5, q = 1/5 (KOV14, WBLJ17 4.1); OUE q = 1/4, ε = ln(0.5·0.75/(0.5·0.25)) = ln 3."""
    eps = math.log(3.0)
    p, q = cal.grr_probabilities(eps, 3)
    assert p == pytest.approx(0.6, rel=1e-15) and q == pytest.approx(0.2, rel=1e-15)
    assert cal.grr_change_probability(eps, 3) == pytest.approx(0.4, rel=1e-15)
    assert cal.grr_epsilon(p, q) == pytest.approx(eps, rel=1e-15)
    assert cal.grr_variance(eps, 3, 100) == pytest.approx(100 * 4 / 4, rel=1e-15)  # n(e^ε+k-2)/(e^ε-1)^2
    p, q = cal.oue_label_probabilities(eps)
    assert (p, q) == (0.5, pytest.approx(0.25, rel=1e-15))
    assert cal.unary_epsilon(p, q) == pytest.approx(eps, rel=1e-15)
    assert cal.oue_variance(eps, 100) == pytest.approx(100 * 12 / 4, rel=1e-15)  # n·4e^ε/(e^ε-1)^2
    np.testing.assert_allclose(cal.frequency_estimate([30, 70], 100, 0.6, 0.2), [(30 - 20) / 0.4, (70 - 20) / 0.4])
    # Large budgets stay finite: no overflow, p -> 1.
    p, q = cal.grr_probabilities(500.0, 10)
    assert p == 1.0 and 0.0 < q < 1e-200


@pytest.mark.parametrize("d", range(1, 9))
def test_duchi_c_d_by_enumerating_the_half_cubes(d: int) -> None:
    """E[z | z uniform on T+(v)] = v / C_d, with T+ = {z in {-1,1}^d: z·v >= 0} (ties included for even d)."""
    cube = np.array(list(itertools.product((-1, 1), repeat=d)))
    v = np.ones(d)
    upper = cube[cube @ v >= 0]
    assert upper.shape[0] == 2 ** (d - 1) + (math.comb(d, d // 2) // 2 if d % 2 == 0 else 0)
    np.testing.assert_allclose(upper.mean(axis=0), v / cal.duchi_c_d(d), rtol=1e-12)
    # WXY19's even-d form, (2^(d-1) + binom(d, d/2)/2) / binom(d-1, d/2).
    if d % 2 == 0:
        assert cal.duchi_c_d(d) == pytest.approx((2 ** (d - 1) + math.comb(d, d // 2) / 2) / math.comb(d - 1, d // 2))


def test_duchi_c_d_large_d_uses_log_gamma_consistently() -> None:
    for d in (4095, 4096, 4097, 4098, 20_000, 20_001):
        m = (d - 1) // 2
        exact = (1 << (d - 1)) / math.comb(d - 1, m) + (1.0 if d % 2 == 0 else 0.0)
        assert cal.duchi_c_d(d) == pytest.approx(exact, rel=1e-9)
    # For odd d, C_d = 2^(d-1)/binom(d-1, (d-1)/2) grows as sqrt(pi (d-1) / 2); even d adds 1.
    assert cal.duchi_c_d(10**6 + 1) == pytest.approx(math.sqrt(math.pi * 10**6 / 2), rel=1e-5)
    assert cal.duchi_c_d(10**6) - cal.duchi_c_d(10**6 - 1) == pytest.approx(1.0, abs=2e-3)


def test_piecewise_and_hybrid_formulas_by_hand() -> None:
    """e^(ε/2) = 3: C = 2, l(t) = 1.5t - 0.5, P(window) = 3/4, Var = t²/2 + 6/12 (WXY19 Alg. 2, Lemma 1)."""
    eps = 2.0 * math.log(3.0)
    assert cal.piecewise_c(eps) == pytest.approx(2.0, rel=1e-15)
    left, right = cal.piecewise_interval(np.array([-1.0, 0.0, 1.0]), eps)
    np.testing.assert_allclose(left, [-2.0, -0.5, 1.0], atol=1e-15)
    np.testing.assert_allclose(right, [-1.0, 0.5, 2.0], atol=1e-15)
    assert cal.piecewise_window_probability(eps) == pytest.approx(0.75, rel=1e-15)
    np.testing.assert_allclose(cal.piecewise_variance(np.array([0.0, 1.0]), eps), [0.5, 1.0], rtol=1e-14)
    assert cal.HYBRID_EPSILON_STAR == pytest.approx(0.61, abs=0.005)
    assert cal.hybrid_alpha(0.5) == 0.0 and cal.hybrid_alpha(2.0) == pytest.approx(1 - math.exp(-1.0), rel=1e-15)
    assert cal.duchi_1d_bound(math.log(3.0)) == pytest.approx(2.0, rel=1e-15)
    np.testing.assert_allclose(cal.duchi_1d_minus_probability(np.array([-1.0, 0.0, 1.0]), math.log(3.0)),
                               [0.75, 0.5, 0.25], rtol=1e-15)
    np.testing.assert_allclose(cal.hybrid_variance(np.array([0.5]), 2.0),
                               (1 - math.exp(-1)) * cal.piecewise_variance(0.5, 2.0)
                               + math.exp(-1) * cal.duchi_1d_variance(0.5, 2.0), rtol=1e-14)


@pytest.mark.parametrize(("eps", "d", "k"), [(0.5, 10, 1), (2.4, 10, 1), (5.0, 10, 2), (7.6, 10, 3),
                                             (25.0, 10, 10), (100.0, 10, 10), (12.5, 3, 3)])
def test_sampled_dimensions_rule(eps: float, d: int, k: int) -> None:
    """k = max(1, min(d, floor(ε/2.5))) (WXY19 Algorithm 4)."""
    assert cal.sampled_dimensions(eps, d) == k


@pytest.mark.parametrize("eps", [0.1, 0.5, 1.0, 2.0, 5.0])
def test_piecewise_grid_variance_converges_to_lemma_1(eps: float) -> None:
    t = np.linspace(-1.0, 1.0, 9)
    grid = cal.piecewise_grid(eps, 16)
    np.testing.assert_allclose(grid.variance(t), cal.piecewise_variance(t, eps), rtol=1e-3)


# --------------------------------------------------------------------------------------------------
# Exact ε of every report.


@pytest.mark.parametrize("name", LDP_NAMES)
@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0, 5.0])
def test_exact_epsilon_is_the_nominal_one_up_to_quantization(name: str, eps: float) -> None:
    """k = 10 categories, d = 10 values: the 64-bit thresholds move ε by far less than 1e-9."""
    params = {"categories": 10} if name in ("krr", "oue-label") else {"dim": 10}
    report = mech.create_mechanism(name, epsilon=eps, **params).report()
    assert report.exact_epsilon_per_record == pytest.approx(eps, abs=1e-9)
    assert report.private and report.nominal_epsilon == eps


def test_krr_exact_epsilon_from_the_thresholds() -> None:
    m = mech.create_mechanism("krr", epsilon=1.3, categories=7)
    t = m.change_threshold
    assert abs(t - 6 / (math.exp(1.3) + 6) * 2.0**64) <= 2.0**12  # the formula, to float precision
    assert m.report().exact_epsilon_per_record == pytest.approx(math.log((2**64 - t) * 6 / t), rel=1e-15)


def test_quantization_that_raises_epsilon_is_reported() -> None:
    """k = 2, ε = 40: P(change) = e^-40/(1 + e^-40) ≈ 4.2e-18 rounds to T = 78/2^64, below the formula,
    so the sampled ratio is (2^64 - 78)/78 > e^40: the report says so."""
    m = mech.create_mechanism("krr", epsilon=40.0, categories=2)
    assert m.change_threshold == 78
    exact = m.report().exact_epsilon_per_record
    assert exact == pytest.approx(math.log((2**64 - 78) / 78), rel=1e-15)
    assert exact > 40.0
    # Far beyond what 64 bits resolve, the threshold stays >= 1: ε is capped near ln(2^64) = 44.4, finite.
    capped = mech.create_mechanism("krr", epsilon=100.0, categories=2).report().exact_epsilon_per_record
    assert capped == pytest.approx(math.log(2**64 - 1), rel=1e-15) and capped < 100.0


def test_oue_label_exact_epsilon_from_the_thresholds() -> None:
    m = mech.create_mechanism("oue-label", epsilon=2.0, categories=4)
    t_p, t_q = m.thresholds
    assert t_p == 2**63 and t_q == round(2.0**64 / (math.exp(2.0) + 1.0))
    report = m.report()
    assert report.exact_epsilon_per_record == pytest.approx(math.log((2**64 - t_q) / t_q), rel=1e-15)
    # Per bit: the worst single-bit ratio, max(ln(p/q), ln((1-q)/(1-p))).
    p, q = m.p, m.q
    assert report.exact_epsilon_per_coordinate == pytest.approx(max(math.log(p / q), math.log((1 - q) / (1 - p))))


def test_piecewise_exact_epsilon_from_the_grid() -> None:
    m = mech.create_mechanism("piecewise", epsilon=3.0, dim=1, grid_bits=8)
    g = m.grid
    n, w, t = g.n, g.window, g.outside_threshold
    assert n == 256 and g.half_window == round(256 * math.exp(-1.5))
    expected = math.log(2 * n * (2**64 - t) / (w * t))
    assert m.report().exact_epsilon_per_record == pytest.approx(expected, rel=1e-14)
    # k-of-d: per record = k x per value.
    sampled = mech.create_mechanism("piecewise", epsilon=7.5, dim=10)
    assert sampled.k == 3
    report = sampled.report()
    assert report.exact_epsilon_per_record == pytest.approx(3 * report.exact_epsilon_per_coordinate, rel=1e-15)
    assert report.exact_epsilon_per_coordinate == pytest.approx(2.5, abs=1e-9)


def test_hybrid_exact_epsilon_is_the_larger_branch() -> None:
    m = mech.create_mechanism("hybrid", epsilon=2.0, dim=1)
    assert m.alpha == pytest.approx(1 - math.exp(-1.0), rel=1e-15) and not m.branches_overlap
    assert m.report().exact_epsilon_per_record == max(m.grid.epsilon, m.duchi_epsilon)
    low, high = (int(v) for v in m._duchi_thresholds(np.array([1.0, -1.0])))
    assert m.duchi_epsilon == pytest.approx(max(math.log(high / low), math.log((2**64 - low) / (2**64 - high))))
    below = mech.create_mechanism("hybrid", epsilon=0.5, dim=1)
    assert below.alpha_threshold == 0
    assert below.report().exact_epsilon_per_record == below.duchi_epsilon


def test_duchi_exact_epsilon_from_the_threshold() -> None:
    m = mech.create_mechanism("duchi", epsilon=1.5, dim=6)
    t = m.flip_threshold
    assert t == round(2.0**64 / (math.exp(1.5) + 1.0))
    assert m.report().exact_epsilon_per_record == pytest.approx(math.log((2**64 - t) / t), rel=1e-15)


def test_laplace_exact_epsilon_from_the_grid_sensitivity() -> None:
    """c = 0.3 on g = 1/4: rounded values lie in [-2, 2] (4 steps, not 2c/g = 2.4), per record 4d."""
    m = mech.create_mechanism("laplace", epsilon=2.0, dim=5, clip=0.3, grid_bits=2)
    assert m.value_sensitivity == 4 and m.record_sensitivity == 20 and m.scale == pytest.approx(10.0)
    report = m.report()
    assert report.exact_epsilon_per_record == pytest.approx(2.0, rel=1e-15)
    assert report.exact_epsilon_per_coordinate == pytest.approx(0.4, rel=1e-15)
    assert report.sensitivity == pytest.approx(5.0)  # 20 steps of 1/4
    assert 0.0 < report.exact_delta < 1e-13


# --------------------------------------------------------------------------------------------------
# krr.


def test_krr_keep_and_other_rates() -> None:
    m = mech.create_mechanism("krr", epsilon=1.0, categories=5)
    x = np.repeat(np.arange(5), DRAWS // 5 * 2)
    y = m.randomize_labels(x, rng=mech.default_rng(11))
    assert y.shape == x.shape and y.dtype == x.dtype
    for v in range(5):
        out = y[x == v]
        n = out.size
        counts = np.bincount(out, minlength=5)
        assert abs(counts[v] / n - m.p_keep) <= K_SE * binomial_se(m.p_keep, n)
        for other in set(range(5)) - {v}:  # uniform over the k - 1 other values
            assert abs(counts[other] / n - m.p_other) <= K_SE * binomial_se(m.p_other, n)


def test_krr_endpoint_ratio_is_e_to_the_epsilon() -> None:
    """P(y = 0 | x = 0) / P(y = 0 | x = 1) = e^ε within its standard error, and never above it."""
    m = mech.create_mechanism("krr", epsilon=2.0, categories=4)
    n = DRAWS
    y0 = m.randomize_labels(np.zeros(n, dtype=np.int64), rng=mech.default_rng(1))
    y1 = m.randomize_labels(np.ones(n, dtype=np.int64), rng=mech.default_rng(2))
    ratio, se = log_ratio_with_se(int((y0 == 0).sum()), int((y1 == 0).sum()), n)
    exact = m.report().exact_epsilon_per_record
    assert abs(ratio - exact) <= K_SE * se
    for out in range(4):  # every output's ratio is at most e^ε (within SE)
        r, s = log_ratio_with_se(int((y0 == out).sum()), int((y1 == out).sum()), n)
        assert abs(r) <= exact + K_SE * s


def test_krr_one_hot_matches_labels_and_estimator_is_unbiased() -> None:
    m = mech.create_mechanism("krr", epsilon=1.0, categories=6)
    labels = mech.default_rng(3).integers(0, 6, size=DRAWS)
    one_hot = np.eye(6, dtype=np.float32)[labels]
    y = m.randomize(one_hot, rng=mech.default_rng(4))
    assert y.shape == one_hot.shape and y.dtype == np.float32
    y_labels = m.randomize_labels(labels, rng=mech.default_rng(4))
    np.testing.assert_array_equal(y, np.eye(6, dtype=np.float32)[y_labels])
    # ĉ(v) = (C(v) - nq)/(p - q); Var C(v) = n_v p(1-p) + (n - n_v) q(1-q).
    true = np.bincount(labels, minlength=6)
    est = m.estimate_counts(y_labels)
    p, q = m.p_keep, m.p_other
    var = (true * p * (1 - p) + (DRAWS - true) * q * (1 - q)) / (p - q) ** 2
    assert np.all(np.abs(est - true) <= K_SE * np.sqrt(var))
    # debias maps each report to (y - q)/(p - q): summed over the reports it is the count estimate.
    np.testing.assert_allclose(m.debias(y).sum(axis=0), m.estimate_counts(y_labels), rtol=1e-9)


# --------------------------------------------------------------------------------------------------
# oue-label.


def test_oue_label_bit_rates() -> None:
    m = mech.create_mechanism("oue-label", epsilon=1.0, categories=8)
    labels = mech.default_rng(5).integers(0, 8, size=DRAWS)
    bits = m.randomize_labels(labels, rng=mech.default_rng(6))
    assert bits.shape == (DRAWS, 8) and bits.dtype == np.uint8 and set(np.unique(bits)) <= {0, 1}
    own = bits[np.arange(DRAWS), labels]
    assert abs(own.mean() - m.p) <= K_SE * binomial_se(m.p, own.size)
    others = bits[np.eye(8, dtype=bool)[labels] == 0]
    assert others.size == 7 * DRAWS
    assert abs(others.mean() - m.q) <= K_SE * binomial_se(m.q, others.size)
    # Each position alone, too.
    for v in range(8):
        col = bits[labels != v, v]
        assert abs(col.mean() - m.q) <= K_SE * binomial_se(m.q, col.size)


def test_oue_label_estimator_and_endpoint_ratio() -> None:
    m = mech.create_mechanism("oue-label", epsilon=2.0, categories=3)
    labels = mech.default_rng(7).integers(0, 3, size=DRAWS)
    bits = m.randomize(np.eye(3, dtype=np.uint8)[labels], rng=mech.default_rng(8))
    assert bits.dtype == np.uint8
    true = np.bincount(labels, minlength=3)
    p, q = m.p, m.q
    var = (true * p * (1 - p) + (DRAWS - true) * q * (1 - q)) / (p - q) ** 2
    assert np.all(np.abs(m.estimate_counts(bits) - true) <= K_SE * np.sqrt(var))
    # Worst output (1 at position 0, 0 at position 1) for inputs 0 and 1: ratio p(1-q)/((1-p)q) = e^ε.
    y0 = m.randomize_labels(np.zeros(DRAWS, dtype=np.int64), rng=mech.default_rng(9))
    y1 = m.randomize_labels(np.ones(DRAWS, dtype=np.int64), rng=mech.default_rng(10))
    hit0 = int(((y0[:, 0] == 1) & (y0[:, 1] == 0)).sum())
    hit1 = int(((y1[:, 0] == 1) & (y1[:, 1] == 0)).sum())
    ratio, se = log_ratio_with_se(hit0, hit1, DRAWS)
    assert abs(ratio - m.report().exact_epsilon_per_record) <= K_SE * se


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
    from mechanisms.ldp_common import sample_dimensions

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


# --------------------------------------------------------------------------------------------------
# Seeds, shapes, validation, CLI.


@pytest.mark.parametrize("name", LDP_NAMES)
def test_same_seed_same_output_different_seed_different_output(name: str, small_mechanism, sample_input) -> None:
    m = small_mechanism(name)
    x = sample_input(m, rows=64)
    first = m.randomize(x, rng=mech.default_rng(7))
    np.testing.assert_array_equal(first, m.randomize(x, rng=mech.default_rng(7)))
    assert not np.array_equal(first, m.randomize(x, rng=mech.default_rng(8)))


@pytest.mark.parametrize("name", LDP_NAMES)
def test_domains_and_declarations(name: str) -> None:
    cls = mech.mechanism_class(name)
    m = cls()
    if name in ("krr", "oue-label"):
        assert cls.DOMAIN == "category" and cls.RECORD_PARAMETER == "categories" and m.record_size() == 10
    else:
        assert cls.DOMAIN == "bounded" and cls.RECORD_PARAMETER == "dim" and m.record_size() == 10
    assert cls.FEATURE_FORMAT == mech.FLOAT32 and cls.FEDERATION is None
    assert name in mech.mechanism_names(cls.DOMAIN)
    assert name not in mech.mechanism_names("bits") and name not in mech.mechanism_names("real")


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("krr", {"categories": 1}, "categories (k) must be an integer in [2, 10000000], got 1"),
        ("oue-label", {"categories": 10**7 + 1}, "categories (k) must be an integer in [2, 10000000], got 10000001"),
        ("krr", {"categories": 2.5}, "categories (k) must be an integer in [2, 10000000], got 2.5"),
        ("duchi", {"dim": 0}, "dim (d) must be an integer in [1, 10000000], got 0"),
        ("piecewise", {"dim": 10**7 + 1}, "dim (d) must be an integer in [1, 10000000], got 10000001"),
        ("hybrid", {"epsilon": 501.0}, "epsilon must be at most 500, got 501.0"),
        ("duchi", {"epsilon": 1e-7}, "epsilon must be at least 1e-06 for duchi"),
        ("piecewise", {"grid_bits": 0}, "grid_bits (b) must be an integer in [1, 30], got 0"),
        ("hybrid", {"grid_bits": 31}, "grid_bits (b) must be an integer in [1, 30], got 31"),
        ("piecewise", {"sampled_dims": 0}, "sampled_dims (k, at most d = 10) must be an integer in [1, 10], got 0"),
        ("hybrid", {"dim": 3, "sampled_dims": 4},
         "sampled_dims (k, at most d = 3) must be an integer in [1, 3], got 4"),
        ("laplace", {"clip": 0.0}, "clip (c) must be a finite number > 0, got 0.0"),
        ("laplace", {"clip": math.nan}, "clip (c) must be a finite number > 0, got nan"),
        ("laplace", {"grid_bits": 41}, "grid_bits (b) must be an integer in [0, 40], got 41"),
        ("laplace", {"dim": 10**7, "epsilon": 1e-6, "grid_bits": 40}, "must lie in [2^-5, 2^44]"),
    ],
)
def test_bad_parameters_raise_value_error_quoting_the_value(name: str, params: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        mech.create_mechanism(name, **params)


@pytest.mark.parametrize(
    ("name", "x", "message"),
    [
        ("krr", np.zeros((2, 10)), "exactly one 1, found a row with 0"),
        ("krr", np.ones((2, 10)), "exactly one 1, found a row with 10"),
        ("oue-label", np.full((2, 10), 2.0), "only 0 and 1"),
        ("krr", np.eye(5), "k = 10 entries on the last axis, got shape (5, 5)"),
        ("oue-label", np.array(["a"] * 10), "expected one-hot rows"),
        ("duchi", np.zeros((3, 4)), "duchi takes rows of d = 10 values on the last axis, got shape (3, 4)"),
        ("laplace", np.full((1, 10), np.nan), "NaN or infinite"),
    ],
)
def test_bad_inputs_raise_value_error(name: str, x: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        mech.create_mechanism(name).randomize(x, rng=mech.default_rng(0))


@pytest.mark.parametrize("name", ["krr", "oue-label"])
def test_bad_labels(name: str) -> None:
    m = mech.create_mechanism(name, categories=3)
    with pytest.raises(ValueError, match=re.escape("labels must lie in [0, k) = [0, 3), found 3")):
        m.randomize_labels(np.array([0, 1, 3]), rng=mech.default_rng(0))
    with pytest.raises(ValueError, match="found -1"):
        m.randomize_labels(np.array([-1, 1]), rng=mech.default_rng(0))
    with pytest.raises(ValueError, match="labels must be an integer array, got dtype float64"):
        m.randomize_labels(np.array([0.0, 1.0]), rng=mech.default_rng(0))
    with pytest.raises(TypeError, match="numpy.random.Generator"):
        m.randomize_labels(np.array([0, 1]), rng=0)


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("krr", ["--epsilon", "2", "--categories", "10"]),
        ("oue-label", ["--epsilon", "0.5", "--categories", "4"]),
        ("duchi", ["--epsilon", "1", "--dim", "8"]),
        ("piecewise", ["--epsilon", "5", "--dim", "10", "--grid-bits", "12"]),
        ("hybrid", ["--epsilon", "10", "--dim", "10", "--sampled-dims", "2"]),
        ("laplace", ["--epsilon", "1", "--dim", "10", "--clip", "2", "--grid-bits", "10"]),
    ],
)
def test_cli_show(name: str, args: list[str]) -> None:
    result = CliRunner().invoke(cli, ["mechanisms", "show", name, *args, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["mechanism"] == name and report["exact_epsilon_per_record"] == pytest.approx(
        float(args[1]), abs=1e-9)
    text = CliRunner().invoke(cli, ["mechanisms", "show", name, *args])
    assert text.exit_code == 0 and "exact epsilon" in text.stdout


@pytest.mark.parametrize(
    "args",
    [["krr", "--categories", "1"], ["duchi", "--dim", "0"], ["piecewise", "--sampled-dims", "11"],
     ["laplace", "--clip", "-1"], ["hybrid", "--epsilon", "0"], ["krr", "--dim", "3"]],
)
def test_cli_bad_parameters_give_one_error_line(args: list[str]) -> None:
    result = CliRunner().invoke(cli, ["mechanisms", "show", *args])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), result.output


def test_listing_shows_every_new_mechanism_with_its_domain() -> None:
    rows = {row["name"]: row for row in json.loads(CliRunner().invoke(cli, ["mechanisms", "--json"]).stdout)}
    for name in LDP_NAMES:
        assert rows[name]["domain"] in ("category", "bounded") and rows[name]["parameters"]
