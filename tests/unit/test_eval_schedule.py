"""The evaluation schedule (``ldpfl federate --eval-every K``): which rounds are evaluated, and how many.

Every K-th round and the last are evaluated: ⌈R / K⌉ evaluations. The count is checked against the rule itself
over many (n, K, R); an unevaluated round's record round-trips, and only its row says so; the evaluation noise is
calibrated for the evaluated rounds; the configuration refuses a K that is not an integer >= 1, naming it. The
DP-SGD ledger's count is tested with the other ledger tests (``tests/unit/test_federation_privacy.py``).
"""

from __future__ import annotations

import math

import pytest

from ldpfl.common.errors import ParameterError
from ldpfl.stage2_federate.config import FederationConfig
from ldpfl.stage2_federate.round_record import RoundRecord
from ldpfl.stage2_federate.schedule import evaluations, is_evaluated
from ldpfl.stage2_federate.silo_training.dp_sgd_budget import plan_client
from ldpfl.stage2_federate.silo_training.evaluation_noise import calibrate


def evaluated_rounds(every: int, rounds: int) -> list[int]:
    return [t for t in range(1, rounds + 1) if is_evaluated(t, every=every, rounds=rounds)]


def test_every_round_is_evaluated_with_k_1() -> None:
    assert evaluated_rounds(1, 7) == [1, 2, 3, 4, 5, 6, 7]
    assert evaluations(7, every=1, rounds=7) == 7


def test_every_kth_round_and_the_last_are_evaluated() -> None:
    assert evaluated_rounds(3, 7) == [3, 6, 7]
    assert evaluated_rounds(3, 6) == [3, 6]  # the last is a multiple of K: evaluated once
    assert evaluated_rounds(10, 7) == [7]  # K > R: only the last
    assert evaluated_rounds(1, 1) == evaluated_rounds(5, 1) == [1]


def test_the_count_is_the_schedules_over_the_first_rounds() -> None:
    for rounds in range(1, 15):
        for every in range(1, 17):
            for first in range(rounds + 1):
                assert evaluations(first, every=every, rounds=rounds) == len(
                    [t for t in evaluated_rounds(every, rounds) if t <= first]), (first, every, rounds)
            assert evaluations(rounds, every=every, rounds=rounds) == math.ceil(rounds / every)


@pytest.mark.parametrize("call", [
    lambda: is_evaluated(0, every=1, rounds=3), lambda: is_evaluated(4, every=1, rounds=3),
    lambda: is_evaluated(1, every=0, rounds=3), lambda: evaluations(4, every=1, rounds=3),
    lambda: evaluations(1, every=True, rounds=3)])
def test_the_schedule_refuses_what_is_not_a_round_of_the_run(call) -> None:
    with pytest.raises(ValueError, match="must be an integer"):
        call()


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "3", None])
def test_the_configuration_refuses_a_bad_eval_every_naming_it(value) -> None:
    with pytest.raises(ParameterError) as raised:
        FederationConfig(eval_every=value)
    assert raised.value.parameters == ("eval_every",) and repr(value) in str(raised.value)


def test_the_configuration_takes_eval_every_and_writes_it() -> None:
    assert FederationConfig().eval_every == 1
    assert FederationConfig(rounds=7, eval_every=3).to_dict()["eval_every"] == 3


def record(number: int) -> RoundRecord:
    return RoundRecord(number, math.nan, math.nan, 0.5, 0.75, (0, 1), (), (), (0, 1), (0.5, 0.5), (None, None),
                       False, (), 0.0)


def test_an_unevaluated_round_round_trips_and_only_its_row_says_so() -> None:
    evaluated = record(3)
    assert "model_evaluated" not in evaluated.to_dict()  # rows of evaluated rounds are as before
    skipped = record(2).unevaluated(1.5)
    row = skipped.to_dict()
    assert row["model_evaluated"] is False and row["seconds"] == 1.5 and "per_client" not in row
    assert math.isnan(row["test_accuracy"]) and math.isnan(row["test_loss"])
    again = RoundRecord.from_dict(row)
    assert not again.model_evaluated and math.isnan(again.test_accuracy) and again.per_client == ()
    assert RoundRecord.from_dict(evaluated.to_dict()).model_evaluated


def test_the_evaluation_noise_is_calibrated_for_the_evaluated_rounds() -> None:
    common = dict(clip=0.1, delta=1e-5, neighbours="replace-one", rounds=7, local_steps=1, sample_rate=0.1,
                  batch_size=16, noise_multiplier=1.0, target_epsilon=None, eval_epsilon=2.0)
    every_third = plan_client(0, 100, eval_every=3, **common).evaluation
    every_round = plan_client(0, 100, **common).evaluation
    assert every_third is not None and every_round is not None
    assert every_third == calibrate(2.0, 1e-5, 3, neighbours="replace-one")
    assert every_round == calibrate(2.0, 1e-5, 7, neighbours="replace-one")
    assert every_third.planned_releases == 3 and every_third.sigma < every_round.sigma
