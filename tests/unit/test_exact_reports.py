"""Reports from what the code really samples (issue 12, item 2): PDPM and ldpsign.

The property test treats ``randomize`` as a black box. A Generator whose ``random`` returns chosen values
walks the 2^53 possible uniforms j·2^-53 by bisection and finds, at each end of the input range, exactly
how many of them give each output. From those counts it computes the ε the sampler provides and checks
the report against it: never a finite ε where an output is possible for one input and impossible for the
other (in particular where the output is deterministic), and otherwise the same number.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from ldpfl import mechanisms as mech
from ldpfl.mechanisms.calibration import UNIFORM_STEPS, counts_epsilon

U_MAX = 1.0 - 2.0**-53


class ScriptedUniforms(np.random.Generator):
    """A Generator whose successive ``random`` calls return the given values (broadcast to the size)."""

    def __init__(self, *values: float) -> None:
        super().__init__(np.random.PCG64(0))
        self.values = list(values)

    def random(self, size=None, dtype=np.float64, out=None):  # noqa: D102
        return np.broadcast_to(np.float64(self.values.pop(0)), size).copy()


def output_at(m, x: float, *uniforms: float) -> float:
    """The output for one value x: drawn by the same mechanism declared for records of one value."""
    one = dataclasses.replace(m, dim=1)  # a declared dim is enforced (issue 23); the coordinate law is the same
    return float(one.randomize(np.array([[x]]), rng=ScriptedUniforms(*uniforms))[0, 0])


def first_j_where(predicate) -> int:
    """Smallest j in [0, 2^53] with predicate(j·2^-53) true, for a predicate false then true in j."""
    low, high = 0, UNIFORM_STEPS  # predicate(low - 1) false (or low = 0), predicate(high) true by convention
    while low < high:
        mid = (low + high) // 2
        if predicate(mid * 2.0**-53):
            high = mid
        else:
            low = mid + 1
    return low


def pdpm_counts(m, x: float) -> tuple[int, int, int]:
    """(high, low, centre) counts at an end of the safe range, where the mixture draw is decided."""
    high, low, centre = m.output_values()
    side = 0.5  # at t = ±1 the first uniform does not matter: (1+t)/2 is exactly 0 or 1
    first_not_high = first_j_where(lambda u: output_at(m, x, side, u) != high)
    first_centre = first_j_where(lambda u: output_at(m, x, side, u) == centre)
    assert output_at(m, x, side, 0.0) in (high, low, centre)
    return first_not_high, max(first_centre - first_not_high, 0), UNIFORM_STEPS - max(first_centre, first_not_high)


def ldpsign_counts(m, x: float) -> tuple[int, int]:
    """(+1, -1) counts at an end of the clipped range."""
    first_minus = first_j_where(lambda u: output_at(m, x, 0.5, u) == -1.0)
    return first_minus, UNIFORM_STEPS - first_minus


EPSILONS = [0.01, 0.5, 1.0, 5.0, 20.0, 30.0, 35.0, 36.0, 37.0, 37.5, 38.0, 50.0, 100.0, 500.0]
RANGES = [(0.0, 2.0), (0.0, 1e-6), (1e8, 1e-6), (1e8, 2.0), (-5.0, 1e3)]


@pytest.mark.parametrize(("center", "length"), RANGES)
def test_pdpm_report_matches_the_sampled_counts(center: float, length: float) -> None:
    for epsilon in EPSILONS:
        m = mech.create_mechanism("pdpm", epsilon=epsilon, safe_range_length=length, center=center, dim=4)
        lo_end, hi_end = m.safe_range
        left, right = pdpm_counts(m, lo_end), pdpm_counts(m, hi_end)
        assert sum(left) == sum(right) == UNIFORM_STEPS
        sampled = counts_epsilon(left, right)
        report = m.report()
        if any((a == 0) != (b == 0) for a, b in zip(left, right, strict=True)):
            assert math.isinf(report.exact_epsilon_per_coordinate), (epsilon, center, length, left, right)
            assert not report.private
        assert report.exact_epsilon_per_coordinate == pytest.approx(sampled, rel=1e-12), (epsilon, left, right)
        if epsilon <= 30.0:  # far from the float limits the report is eq. 11's ε
            assert report.exact_epsilon_per_coordinate == pytest.approx(epsilon, rel=1e-5)
        # Outside the range is clipped to the ends: the same counts.
        assert pdpm_counts(m, hi_end + 10 * length) == right


@pytest.mark.parametrize("clip", [1e-3, 1.0, 4.0, 1e3])
def test_ldpsign_report_matches_the_sampled_counts(clip: float) -> None:
    for epsilon in EPSILONS:
        m = mech.create_mechanism("ldpsign", epsilon=epsilon, clip=clip, dim=3)
        low, high = ldpsign_counts(m, -clip), ldpsign_counts(m, clip)
        sampled = counts_epsilon(low, high)
        report = m.report()
        if 0 in low + high:
            assert math.isinf(report.exact_epsilon_per_coordinate), (epsilon, clip, low, high)
        assert report.exact_epsilon_per_coordinate == pytest.approx(sampled, rel=1e-12), (epsilon, low, high)
        if report.exact_epsilon_per_record is not None and math.isfinite(sampled):
            assert report.exact_epsilon_per_record == pytest.approx(3 * sampled, rel=1e-12)


def test_ldpsign_turns_deterministic_where_the_issue_says() -> None:
    """c/σ ≳ 8.3: Φ(c/σ) rounds to 1 and p = c always gives +1 (issue 12)."""
    for epsilon in (1.0, 79.0, 82.0, 100.0):  # c/σ = ε/9.69: 0.10, 8.15, 8.46, 10.3
        m = mech.create_mechanism("ldpsign", epsilon=epsilon, clip=4.0, dim=1)
        deterministic = ldpsign_counts(m, 4.0)[1] == 0
        assert deterministic == (4.0 / m.sigma > 8.3), (epsilon, 4.0 / m.sigma)
        assert math.isinf(m.report().exact_epsilon_per_coordinate) == deterministic


def test_pdpm_far_from_zero_has_no_negative_probability() -> None:
    """c = 1e8, L = 1e-6 (issue 12): the centring rounds, t is clipped to [-1, 1], probabilities stay in [0, 1]."""
    m = mech.create_mechanism("pdpm", epsilon=2.0, safe_range_length=1e-6, center=1e8)
    centred = np.array(m.safe_range) - m.center
    p_high, p_low = mech.pdpm_probabilities(centred, 2.0, 1e-6)
    assert np.all(p_high >= 0) and np.all(p_low >= 0) and np.all(p_high + 2 * p_low <= 1 + 1e-15)
    y = m.randomize(np.linspace(1e8 - 1, 1e8 + 1, 10_000), rng=mech.default_rng(5))
    assert set(np.unique(y)) <= set(m.output_values())
    assert m.report().exact_epsilon_per_coordinate == pytest.approx(2.0, rel=1e-12)


@pytest.mark.parametrize("name", ["gaussian", "gaussian-wu", "fedaw-gaussian", "ldpsign", "pdpm"])
def test_tiny_epsilon_is_a_clean_value_error_or_a_valid_report(name: str) -> None:
    """ε = 1e-300 used to divide by zero in calibration.py (ε² underflows, e^ε - 1 = 0)."""
    try:
        report = mech.create_mechanism(name, epsilon=1e-300, dim=5).report()
    except ValueError as err:
        assert "epsilon" in str(err) and "\n" not in str(err)
    else:
        assert report.exact_epsilon_per_record is not None and report.exact_epsilon_per_record < 1e-6
    with pytest.raises(ValueError, match="epsilon=1e-300"):
        mech.calibration.gaussian_sigma_wu_eq4(1e-300, 1e-3, 0.9, 20)
    with pytest.raises(ValueError, match="epsilon=1e-300"):
        mech.calibration.pdpm_variance_bound(1e-300, 2.0)


@pytest.mark.parametrize("name", ["gaussian", "pdpm", "ldpsign"])
def test_dim_upper_bound(name: str) -> None:
    assert mech.create_mechanism(name, dim=10**7).dim == 10**7
    with pytest.raises(ValueError, match=r"dim must be an integer <= 10000000"):
        mech.create_mechanism(name, dim=10**7 + 1)
