"""Bit mechanisms of LDPFL (UER, MOUE, OUE, RR): flip rates, formulas, exact ε, sensitivity rules."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ldpfl import mechanisms as mech
from ldpfl.mechanisms.bitflip import THRESHOLD_SCALE

K_SE = 5.0  # tolerance in binomial standard errors
BIT_MECHANISMS = ("uer", "moue", "oue", "rr")
PAPER = {"epsilon": 0.5, "integer_bits": 4, "fraction_bits": 5, "features": 1152}  # LDPFL IV-D, FMNIST
PAPER_WIDTH = 11520  # r·l = 1152 · 10


def binomial_se(p: float, n: int) -> float:
    return math.sqrt(p * (1.0 - p) / n)


def create(name: str, **overrides: object):
    params = dict(PAPER)
    if name in ("uer", "moue"):
        params["alpha"] = 10.0
    params.update(overrides)
    return mech.create_mechanism(name, **params)


# --------------------------------------------------------------------------------------------------
# Empirical flip rates.


@pytest.mark.parametrize("name", BIT_MECHANISMS)
def test_empirical_rates_match_every_probability_class(name: str) -> None:
    m = create(name)
    assert m.width == PAPER_WIDTH
    rows = 40  # 40 · 11520 / (classes · 2 inputs) >= 1.1e5 draws per (class, input)
    x = mech.default_rng(101).integers(0, 2, size=(rows, m.width), dtype=np.uint8)
    y = m.randomize(x, rng=mech.default_rng(202))
    assert y.dtype == np.uint8 and y.shape == x.shape
    classes = np.broadcast_to(m.position_classes(), x.shape)
    for index, cls in enumerate(m.effective_bit_classes()):
        for bit, p in ((1, cls.p_one_given_one), (0, cls.p_one_given_zero)):
            selected = (classes == index) & (x == bit)
            n = int(selected.sum())
            assert n >= 100_000
            p_hat = float(y[selected].mean())
            assert abs(p_hat - p) <= K_SE * binomial_se(p, n), (name, cls.name, bit, p_hat, p, n)


def test_uer_classes_are_even_and_odd_positions() -> None:
    m = create("uer", features=3)
    np.testing.assert_array_equal(m.position_classes(), np.arange(30) % 2)
    assert m.CLASS_NAMES == ("even", "odd")
    assert [c.name for c in m.bit_classes()] == ["even", "odd"]


@pytest.mark.parametrize("name", BIT_MECHANISMS)
def test_expected_density_matches_empirical_density(name: str) -> None:
    m = create(name)
    x = (mech.default_rng(7).random((30, m.width)) < 0.3).astype(np.uint8)
    y = m.randomize(x, rng=mech.default_rng(8))
    expected = m.expected_density(x)
    assert expected.shape == x.shape
    se = math.sqrt(float(np.sum(expected * (1.0 - expected)))) / x.size
    assert abs(float(y.mean()) - float(expected.mean())) <= K_SE * se
    # Per class as well: every position of a class shares one expected density given its input bit.
    for index in range(len(m.bit_classes())):
        columns = m.position_classes() == index
        e = expected[:, columns]
        se = math.sqrt(float(np.sum(e * (1.0 - e)))) / e.size
        assert abs(float(y[:, columns].mean()) - float(e.mean())) <= K_SE * se


# --------------------------------------------------------------------------------------------------
# The formulas of calibration, by hand, and the 32-bit quantization.


@pytest.mark.parametrize("name", BIT_MECHANISMS)
@pytest.mark.parametrize("rule", ["paper", "reference-code"])
def test_effective_probabilities_are_the_formulas_within_one_threshold_step(name: str, rule: str) -> None:
    m = create(name, sensitivity_rule=rule)
    s = m.sensitivity
    formulas = {
        "uer": lambda: mech.uer_probabilities(0.5, 10.0, s),
        "moue": lambda: mech.moue_probabilities(0.5, 10.0, s),
        "oue": lambda: mech.oue_probabilities(0.5, s),
        "rr": lambda: mech.rr_probabilities(0.5, s),
    }[name]()
    effective = m.effective_bit_classes()
    assert [c.name for c in effective] == [c.name for c in formulas]
    for real, formula in zip(effective, formulas, strict=True):
        assert abs(real.p_one_given_one - formula.p_one_given_one) <= 2.0**-32
        assert abs(real.p_one_given_zero - formula.p_one_given_zero) <= 2.0**-32
        # Thresholds are integers on a 2^32 grid.
        assert (real.p_one_given_one * THRESHOLD_SCALE).is_integer()
        assert (real.p_one_given_zero * THRESHOLD_SCALE).is_integer()


def test_uer_formula_by_hand() -> None:
    """LDPFL eq. 17 with α = 10: even P(1->1) = 10/11, odd P(1->1) = 1/1001, P(0->1) = 1/(1 + 10 e^(ε/s))."""
    s = 11520.0
    even, odd = mech.uer_probabilities(0.5, 10.0, s)
    q = 1.0 / (1.0 + 10.0 * math.exp(0.5 / s))
    assert even.p_one_given_one == pytest.approx(10.0 / 11.0, rel=1e-15)
    assert odd.p_one_given_one == pytest.approx(1.0 / 1001.0, rel=1e-15)
    assert even.p_one_given_zero == pytest.approx(q, rel=1e-15)
    assert odd.p_one_given_zero == pytest.approx(q, rel=1e-15)
    assert even.p_keep_zero == pytest.approx(
        10.0 * math.exp(0.5 / s) / (1.0 + 10.0 * math.exp(0.5 / s)), rel=1e-15
    )


def test_moue_formula_by_hand() -> None:
    """LDPFL Theorem 1: P(1->1) = 1/(1+α), P(0->0) = α e^(ε/s)/(1 + α e^(ε/s))."""
    (c,) = mech.moue_probabilities(0.5, 10.0, 11520.0)
    assert c.p_one_given_one == pytest.approx(1.0 / 11.0, rel=1e-15)
    a_e = 10.0 * math.exp(0.5 / 11520.0)
    assert c.p_keep_zero == pytest.approx(a_e / (1.0 + a_e), rel=1e-15)


def test_oue_formula_by_hand() -> None:
    """LDPFL eqs. 11-12: p = 1/2, q = 1/(1 + e^ε'), with ε' = 2ε/s for each of the s/2 bit pairs."""
    (c,) = mech.oue_probabilities(0.5, 11520.0)
    assert c.p_one_given_one == 0.5
    assert c.p_one_given_zero == pytest.approx(1.0 / (1.0 + math.exp(1.0 / 11520.0)), rel=1e-15)
    # With s = 2 (one pair) it is the textbook OUE: ε = ln(p(1-q)/((1-p)q)) (eq. 13).
    (pair,) = mech.oue_probabilities(1.0, 2.0)
    p, q = pair.p_one_given_one, pair.p_one_given_zero
    assert math.log(p * (1 - q) / ((1 - p) * q)) == pytest.approx(1.0, rel=1e-12)


def test_rr_formula_by_hand() -> None:
    """LDPFL eqs. 5 and 15: keep with p = e^(ε/rl)/(1 + e^(ε/rl))."""
    (c,) = mech.rr_probabilities(0.5, 11520.0)
    t = math.exp(0.5 / 11520.0)
    assert c.p_one_given_one == pytest.approx(t / (1.0 + t), rel=1e-15)
    assert c.p_keep_zero == pytest.approx(t / (1.0 + t), rel=1e-15)
    # Large budgets stay finite (no overflow of e^(ε/s)).
    (big,) = mech.rr_probabilities(1000.0, 1.0)
    assert big.p_one_given_one == 1.0 and big.p_one_given_zero == 0.0


def test_bit_epsilon_by_hand() -> None:
    assert mech.bit_epsilon(0.75, 0.25) == pytest.approx(math.log(3.0), rel=1e-15)
    assert mech.bit_epsilon(0.5, 0.5) == 0.0
    assert mech.bit_epsilon(1.0, 0.5) == math.inf  # output 0 impossible for input 1, possible for 0
    # Asymmetric classes: output 1 gives ln(0.6/0.1) = ln 6, output 0 ln(0.9/0.4) = ln 2.25; the max wins.
    assert mech.bit_epsilon(0.6, 0.1) == pytest.approx(math.log(6.0), rel=1e-15)


# --------------------------------------------------------------------------------------------------
# Exact ε in the reports.


@pytest.mark.parametrize("name", ["rr", "oue"])
def test_rr_and_oue_exact_epsilon_is_nominal(name: str) -> None:
    report = create(name).report()
    assert report.nominal_epsilon == 0.5
    assert report.exact_epsilon_per_record == pytest.approx(0.5, rel=1e-3)
    assert report.exact_epsilon_per_coordinate == pytest.approx(0.5 / PAPER_WIDTH, rel=1e-3)


def test_moue_exact_epsilon_is_at_most_nominal() -> None:
    report = create("moue").report()
    assert 0.0 < report.exact_epsilon_per_record <= 0.5
    # Output 1 dominates: ln((1 + α e^t)/(1 + α)) ≈ α t/(1+α) per bit, so about (10/11)·ε per record.
    assert report.exact_epsilon_per_record == pytest.approx(0.5 * 10.0 / 11.0, rel=1e-3)


def test_uer_exact_epsilon_is_far_above_nominal() -> None:
    m = create("uer")
    report = m.report()
    even, odd = m.effective_bit_classes()
    eps_even = mech.bit_epsilon(even.p_one_given_one, even.p_one_given_zero)
    eps_odd = mech.bit_epsilon(odd.p_one_given_one, odd.p_one_given_zero)
    assert report.exact_epsilon_per_record == pytest.approx(5760 * (eps_even + eps_odd), rel=1e-12)
    assert report.exact_epsilon_per_coordinate == pytest.approx(max(eps_even, eps_odd), rel=1e-15)

    # Independently of bit_epsilon: the worst log-ratio of each output, straight from the probabilities.
    def worst(p11: float, p10: float) -> float:
        return max(abs(math.log(p11 / p10)), abs(math.log((1 - p11) / (1 - p10))))

    assert eps_even == pytest.approx(worst(10 / 11, 1 / (1 + 10 * math.exp(0.5 / 11520))), rel=1e-6)
    assert eps_odd == pytest.approx(worst(1 / 1001, 1 / (1 + 10 * math.exp(0.5 / 11520))), rel=1e-6)
    # Even ≈ ln α, odd ≈ ln((1+α³)/(1+α)) — nothing to do with ε = 0.5.
    assert eps_even == pytest.approx(math.log(10.0), rel=1e-3)
    assert eps_odd == pytest.approx(math.log(1001.0 / 11.0), rel=1e-3)
    assert report.exact_epsilon_per_record > 10_000 * report.nominal_epsilon
    # Even loss ln(α/(1+α)·(1+αe^t)) plus odd loss ln((1+α³)/(1+αe^t)): ε cancels, a pair loses ln 910.
    # Quantizing to 2^-32 moves each of the four probabilities in a pair's logs by <= 2^-33, i.e. each
    # log by <= 2^-33 / (1/1001).
    quantization = 5760 * 4 * 1001 * 2.0**-33
    assert report.exact_epsilon_per_record == pytest.approx(5760 * math.log(10 * 1001 / 11), abs=quantization)
    assert create("uer", epsilon=5.0).report().exact_epsilon_per_record == pytest.approx(
        report.exact_epsilon_per_record, abs=2 * quantization
    )
    assert report.probabilities["class even"]["positions"] == 5760
    assert report.probabilities["class odd"]["positions"] == 5760


@pytest.mark.parametrize("name", BIT_MECHANISMS)
def test_reference_code_rule_halves_the_sensitivity(name: str) -> None:
    paper = create(name, sensitivity_rule="paper")
    halved = create(name, sensitivity_rule="reference-code")
    assert paper.sensitivity == PAPER_WIDTH
    assert halved.sensitivity == PAPER_WIDTH / 2
    assert halved.report().sensitivity == PAPER_WIDTH / 2
    assert "reference-code" in " ".join(halved.report().notes)


def test_reference_code_rule_doubles_rr_exact_epsilon() -> None:
    """Each bit gets ε/(rl/2), and all rl bits may differ: the record loses 2ε."""
    report = create("rr", sensitivity_rule="reference-code").report()
    assert report.exact_epsilon_per_record == pytest.approx(1.0, rel=1e-3)


def test_randomize_features_encodes_then_randomizes() -> None:
    m = create("rr", features=6)
    x = mech.default_rng(3).uniform(-2, 2, size=(4, 6))
    direct = m.randomize_features(x, rng=mech.default_rng(9))
    two_step = m.randomize(m.encoding.encode(x), rng=mech.default_rng(9))
    np.testing.assert_array_equal(direct, two_step)


def test_bool_and_int_inputs_are_accepted_as_bits() -> None:
    m = create("uer", features=2)
    bits = mech.default_rng(1).integers(0, 2, size=(5, m.width), dtype=np.uint8)
    reference = m.randomize(bits, rng=mech.default_rng(4))
    for other in (bits.astype(bool), bits.astype(np.int64), bits.astype(np.int8)):
        out = m.randomize(other, rng=mech.default_rng(4))
        assert out.dtype == np.uint8
        np.testing.assert_array_equal(out, reference)


@pytest.mark.parametrize("bad", [2, -1, 255])
@pytest.mark.parametrize("dtype", [np.int64, np.int16])
def test_values_other_than_zero_and_one_are_refused(bad: int, dtype: type) -> None:
    m = create("uer", features=2)
    bits = np.zeros((3, m.width), dtype=dtype)
    bits[1, 7] = bad
    with pytest.raises(ValueError, match=f"found the value {bad}"):
        m.randomize(bits, rng=mech.default_rng(0))


def test_uint8_value_two_is_refused() -> None:
    m = create("oue", features=1)
    bits = np.zeros(m.width, dtype=np.uint8)
    bits[3] = 2
    with pytest.raises(ValueError, match="found the value 2"):
        m.randomize(bits, rng=mech.default_rng(0))


def test_wrong_width_and_float_bits_are_refused() -> None:
    m = create("rr", features=2)
    with pytest.raises(ValueError, match=r"20 entries on the last axis.*\(3, 21\)"):
        m.randomize(np.zeros((3, 21), dtype=np.uint8), rng=mech.default_rng(0))
    with pytest.raises(ValueError, match="float64"):
        m.randomize(np.zeros((3, 20)), rng=mech.default_rng(0))
