"""Real-valued mechanisms: Gaussian (classic, Wu eq. 4, DP-FedAW), ldpsign, PDPM, and their helpers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from ldpfl import mechanisms as mech
from ldpfl.mechanisms.calibration import gaussian_delta_for_epsilon

K_SE = 5.0  # tolerance in standard errors
DRAWS = 200_000


def binomial_se(p: float, n: int) -> float:
    return math.sqrt(p * (1.0 - p) / n)


# --------------------------------------------------------------------------------------------------
# Gaussian σ: golden values.


def test_classic_sigma_golden() -> None:
    """σ = Δ·√(2 ln(1.25/δ))/ε with Δ = 8, δ = 1e-5, ε = 1 (WU eq. 7 in the paper's non-IID setting)."""
    by_hand = 8.0 * math.sqrt(2.0 * math.log(1.25 / 1e-5)) / 1.0
    assert by_hand == pytest.approx(38.758442, rel=1e-7)
    assert mech.gaussian_sigma_classic(1.0, 1e-5, 8.0) == pytest.approx(by_hand, rel=1e-15)
    # The mechanisms that use it: gaussian (Δ = 2c = 8), ldpsign (Δ2 = 2c = 8), fedaw (S_f = 8).
    assert mech.create_mechanism("gaussian", epsilon=1.0, delta=1e-5, clip=4.0).sigma == pytest.approx(
        by_hand
    )
    assert mech.create_mechanism("ldpsign", epsilon=1.0, delta=1e-5, clip=4.0).sigma == pytest.approx(by_hand)
    assert mech.create_mechanism("fedaw-gaussian", epsilon=1.0, delta=1e-5, sensitivity=8.0).sigma == (
        pytest.approx(by_hand)
    )
    # σ scales as Δ/ε.
    assert mech.gaussian_sigma_classic(0.5, 1e-5, 2.0) == pytest.approx(by_hand / 2.0, rel=1e-15)


def test_gaussian_sensitivity_override() -> None:
    m = mech.create_mechanism("gaussian", epsilon=1.0, delta=1e-5, clip=4.0, sensitivity=1.0)
    assert m.sigma == pytest.approx(math.sqrt(2.0 * math.log(1.25e5)), rel=1e-15)


def test_wu_eq4_sigma_golden() -> None:
    """σ = √(4q²R/(1-q))·(2 ln(1/δ)/ε² + 1/ε) with q = 0.9, R = 20, δ = 1e-3, ε = 1."""
    by_hand = math.sqrt(4.0 * 0.9**2 * 20 / 0.1) * (2.0 * math.log(1000.0) + 1.0)
    assert by_hand == pytest.approx(377.14133, rel=1e-7)
    assert mech.gaussian_sigma_wu_eq4(1.0, 1e-3, 0.9, 20) == pytest.approx(by_hand, rel=1e-15)
    m = mech.create_mechanism("gaussian-wu", epsilon=1.0, delta=1e-3, sample_rate=0.9, rounds=20)
    assert m.sigma == pytest.approx(by_hand, rel=1e-15)
    assert m.report().sigma == pytest.approx(by_hand, rel=1e-15)


def test_wu_eq4_ignores_the_clip_but_the_exact_epsilon_does_not() -> None:
    narrow = mech.create_mechanism("gaussian-wu", clip=2.0)
    wide = mech.create_mechanism("gaussian-wu", clip=200.0)
    assert narrow.sigma == wide.sigma
    assert narrow.report().exact_epsilon_per_coordinate < wide.report().exact_epsilon_per_coordinate
    assert narrow.report().exact_epsilon_per_coordinate == pytest.approx(
        mech.gaussian_exact_epsilon(narrow.sigma, 4.0, 1e-3), rel=1e-12
    )


# --------------------------------------------------------------------------------------------------
# Gaussian: exact ε.


@pytest.mark.parametrize(
    ("sigma", "sensitivity", "delta"),
    [(1.0, 1.0, 1e-5), (38.758, 8.0, 1e-5), (0.3, 2.0, 1e-3), (5.0, 1.0, 1e-2)],
)
def test_exact_epsilon_round_trip(sigma: float, sensitivity: float, delta: float) -> None:
    eps = mech.gaussian_exact_epsilon(sigma, sensitivity, delta)
    assert eps > 0.0
    assert gaussian_delta_for_epsilon(eps, sigma, sensitivity) == pytest.approx(delta, rel=1e-6)
    # δ(ε) is decreasing: a smaller ε needs a larger δ.
    assert gaussian_delta_for_epsilon(0.9 * eps, sigma, sensitivity) > delta


def test_exact_epsilon_edges() -> None:
    assert mech.gaussian_exact_epsilon(1.0, 0.0, 1e-5) == 0.0
    assert mech.gaussian_exact_epsilon(0.0, 1.0, 1e-5) == math.inf
    # δ(0) = Φ(Δ/2σ) - Φ(-Δ/2σ) = 2Φ(1/2) - 1 ≈ 0.383 for Δ = σ: any larger δ is met at ε = 0.
    assert gaussian_delta_for_epsilon(0.0, 1.0, 1.0) == pytest.approx(
        2.0 * special.ndtr(0.5) - 1.0, rel=1e-12
    )
    assert mech.gaussian_exact_epsilon(1.0, 1.0, 0.5) == 0.0


@pytest.mark.parametrize("epsilon", [0.1, 0.5, 0.9, 0.99])
@pytest.mark.parametrize("delta", [1e-5, 1e-3])
def test_classic_sigma_is_conservative_below_one(epsilon: float, delta: float) -> None:
    sigma = mech.gaussian_sigma_classic(epsilon, delta, 1.0)
    assert mech.gaussian_exact_epsilon(sigma, 1.0, delta) <= epsilon


def test_gaussian_report_per_record_uses_l2_sensitivity() -> None:
    """The report is the discrete Gaussian's: CKS Theorem 7 per coordinate (2c/g grid steps), zCDP per record."""
    from ldpfl.mechanisms import discrete_privacy as dpriv

    m = mech.create_mechanism("gaussian", epsilon=0.5, delta=1e-5, clip=4.0, dim=16)
    report = m.report()
    g = m.grid
    assert g == 2.0 ** (math.floor(math.log2(m.sigma)) - 20)
    assert report.exact_epsilon_per_coordinate <= 0.5
    assert report.exact_epsilon_per_coordinate == pytest.approx(
        dpriv.discrete_gaussian_epsilon(m.sigma / g, int(8.0 / g), 1e-5), rel=1e-12
    )
    # At σ/g ≈ 2^20 the discrete curve equals the continuous one (Balle & Wang) to ~1e-9.
    assert report.exact_epsilon_per_coordinate == pytest.approx(
        mech.gaussian_exact_epsilon(m.sigma, 8.0, 1e-5), rel=1e-8
    )
    assert report.exact_epsilon_per_record == pytest.approx(
        dpriv.discrete_gaussian_record_epsilon(m.sigma / g, 8.0 * 4.0 / g, 1e-5), rel=1e-12
    )  # 2c·√16
    # zCDP is a valid bound, above the tight continuous figure for the same L2 sensitivity.
    assert report.exact_epsilon_per_record >= mech.gaussian_exact_epsilon(m.sigma, 32.0, 1e-5)
    assert report.sensitivity == 32.0
    assert report.probabilities["sampler"]["kind"] == "discrete-gaussian"
    assert mech.create_mechanism("gaussian").report().exact_epsilon_per_record is None


# --------------------------------------------------------------------------------------------------
# Gaussian: the noise itself.


@pytest.mark.parametrize(
    ("name", "params", "value"),
    [
        ("gaussian", {"epsilon": 2.0, "clip": 4.0}, 1.5),
        ("gaussian-wu", {"epsilon": 5.0, "clip": 2.0}, -0.5),
        ("fedaw-gaussian", {"epsilon": 1.0, "sensitivity": 2.0}, 0.001),
    ],
)
def test_gaussian_noise_has_the_reported_sigma(name: str, params: dict, value: float) -> None:
    m = mech.create_mechanism(name, **params)
    x = np.full((DRAWS // 400, 400), value, dtype=np.float32)  # inside every clip (L2 norm 0.02 for fedaw)
    y = m.randomize(x, rng=mech.default_rng(31))
    assert y.dtype == np.float32 and y.shape == x.shape
    noise = y.astype(np.float64) - x
    n = noise.size
    assert abs(noise.mean()) <= K_SE * m.sigma / math.sqrt(n)
    # Var(s²)/σ⁴ = 2/(n-1) for normal samples (chi-square with n-1 degrees of freedom).
    assert abs(noise.var(ddof=1) / m.sigma**2 - 1.0) <= K_SE * math.sqrt(2.0 / (n - 1))


def test_gaussian_clips_elementwise_before_noise() -> None:
    m = mech.create_mechanism("gaussian", epsilon=1.0, clip=4.0)
    x = np.array([[-100.0, 100.0, 3.0]])
    clipped = np.array([[-4.0, 4.0, 3.0]])
    np.testing.assert_array_equal(
        m.randomize(x, rng=mech.default_rng(2)), m.randomize(clipped, rng=mech.default_rng(2))
    )


# --------------------------------------------------------------------------------------------------
# DP-FedAW.


def test_fedaw_clips_the_l2_norm_to_half_the_sensitivity() -> None:
    m = mech.create_mechanism("fedaw-gaussian", sensitivity=2.0)
    direction = mech.default_rng(3).normal(size=(5, 50))
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    norms = np.array([0.25, 0.999, 1.0, 3.0, 1e4])
    x = direction * norms[:, None]
    clipped = m.preprocess(x)
    np.testing.assert_allclose(np.linalg.norm(clipped, axis=1), np.minimum(norms, 1.0), rtol=1e-12)
    np.testing.assert_allclose(clipped[:3], x[:3], rtol=1e-15)  # short records are untouched
    np.testing.assert_allclose(clipped, direction * np.minimum(norms, 1.0)[:, None], rtol=1e-12)
    # Through randomize, with little noise next to the 1e4 overshoot: σ = 2·√(2 ln 1.25e5)/500 ≈ 0.02.
    quiet = mech.create_mechanism("fedaw-gaussian", sensitivity=2.0, epsilon=500.0)
    y = quiet.randomize(x, rng=mech.default_rng(4))
    assert np.max(np.abs(y - clipped)) <= 6.0 * quiet.sigma
    report = m.report()
    assert report.sensitivity == 2.0
    # One coordinate can take the whole S_f: the tight 1-D curve; the record: the zCDP bound of S_f/g steps.
    from ldpfl.mechanisms import discrete_privacy as dpriv

    assert report.exact_epsilon_per_record == pytest.approx(
        dpriv.discrete_gaussian_record_epsilon(m.sigma / m.grid, 2.0 / m.grid, 1e-5), rel=1e-12)
    assert report.exact_epsilon_per_record >= report.exact_epsilon_per_coordinate


def test_label_distribution_weight_by_hand() -> None:
    assert mech.label_distribution_weight(np.full(10, 7)) == pytest.approx(1.0, rel=1e-15)
    one_hot = np.zeros(10)
    one_hot[3] = 250
    assert mech.label_distribution_weight(one_hot) == pytest.approx(1.0 / math.sqrt(10.0), rel=1e-15)
    # (3/4, 1/4)·(1/2, 1/2) / (|(3/4, 1/4)|·|(1/2, 1/2)|) = (1/2)/(√(10)/4 · √2/2) = 2/√5
    assert mech.label_distribution_weight([3, 1]) == pytest.approx(2.0 / math.sqrt(5.0), rel=1e-15)
    assert mech.label_distribution_weight([30, 10]) == pytest.approx(2.0 / math.sqrt(5.0), rel=1e-15)
    assert mech.label_distribution_weight([0, 0, 0]) == 0.0
    assert mech.label_distribution_weight([1, 0], reference=[1, 0]) == pytest.approx(1.0, rel=1e-15)
    assert mech.cosine_similarity([1, 0], [0, 1]) == 0.0


@pytest.mark.parametrize("bad", [[], [1, -1, 2], [[1, 2], [3, 4]]])
def test_label_distribution_weight_refuses_bad_counts(bad: list) -> None:
    with pytest.raises(ValueError, match="label_counts"):
        mech.label_distribution_weight(bad)


# --------------------------------------------------------------------------------------------------
# ldpsign.


def test_ldpsign_probability_of_plus_one() -> None:
    m = mech.create_mechanism("ldpsign", epsilon=2.0, delta=1e-5, clip=4.0, l2_sensitivity=2.0)
    sigma = 2.0 * math.sqrt(2.0 * math.log(1.25e5)) / 2.0
    assert m.sigma == pytest.approx(sigma, rel=1e-15)
    inputs = np.array([-10.0, -4.0, -1.5, 0.0, 1.0, 4.0, 10.0])
    x = np.repeat(inputs[:, None], 100_000, axis=1).astype(np.float32)
    y = m.randomize(x, rng=mech.default_rng(41))
    assert y.dtype == np.float32
    assert set(np.unique(y)) == {-1.0, 1.0}
    for row, p_in in zip(y, inputs, strict=True):
        p = float(special.ndtr(np.clip(p_in, -4.0, 4.0) / sigma))
        p_hat = float(np.mean(row == 1.0))
        assert abs(p_hat - p) <= K_SE * binomial_se(p, row.size), (p_in, p_hat, p)


def test_ldpsign_exact_epsilon() -> None:
    m = mech.create_mechanism("ldpsign", dim=10)
    report = m.report()
    c, sigma = 4.0, 8.0 * math.sqrt(2.0 * math.log(1.25e5))
    expected = math.log(special.ndtr(c / sigma) / special.ndtr(-c / sigma))
    assert report.exact_epsilon_per_coordinate == pytest.approx(expected, rel=1e-12)
    assert report.exact_epsilon_per_record == pytest.approx(10.0 * expected, rel=1e-12)
    assert report.exact_delta == 0.0
    assert report.sigma == pytest.approx(sigma, rel=1e-15)


# --------------------------------------------------------------------------------------------------
# PDPM (PLDP-FL Algorithm 2, eq. 10).


def pdpm_by_hand(v: float, epsilon: float, length: float) -> dict[str, float]:
    """Eq. 10, written out again for the tests: output value -> probability, for centred v."""
    e = math.exp(epsilon)
    high = length * (e + 3) / (2 * (e - 1))
    low = -length * (e + 1) / (e - 1)
    p_high = v * (e - 1) / (length * (e + 2)) + (e + 1) / (2 * (e + 2))
    p_low = (e + 3) / (4 * (e + 2)) - v * (e - 1) / (2 * length * (e + 2))
    return {"high": high, "low": low, "p_high": p_high, "p_low": p_low, "p_zero": p_low}


@pytest.mark.parametrize("v", [-1.0, -0.3, 0.0, 0.5, 1.0])
def test_pdpm_probabilities_match_eq10(v: float) -> None:
    hand = pdpm_by_hand(v, 1.0, 2.0)
    p_high, p_low = mech.pdpm_probabilities(np.array(v), 1.0, 2.0)
    assert float(p_high) == pytest.approx(hand["p_high"], rel=1e-14)
    assert float(p_low) == pytest.approx(hand["p_low"], rel=1e-14)
    assert hand["p_high"] + hand["p_low"] + hand["p_zero"] == pytest.approx(1.0, rel=1e-15)


@pytest.mark.parametrize(
    ("center", "length", "epsilon"), [(0.0, 2.0, 1.0), (3.0, 2.0, 1.0), (-0.5, 0.4, 2.5)]
)
def test_pdpm_is_unbiased(center: float, length: float, epsilon: float) -> None:
    m = mech.create_mechanism("pdpm", epsilon=epsilon, safe_range_length=length, center=center)
    high, low, mid = m.output_values()
    for offset in (-length / 2, -length / 4, 0.0, length / 2):
        w = center + offset
        y = m.randomize(np.full(DRAWS, w), rng=mech.default_rng(51))
        assert set(np.unique(y)) <= {high, low, mid}
        hand = pdpm_by_hand(offset, epsilon, length)
        variance = hand["high"] ** 2 * hand["p_high"] + hand["low"] ** 2 * hand["p_low"] - offset**2
        assert abs(float(y.mean()) - w) <= K_SE * math.sqrt(variance / DRAWS), (w, float(y.mean()))


def test_pdpm_output_ratios_at_the_ends_of_the_safe_range() -> None:
    epsilon, length, center = 1.0, 2.0, 3.0
    m = mech.create_mechanism("pdpm", epsilon=epsilon, safe_range_length=length, center=center)
    high, low, mid = m.output_values()
    assert high == pytest.approx(center + pdpm_by_hand(0, epsilon, length)["high"], rel=1e-15)
    assert low == pytest.approx(center + pdpm_by_hand(0, epsilon, length)["low"], rel=1e-15)
    ends = {}
    for side, w in (("left", center - length / 2), ("right", center + length / 2)):
        y = m.randomize(np.full(DRAWS, w), rng=mech.default_rng(61 if side == "left" else 62))
        ends[side] = {
            name: float(np.mean(y == value)) for name, value in (("high", high), ("low", low), ("zero", mid))
        }
    for name in ("high", "low", "zero"):
        a, b = ends["right"][name], ends["left"][name]
        # SE of ln(a/b) by the delta method, from the two binomial proportions.
        se = math.sqrt((1 - a) / (DRAWS * a) + (1 - b) / (DRAWS * b))
        assert abs(math.log(a / b)) <= epsilon + K_SE * se, (name, a, b)
        if name == "high":
            assert abs(math.log(a / b) - epsilon) <= K_SE * se  # eq. 11: the high output attains e^ε
    report = m.report()
    assert report.exact_epsilon_per_coordinate == pytest.approx(epsilon, rel=1e-12)


def test_pdpm_clips_inputs_outside_the_safe_range() -> None:
    m = mech.create_mechanism("pdpm", epsilon=1.0, safe_range_length=2.0, center=3.0)
    for outside, edge in ((100.0, 4.0), (-7.0, 2.0), (4.000001, 4.0)):
        np.testing.assert_array_equal(
            m.randomize(np.full(1000, outside), rng=mech.default_rng(71)),
            m.randomize(np.full(1000, edge), rng=mech.default_rng(71)),
        )
    y = m.randomize(np.full(DRAWS, 100.0), rng=mech.default_rng(72))
    hand = pdpm_by_hand(1.0, 1.0, 2.0)
    variance = hand["high"] ** 2 * hand["p_high"] + hand["low"] ** 2 * hand["p_low"] - 1.0
    assert abs(float(y.mean()) - 4.0) <= K_SE * math.sqrt(variance / DRAWS)


def test_pdpm_report_composes_over_dim() -> None:
    report = mech.create_mechanism("pdpm", epsilon=0.7, dim=100).report()
    assert report.exact_epsilon_per_coordinate == pytest.approx(0.7, rel=1e-12)
    assert report.exact_epsilon_per_record == pytest.approx(70.0, rel=1e-12)
    assert report.exact_delta == 0.0


def test_real_mechanisms_refuse_non_finite_inputs() -> None:
    for name in ("gaussian", "gaussian-wu", "fedaw-gaussian", "ldpsign", "pdpm"):
        m = mech.create_mechanism(name)
        with pytest.raises(ValueError, match="NaN or infinite"):
            m.randomize(np.array([[0.0, np.nan]]), rng=mech.default_rng(0))
        with pytest.raises(ValueError, match="NaN or infinite"):
            m.randomize(np.array([[np.inf, 0.0]]), rng=mech.default_rng(0))


@pytest.mark.parametrize("epsilon", [37.0, 50.0, 300.0, 500.0])
def test_pdpm_large_epsilon_keeps_its_precision(epsilon: float) -> None:
    # At v = -L/2, P(high) = 1/(e^ε + 2): eq. 10 as printed computes it as a difference of two numbers
    # near 1/2, which rounds to 0 for ε above ~37 and made the report fail.
    m = mech.create_mechanism("pdpm", epsilon=epsilon, safe_range_length=2.0, dim=3)
    p_high, p_low = mech.pdpm_probabilities(np.array([-1.0, 1.0]), epsilon, 2.0)
    assert p_high[0] == pytest.approx(1.0 / (math.exp(epsilon) + 2.0), rel=1e-12)
    assert p_low[1] == pytest.approx(1.0 / (math.exp(epsilon) + 2.0), rel=1e-12)
    # The report is what the 53-bit sampler draws (issue 12): at ε = 37 the upper end outputs low and the
    # centre with one count in 2^53 each and the lower end high with one count, so ε = ln(2^53 - 2); from
    # ε ≈ 37.4 on, e^ε/(e^ε + 2) rounds to 1, the upper end always outputs high, and ε = ∞.
    expected = math.log(2.0**53 - 2.0) if epsilon == 37.0 else math.inf
    assert m.report().exact_epsilon_per_coordinate == pytest.approx(expected, rel=1e-12)
    assert m.report().exact_epsilon_per_record == pytest.approx(3 * expected, rel=1e-12)
    out = m.randomize(np.array([[-1.0, 0.0, 1.0]]), rng=mech.default_rng(0))
    assert np.all(np.isfinite(out))
