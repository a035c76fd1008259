"""The numpy bracket of the PLD accountant's ε (``ldpfl.mechanisms.accounting_bounds``), used by ``ldpfl inspect``.

Agreement between independent implementations: dp-accounting's figure (the exact accountant) lies in the bracket,
and the bracket is no wider than its grid allows. Pure parts alone are checked against their closed form.
"""

from __future__ import annotations

import math

import pytest

from ldpfl.mechanisms import accounting
from ldpfl.mechanisms.accounting_bounds import epsilon_bracket

CASES = [
    ([accounting.DpSgdEvent(1.1, 0.02, 800)], 1e-5),
    ([accounting.DpSgdEvent(1.1, 0.02, 800), accounting.RandomizedResponseEvent(2.0, 10),
      accounting.RandomizedResponseEvent(1.0, 10)], 1e-5),
    ([accounting.DpSgdEvent(2.0, 0.3, 5), accounting.PureEvent(0.5)], 1e-6),
]


@pytest.mark.parametrize(("events", "delta"), CASES)
def test_the_bracket_holds_dp_accountings_figure_and_is_as_narrow_as_its_grid(events: list, delta: float) -> None:
    bracket = epsilon_bracket(events, delta)
    exact = accounting.epsilon(events, delta)
    assert bracket.lower <= exact <= bracket.upper, (bracket, exact)
    steps = sum(e.steps for e in events if isinstance(e, accounting.DpSgdEvent))
    assert bracket.upper - bracket.lower <= 1.05 * (steps + len(events)) * bracket.grid + 0.005  # grid, δ margins


def test_pure_parts_alone_match_their_closed_form() -> None:
    # two k-RR parts at ε1, ε2: at δ = 0 their composition is exactly ε1 + ε2; the bracket at a tiny δ is just below
    bracket = epsilon_bracket([accounting.RandomizedResponseEvent(2.0, 10), accounting.PureEvent(1.0)], 1e-12)
    assert bracket.lower <= 3.0 + 1e-9 and bracket.upper >= accounting.epsilon(
        [accounting.RandomizedResponseEvent(2.0, 10), accounting.PureEvent(1.0)], 1e-12) - 1e-9
    assert bracket.lower > 3.0 - 0.05


def test_a_bad_delta_or_two_dp_sgd_runs_are_refused() -> None:
    with pytest.raises(ValueError, match="delta"):
        epsilon_bracket([accounting.PureEvent(1.0)], 0.0)
    with pytest.raises(ValueError, match="at most one DP-SGD"):
        epsilon_bracket([accounting.DpSgdEvent(1.0, 0.1, 3)] * 2, 1e-5)
    assert epsilon_bracket([accounting.DpSgdEvent(1.0, 0.1, 0)], 1e-5).upper == 0.0
    assert math.isfinite(epsilon_bracket([accounting.DpSgdEvent(0.5, 1.0, 1)], 1e-5).upper)
