"""The one accountant (ldpfl.mechanisms.accounting) against dp-accounting called directly, and its calibration."""

from __future__ import annotations

import math

import dp_accounting
import pytest
from dp_accounting import pld

from ldpfl.mechanisms import accounting

NR = dp_accounting.NeighboringRelation


def _direct(sigma: float, q: float, steps: int, delta: float, relation) -> float:
    accountant = pld.PLDAccountant(relation)
    accountant.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps))
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize(("sigma", "q", "steps"), [(4.05, 0.1365, 293), (1.1, 0.01, 1000), (2.0, 1.0, 5)])
def test_dp_sgd_epsilon_is_dp_accountings(sigma, q, steps):
    both = accounting.dp_sgd_epsilons(accounting.DpSgdEvent(sigma, q, steps), 1e-5)
    assert both["replace-one"] == pytest.approx(_direct(sigma, q, steps, 1e-5, NR.REPLACE_ONE), rel=1e-9)
    assert both["add-remove"] == pytest.approx(_direct(sigma, q, steps, 1e-5, NR.ADD_OR_REMOVE_ONE), rel=1e-9)
    assert both["add-remove"] < both["replace-one"]


def test_the_anchors_figures():
    """Tramèr & Boneh's FMNIST setting as the issue measured it: 2.43 add/remove, 5.15 replace-one."""
    both = accounting.dp_sgd_epsilons(accounting.DpSgdEvent(4.05, 0.1365, 293), 1e-5)
    assert both["add-remove"] == pytest.approx(2.43, abs=0.01)
    assert both["replace-one"] == pytest.approx(5.15, abs=0.01)


def test_composition_of_steps_is_additive_in_events():
    """T steps as one event equal T1 + T2 steps as two events (the accountant restored after a resume)."""
    one = accounting.epsilon([accounting.DpSgdEvent(2.0, 0.05, 300)], 1e-5)
    two = accounting.epsilon([accounting.DpSgdEvent(2.0, 0.05, 120), accounting.DpSgdEvent(2.0, 0.05, 180)], 1e-5)
    assert one == pytest.approx(two, rel=1e-3)


@pytest.mark.parametrize("neighbours", accounting.NEIGHBOURS)
def test_calibration_round_trip(neighbours):
    """σ → ε → σ: the calibrated σ meets the target, and 1 % less noise would not."""
    sigma = accounting.calibrate_noise_multiplier(3.0, 1e-5, 0.1, 200, neighbours=neighbours)
    spent = accounting.epsilon([accounting.DpSgdEvent(sigma, 0.1, 200)], 1e-5, neighbours=neighbours)
    assert spent <= 3.0
    assert accounting.epsilon([accounting.DpSgdEvent(sigma * 0.99, 0.1, 200)], 1e-5, neighbours=neighbours) > 3.0


def test_pure_parts_match_the_release_guarantee_events():
    """k-RR and binary RR as dp-accounting's RandomizedResponseDpEvent (replace-one only)."""
    k, eps = 10, 1.0
    direct = pld.PLDAccountant(NR.REPLACE_ONE)
    direct.compose(dp_accounting.RandomizedResponseDpEvent(k / (math.exp(eps) + k - 1), k))
    assert accounting.epsilon([accounting.RandomizedResponseEvent(eps, k)], 1e-5) == pytest.approx(
        direct.get_epsilon(1e-5), rel=1e-9)
    assert accounting.epsilon([accounting.PureEvent(0.5)], 0.0) == pytest.approx(0.5, abs=1e-3)
    with pytest.raises(ValueError, match="add-remove"):
        accounting.epsilon([accounting.PureEvent(0.5)], 1e-5, neighbours=accounting.ADD_REMOVE)


def test_refusals_name_the_parameter():
    with pytest.raises(ValueError, match="noise_multiplier"):
        accounting.DpSgdEvent(0.0, 0.1, 10)
    with pytest.raises(ValueError, match="sampling_probability"):
        accounting.DpSgdEvent(1.0, 1.5, 10)
    with pytest.raises(ValueError, match="neighbours"):
        accounting.epsilon([], 1e-5, neighbours="swap")
    with pytest.raises(ValueError, match="out of reach"):
        accounting.calibrate_noise_multiplier(1e-6, 1e-12, 1.0, 10)
    assert accounting.epsilon([accounting.DpSgdEvent(1.0, 0.1, 0)], 1e-5) == 0.0


def _direct_gaussian(sigma: float, count: int, relation) -> pld.PLDAccountant:
    accountant = pld.PLDAccountant(relation)
    accountant.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma), count))
    return accountant


@pytest.mark.parametrize(("sigma", "count"), [(0.8, 1), (5.0, 1), (34.0, 300), (60.0, 1000)])
@pytest.mark.parametrize("neighbours", accounting.NEIGHBOURS)
def test_gaussian_releases_alone_are_exact(sigma, count, neighbours):
    """k Gaussian releases alone take the analytic path: at most 1e-5 (relative) below dp-accounting's
    pessimistic PLD figure and never above it by more than the bisection's tolerance; δ(ε) likewise."""
    relation = NR.REPLACE_ONE if neighbours == accounting.REPLACE_ONE else NR.ADD_OR_REMOVE_ONE
    direct = _direct_gaussian(sigma, count, relation)
    exact = accounting.epsilon([accounting.GaussianEvent(sigma, count)], 1e-5, neighbours=neighbours)
    discretized = direct.get_epsilon(1e-5)
    assert discretized * (1 - 1e-5) <= exact <= discretized + accounting.GAUSSIAN_TOLERANCE
    # the analytic δ at the returned ε is within the target (the figure errs on the safe side)
    assert accounting.delta([accounting.GaussianEvent(sigma, count)], exact, neighbours=neighbours) <= 1e-5
    assert accounting.delta([accounting.GaussianEvent(sigma, count)], 1.0, neighbours=neighbours) == pytest.approx(
        direct.get_delta(1.0), rel=1e-4, abs=1e-12)


def test_a_gaussian_with_other_parts_is_composed_by_pld():
    """The exact path is for Gaussian releases alone: with a DP-SGD part, dp-accounting's PLD composes both."""
    events = [accounting.GaussianEvent(20.0, 10), accounting.DpSgdEvent(3.0, 0.1, 50)]
    direct = pld.PLDAccountant(NR.ADD_OR_REMOVE_ONE)
    direct.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(20.0), 10))
    direct.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(3.0)), 50))
    assert accounting.epsilon(events, 1e-5, neighbours=accounting.ADD_REMOVE) == pytest.approx(
        direct.get_epsilon(1e-5), rel=1e-9)
    assert accounting.epsilon([accounting.GaussianEvent(1.0)], 0.0) == math.inf
