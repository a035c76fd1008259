"""Low-dimensional LDP mechanisms (issue 17): krr, oue-label, duchi, piecewise, hybrid, laplace.

This file: formulas by hand, exact ε from the sampled integers, seeds, shapes, validation and the CLI for
all six. Sampling of each family: test_ldp_mechanisms_categorical.py (krr, oue-label) and
test_ldp_mechanisms_bounded.py (duchi, piecewise, hybrid, laplace). Tolerances: tests/ldp_stats.py.
"""

from __future__ import annotations

import itertools
import json
import math
import re

import numpy as np
import pytest
from click.testing import CliRunner
from ldp_stats import LDP_NAMES

from ldpfl import mechanisms as mech
from ldpfl.cli import cli
from ldpfl.mechanisms import calibration_ldp as cal
from ldpfl.mechanisms.calibration_ldp import THRESHOLD_SCALE

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
    # The exact law's figures (pure, δ 0), like the Gaussian reports; the sampler's TV residue is in a note.
    assert report.exact_delta == 0.0
    assert m.sampled_delta(2.0) == pytest.approx((1.0 + math.exp(2.0)) * 5 * 2.0**-47, rel=1e-15)
    assert any("2^-47" in note and f"{m.sampled_delta(2.0):.3g}" in note for note in report.notes)


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
