"""Exact privacy of the discrete mechanisms (mechanisms/discrete_privacy.py): golden values and agreement
with independent implementations (30-40 digit mpmath sums, dp-accounting)."""

from __future__ import annotations

import math

import pytest

from ldpfl.mechanisms import discrete_privacy as dpriv
from ldpfl.mechanisms.calibration import gaussian_delta_for_epsilon, gaussian_exact_epsilon

# δ(ε) of CKS Theorem 7, P[Y ≥ a] - e^ε P[Y ≥ a + Δ], summed term by term with mpmath at 40 digits
# (normalizer over |k| ≤ 45σ + 20, or by Poisson summation for σ ≥ 50). Columns: σ, Δ, ε, δ.
GOLDEN_DELTA = [
    (0.8, 1, 0.5, 0.33606437063347448),
    (2.0, 1, 1.0, 0.0072487768459525779),
    (2.0, 3, 2.0, 0.13931582373050773),
    (10.5, 1, 0.25, 0.00014501749752053121),
    (10.5, 4, 1.0, 0.00083890790261786622),
    (3.3, 2, 0.1, 0.2022735183779902),
    # σ above DIRECT_SUM_MAX_SIGMA: the Euler-Maclaurin branch.
    (300.0, 250, 0.5, 0.17228327804909064607),
    (300.0, 250, 2.0, 0.005737415975056004177),
    (1000.5, 3000, 1.0, 0.78729774969243142346),
    (1000.5, 100, 0.05, 0.020249442412525390517),
]


@pytest.mark.parametrize(("sigma", "sensitivity", "epsilon", "expected"), GOLDEN_DELTA)
def test_theorem7_delta_golden(sigma: float, sensitivity: int, epsilon: float, expected: float) -> None:
    assert dpriv.discrete_gaussian_delta(epsilon, sigma, sensitivity) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("sigma", "sensitivity", "epsilon", "expected"), GOLDEN_DELTA[:6])
def test_theorem7_delta_matches_dp_accounting(sigma: float, sensitivity: int, epsilon: float,
                                              expected: float) -> None:
    """dp-accounting's DiscreteGaussianPrivacyLoss (truncated at 11.6σ, mass < 1e-30 left out) is independent."""
    from dp_accounting.pld import privacy_loss_mechanism as plm

    theirs = plm.DiscreteGaussianPrivacyLoss(sigma, sensitivity=sensitivity).get_delta_for_epsilon(epsilon)
    assert dpriv.discrete_gaussian_delta(epsilon, sigma, sensitivity) == pytest.approx(theirs, rel=1e-12)


def test_tail_branches_agree_at_the_switch() -> None:
    """Direct sum just below DIRECT_SUM_MAX_SIGMA, Euler-Maclaurin just above: the same tail to ~1e-11."""
    s = dpriv.DIRECT_SUM_MAX_SIGMA
    for n in (1, 100, 700, 2000, 5000):
        direct = dpriv.discrete_gaussian_log_tail(s, n)
        em = dpriv.discrete_gaussian_log_tail(math.nextafter(s, math.inf), n)
        assert em == pytest.approx(direct, abs=1e-10)
    # n ≤ 0 through the complement: P[Y ≥ 0] = 1 - P[Y ≥ 1] = (1 + p(0))/2 by symmetry.
    p_ge_1 = math.exp(dpriv.discrete_gaussian_log_tail(2.0, 1))
    assert math.exp(dpriv.discrete_gaussian_log_tail(2.0, 0)) == pytest.approx(1.0 - p_ge_1, rel=1e-15)
    p_ge_2 = math.exp(dpriv.discrete_gaussian_log_tail(2.0, 2))
    assert math.exp(dpriv.discrete_gaussian_log_tail(2.0, -1)) == pytest.approx(1.0 - p_ge_2, rel=1e-15)


def test_discrete_close_to_continuous_for_large_sigma() -> None:
    """At σ ≫ 1 (grid units) the discrete curve equals Balle-Wang's continuous one to ~1e-9 relative."""
    sigma, sens = 9.69 * 2**22, 2 * 2**22
    for eps in (0.1, 0.75, 2.0):
        assert dpriv.discrete_gaussian_delta(eps, sigma, sens) == pytest.approx(
            gaussian_delta_for_epsilon(eps, sigma, sens), rel=1e-9)
    assert dpriv.discrete_gaussian_epsilon(sigma, sens, 1e-5) == pytest.approx(
        gaussian_exact_epsilon(sigma, sens, 1e-5), rel=1e-9)


@pytest.mark.parametrize(("sigma", "sensitivity", "delta"), [(2.0, 1, 1e-5), (0.9, 2, 1e-3), (400.0, 300, 1e-6)])
def test_epsilon_round_trip(sigma: float, sensitivity: int, delta: float) -> None:
    """ε(δ) is the smallest ε on the curve: δ(ε) ≤ δ and δ(ε - 1e-6) > δ."""
    eps = dpriv.discrete_gaussian_epsilon(sigma, sensitivity, delta)
    assert dpriv.discrete_gaussian_delta(eps, sigma, sensitivity) <= delta
    assert dpriv.discrete_gaussian_delta(eps - 1e-6, sigma, sensitivity) > delta


def test_epsilon_golden_small_sigma() -> None:
    """σ = 2, Δ = 1, δ = 1e-5: ε = 2.01134 (the continuous Gaussian gives 1.99309 - the lattice costs a bit)."""
    assert dpriv.discrete_gaussian_epsilon(2.0, 1, 1e-5) == pytest.approx(2.0113398213, rel=1e-9)
    assert gaussian_exact_epsilon(2.0, 1, 1e-5) == pytest.approx(1.9930914044, rel=1e-9)


def test_edge_cases_and_refusals() -> None:
    assert dpriv.discrete_gaussian_delta(1.0, 3.0, 0) == 0.0
    assert dpriv.discrete_gaussian_epsilon(3.0, 0, 1e-5) == 0.0
    assert dpriv.discrete_gaussian_delta(0.0, 1e-3, 1) == pytest.approx(1.0)  # almost no noise: δ(0) = TV ≈ 1
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="sigma"):
            dpriv.discrete_gaussian_delta(1.0, bad, 1)
    with pytest.raises(ValueError, match="sensitivity"):
        dpriv.discrete_gaussian_delta(1.0, 2.0, 1.5)
    with pytest.raises(ValueError, match="delta"):
        dpriv.discrete_gaussian_epsilon(2.0, 1, 0.0)
    with pytest.raises(ValueError, match="epsilon"):
        dpriv.discrete_gaussian_delta(-0.1, 2.0, 1)


# --------------------------------------------------------------------------------------------------
# zCDP for d dimensions.


def continuous_zcdp_epsilon(rho: float, delta: float) -> float:
    """min over all α > 1 of CKS Proposition 12's ε (a bounded scalar search on log(α - 1)): the lower bound
    of any conversion that takes the minimum over a set of orders."""
    from scipy import optimize

    def eps_at(u: float) -> float:
        alpha = 1.0 + math.exp(u)
        return alpha * rho + math.log1p(-1.0 / alpha) - (math.log(delta) + math.log(alpha)) / (alpha - 1.0)

    found = optimize.minimize_scalar(eps_at, bounds=(-15.0, 20.0), method="bounded", options={"xatol": 1e-10})
    return float(found.fun)


@pytest.mark.parametrize("rho", [1e-4, 0.025, 1 / 18, 0.5, 10.0, 300.0])
def test_zcdp_epsilon_is_dp_accountings_conversion(rho: float) -> None:
    """zcdp_epsilon is CKS Prop. 12 at the best of dp-accounting's default orders (one code path with
    stage 2's ledger): the closed form over those orders, never below the minimum over all α > 1."""
    from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS

    ours = dpriv.zcdp_epsilon(rho, 1e-6)
    closed_form = min(a * rho + math.log1p(-1 / a) - math.log(1e-6 * a) / (a - 1)
                      for a in DEFAULT_RDP_ORDERS if a > 1.01)
    assert ours == pytest.approx(closed_form, rel=1e-12)
    lower = continuous_zcdp_epsilon(rho, 1e-6)
    assert lower <= ours * (1 + 1e-9)
    # The orders are a grid: for ρ from 0.01 to 100 it costs less than 0.5 % over the continuous minimum.
    assert ours <= lower * (1.005 if 0.01 <= rho <= 100 else 1.1)
    # Round trip through zcdp_delta: at the optimal order the two conversions are the same equation.
    assert dpriv.zcdp_delta(rho, ours) == pytest.approx(1e-6, rel=1e-9)


def test_zcdp_golden_and_record_bound() -> None:
    """ρ = 0.025 at δ = 1e-6 (CKS's example value): ε = 1.0140743 at the best α > 1 (α = 21.72); dp-accounting's
    orders give 1.0141689 at α = 22. The record bound uses ρ = Δ²/(2σ²)."""
    assert continuous_zcdp_epsilon(0.025, 1e-6) == pytest.approx(1.014074254726, rel=1e-9)
    assert dpriv.zcdp_epsilon(0.025, 1e-6) == pytest.approx(1.014168941727, rel=1e-9)
    assert dpriv.discrete_gaussian_rho(3.0, 1.0) == pytest.approx(1 / 18)
    assert dpriv.discrete_gaussian_record_epsilon(3.0, 1.0, 1e-6) == pytest.approx(
        dpriv.zcdp_epsilon(1 / 18, 1e-6))
    # For one coordinate the zCDP bound is valid, so never below the tight Theorem 7 figure.
    for sigma, sens in ((2.0, 1), (40.0, 16), (1000.0, 500)):
        assert dpriv.discrete_gaussian_record_epsilon(sigma, sens, 1e-5) >= dpriv.discrete_gaussian_epsilon(
            sigma, sens, 1e-5)
    assert dpriv.zcdp_epsilon(0.0, 1e-5) == 0.0
    assert dpriv.zcdp_delta(0.0, 1.0) == 0.0


# --------------------------------------------------------------------------------------------------
# Discrete Laplace.


@pytest.mark.parametrize(("scale", "sensitivity"), [(3.0, 1), (0.5, 2), (1000.0, 64)])
def test_discrete_laplace_epsilon(scale: float, sensitivity: int) -> None:
    """Pure ε = Δ/t: dp-accounting's discrete Laplace PLD (parameter a = 1/t) has δ(Δ/t) = 0 and δ > 0 below."""
    from dp_accounting.pld import privacy_loss_mechanism as plm

    eps = dpriv.discrete_laplace_epsilon(scale, sensitivity)
    assert eps == sensitivity / scale
    loss = plm.DiscreteLaplacePrivacyLoss(1.0 / scale, sensitivity=sensitivity)
    assert loss.get_delta_for_epsilon(eps) == pytest.approx(0.0, abs=1e-15)
    assert loss.get_delta_for_epsilon(eps * 0.99) > 1e-6
    with pytest.raises(ValueError, match="scale"):
        dpriv.discrete_laplace_epsilon(0.0, 1)
