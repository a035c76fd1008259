"""The evaluation replies of a DP-SGD run: the noise the accountant assumes, and the accountant's figure.

The calibrated σ is checked against dp-accounting composing every release one by one (the module composes
them in one step, Dong, Roth & Su 2019), and the noise a silo adds is checked by its sample moments: with
k draws of N(0, σ²) rounded to integers, the mean lies within 5 standard errors σ/√k of 0 and the variance
within 5 standard errors σ²√(2/k) of σ² + 1/12 (the rounding's variance); the loss noise has σ·L.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ldpfl.mechanisms import accounting
from ldpfl.stage2_federate.silo_training import evaluation_noise as noise

DRAWS = 20_000


@pytest.fixture(scope="module")
def calibrated() -> noise.EvaluationNoise:
    return noise.calibrate(3.0, 1e-5, 30, neighbours=accounting.ADD_REMOVE)


def test_the_calibrated_sigma_is_the_smallest_within_the_target(calibrated: noise.EvaluationNoise) -> None:
    assert calibrated.epsilon(30) <= 3.0
    assert noise.spent(calibrated.sigma / 1.002, 30, 1e-5) > 3.0
    assert calibrated.epsilons(30) == {accounting.REPLACE_ONE: calibrated.epsilon(30),
                                       accounting.ADD_REMOVE: calibrated.epsilon(30)}


def test_releases_composed_at_once_equal_dp_accounting_release_by_release(calibrated: noise.EvaluationNoise) -> None:
    for releases in (1, 7, 30):
        one_by_one = accounting.epsilon([accounting.GaussianEvent(calibrated.sigma / math.sqrt(2), releases)], 1e-5,
                                        neighbours=accounting.ADD_REMOVE)
        assert noise.spent(calibrated.sigma, releases, 1e-5) == pytest.approx(one_by_one, rel=2e-3)
    assert noise.spent(calibrated.sigma, 0, 1e-5) == 0.0


def test_the_released_sums_carry_the_noise_the_accountant_assumes(calibrated: noise.EvaluationNoise) -> None:
    rng = np.random.default_rng(20261126)
    rows, correct, loss = 10**7, 5 * 10**6, 2.5e6
    released = [calibrated.release(loss, correct, rows, rng=rng) for _ in range(DRAWS)]
    counts = np.array([r.correct for r in released], dtype=float) - correct
    losses = (np.array([r.loss_sum for r in released]) - loss) / noise.LOSS_BOUND
    sigma = calibrated.sigma
    for values, expected_variance in ((counts, sigma**2 + 1 / 12), (losses, sigma**2)):
        assert abs(values.mean()) < 5 * sigma / math.sqrt(DRAWS)
        assert abs(values.var() - expected_variance) < 5 * sigma**2 * math.sqrt(2 / DRAWS)
    assert all(r.rows == rows for r in released)


def test_the_released_sums_stay_in_their_ranges(calibrated: noise.EvaluationNoise) -> None:
    rng = np.random.default_rng(7)
    for _ in range(200):
        out = calibrated.release(0.5, 1, 3, rng=rng)
        assert 0 <= out.correct <= 3 and 0.0 <= out.loss_sum <= 3 * noise.LOSS_BOUND
        assert isinstance(out.correct, int)


@pytest.mark.parametrize(("target", "delta", "releases", "named"), [
    (0.0, 1e-5, 10, "target_epsilon"), (math.inf, 1e-5, 10, "target_epsilon"), (3.0, 0.0, 10, "delta"),
    (3.0, 1.0, 10, "delta"), (3.0, 1e-5, 0, "releases"), (3.0, 1e-5, True, "releases")])
def test_bad_calibrations_are_refused_by_name(target: float, delta: float, releases: int, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        noise.calibrate(target, delta, releases, neighbours=accounting.REPLACE_ONE)


def test_an_unseeded_release_is_refused(calibrated: noise.EvaluationNoise) -> None:
    with pytest.raises((TypeError, ValueError)):
        calibrated.release(1.0, 1, 3, rng=None)  # type: ignore[arg-type]
