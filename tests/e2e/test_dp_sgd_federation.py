"""Record-level DP-SGD in stage 2 (``ldpfl federate --dp-sgd``): one accountant per silo over the whole run.

The ledger's figures are dp-accounting's own for the σ, q and steps each silo took; a resumed run restores the
accountant (its figures equal an uninterrupted run's); a run calibrated for a target cannot be extended past
it; the silos' evaluation replies carry the Gaussian noise their test records' figure accounts for, and with
``--eval-every K`` only every K-th round's and the last's (the noise calibrated for those, the training unchanged,
a resumed run on the same schedule, ``ldpfl inspect`` reading the run); bad combinations are refused in one line
with nothing written.
"""

from __future__ import annotations

import functools
import json
import math
import shutil
from pathlib import Path

import dp_accounting
import pytest
import torch
from cli_checks import command, one_error_line
from dp_accounting import pld
from federate_files import write_run

import ldpfl
from ldpfl.mechanisms import FLOAT32
from ldpfl.stage2_federate.config import FederationConfig
from ldpfl.stage2_federate.federation import run_federation
from ldpfl.stage2_federate.model_file import read_model
from ldpfl.stage2_federate.silo_training import evaluation_noise as noise

federate = command("federate")
DP = dict(hidden=(), dp_sgd=True, device="cpu", seed=3, lr=2.0)


@pytest.fixture(scope="module")
def float_run(tmp_path_factory) -> Path:
    """Four silos of 64 float32 training rows (8 values, 4 classes; tests/federate_files.py)."""
    return write_run(tmp_path_factory.mktemp("dp") / "run", clients=4, rows=64, features=8,
                     feature_format=FLOAT32)


@functools.cache  # silos that took as many steps share σ, q and δ: one dp-accounting PLD each
def _direct(sigma: float, q: float, steps: int, delta: float, relation) -> float:
    accountant = pld.PLDAccountant(relation)
    accountant.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps))
    return accountant.get_epsilon(delta)


def _metrics(result) -> dict:
    return json.loads(Path(result.outputs.metrics_json).read_text())


def test_each_silos_ledger_is_dp_accountings_over_the_steps_it_took(float_run, tmp_path):
    # a small target: a large σ, which dp-accounting's PLD calibrates and composes quickly
    result = ldpfl.federate(float_run, rounds=4, clients_per_round=2, target_epsilon=0.5, local_steps=2,
                            out=tmp_path / "fed", **DP)
    metrics = _metrics(result)
    selected = {c: sum(c in r["selected"] for r in metrics["rounds"]) for c in range(4)}
    assert sum(selected.values()) == 8  # 2 of 4 a round
    for row in metrics["privacy_ledger"]["clients"]:
        c = row["client"]
        assert row["steps"] == 2 * selected[c]
        sigma, q = row["noise_multiplier"], row["sampling_probability"]
        assert q == 0.1365  # the default Poisson rate under DP-SGD
        assert row["epsilon_replace_one"] == pytest.approx(
            _direct(sigma, q, row["steps"], 1e-5, dp_accounting.NeighboringRelation.REPLACE_ONE), rel=1e-9)
        assert row["epsilon_add_remove"] == pytest.approx(
            _direct(sigma, q, row["steps"], 1e-5, dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE), rel=1e-9)
        assert row["epsilon_replace_one"] <= 0.5  # the target, over every step the run may take
    guarantee = metrics["release_guarantee"]
    # synthetic files are shareable and unrandomized here: their figure is inf, DP-SGD's is the updates' alone
    assert guarantee["epsilon"] == "inf"
    assert all(row["updates_only"]["epsilon"] <= 0.5 for row in guarantee["clients"])
    assert metrics["config"]["dp_sgd"] is True and '"seed"' not in json.dumps(metrics)
    # the Poisson batches' loss and accuracy are clear-record statistics: they stay on the silo
    assert all(r["train_loss"] is None and r["train_accuracy"] is None for r in metrics["rounds"])
    assert all(r["test_accuracy"] is not None for r in metrics["rounds"])


def test_a_resumed_run_restores_the_accountant(float_run, tmp_path):
    common = dict(rounds=3, noise_multiplier=1.5, **DP)
    whole = _metrics(ldpfl.federate(float_run, out=tmp_path / "whole", **common))
    ldpfl.federate(float_run, out=tmp_path / "split", keep_checkpoint=True, **{**common, "rounds": 2})
    resumed = ldpfl.federate(float_run, out=tmp_path / "split", resume=True, **common)
    assert resumed.resumed_from_round == 2
    again = _metrics(resumed)
    assert [r["test_accuracy"] for r in again["rounds"]] == [r["test_accuracy"] for r in whole["rounds"]]
    assert again["privacy_ledger"]["clients"] == whole["privacy_ledger"]["clients"]
    assert {row["steps"] for row in again["privacy_ledger"]["clients"]} == {3}


def test_a_target_run_is_not_extended_past_its_target(float_run, tmp_path):
    out = tmp_path / "fed"
    args = [float_run, "--dp-sgd", "--target-epsilon", "0.5", "--hidden", "none", "--seed", "1", "--out", out, "-q"]
    assert federate(*args, "--rounds", "2", "--keep-checkpoint").exit_code == 0
    before = (out / "metrics.json").read_bytes()
    line = one_error_line(federate(*args, "--rounds", "3", "--resume"))
    assert "calibrated for 2 rounds" in line
    assert (out / "metrics.json").read_bytes() == before


def test_the_evaluation_replies_are_noised_and_accounted(float_run, tmp_path):
    """Same seed, clear against noised evaluation: the same training, test figures that differ by the noise alone.

    Each silo's count moves by N(0, σ²) rounded (and clamped): by at most 6σ + 1 in 12 draws but for a chance of
    about 2.4e-8, and the test records' ε is the accountant's for the replies sent.
    """
    common = dict(rounds=3, target_epsilon=0.5, **DP)
    clear = _metrics(ldpfl.federate(float_run, out=tmp_path / "clear", eval_epsilon=float("inf"), **common))
    noised = _metrics(ldpfl.federate(float_run, out=tmp_path / "noised", eval_epsilon=1.0, **common))
    rows = [{k: v for k, v in r.items() if not k.startswith("evaluation")} for r in clear["privacy_ledger"]["clients"]]
    assert rows == [{k: v for k, v in r.items() if not k.startswith("evaluation")}
                    for r in noised["privacy_ledger"]["clients"]]
    row = noised["privacy_ledger"]["clients"][0]
    sigma = row["evaluation_sigma"]
    assert row["evaluation_releases"] == 3 and row["evaluation_epsilon"] <= 1.0
    assert row["evaluation_epsilon"] == pytest.approx(noise.calibrate(1.0, 1e-5, 3, neighbours="replace-one")
                                                      .epsilon(3))
    gaps = [abs(a["test_accuracy"] - b["test_accuracy"]) * a["test_rows"]
            for x, y in zip(clear["rounds"], noised["rounds"], strict=True)
            for a, b in zip(x["per_client"], y["per_client"], strict=True)]
    assert len(gaps) == 12 and any(gap > 0 for gap in gaps)
    assert all(gap <= 6 * sigma + 1 for gap in gaps), (gaps, sigma)  # 6 standard deviations plus the rounding
    assert clear["privacy_ledger"]["clients"][0]["evaluation_epsilon"] == "inf"


def test_a_run_with_an_evaluation_budget_is_not_extended(float_run, tmp_path):
    out = tmp_path / "fed"
    args = [float_run, "--dp-sgd", "--noise-multiplier", "1.5", "--eval-epsilon", "1", "--hidden", "none", "--seed",
            "1", "--out", out, "-q"]
    assert federate(*args, "--rounds", "2", "--keep-checkpoint").exit_code == 0
    line = one_error_line(federate(*args, "--rounds", "3", "--resume"))
    assert "evaluation noise was calibrated for 2 rounds" in line


EVERY_THIRD = dict(rounds=7, eval_every=3, noise_multiplier=1.5, eval_epsilon=2.0, **DP)
"""``--eval-every 3 --rounds 7``: the global model is evaluated after rounds 3, 6 and 7 (σ given: no calibration)."""


@pytest.fixture(scope="module")
def every_third(float_run, tmp_path_factory) -> Path:
    """A copy of the run with an ``EVERY_THIRD`` federation in its own ``federation/`` (where inspect reads it)."""
    run = shutil.copytree(float_run, tmp_path_factory.mktemp("every") / "run")
    ldpfl.federate(run, **EVERY_THIRD)
    return run


def _without_timing(rounds: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rounds]


def test_eval_every_evaluates_every_kth_round_and_the_last_with_less_noise(every_third):
    metrics = json.loads((every_third / "federation" / "metrics.json").read_text())
    rounds = metrics["rounds"]
    assert [r["round"] for r in rounds if r["test_accuracy"] is not None] == [3, 6, 7]
    for r in rounds:
        evaluated = r["round"] in (3, 6, 7)
        assert (r["test_loss"] is not None) == evaluated and ("per_client" in r) == evaluated
        assert r.get("model_evaluated", True) == evaluated and 0.0 <= (r["test_accuracy"] or 0.0) <= 1.0
    assert metrics["config"]["eval_every"] == 3
    three, seven = (noise.calibrate(2.0, 1e-5, n, neighbours="replace-one") for n in (3, 7))  # K = 3, K = 1
    for row in metrics["privacy_ledger"]["clients"]:
        assert row["evaluation_releases"] == 3 and row["steps"] == 7
        assert row["evaluation_sigma"] == three.sigma < seven.sigma
        assert row["evaluation_epsilon"] == pytest.approx(three.epsilon(3)) and row["evaluation_epsilon"] <= 2.0
    assert "3 of the 7 rounds" in metrics["privacy_ledger"]["notes"][1]
    csv_rows = (every_third / "federation" / "metrics.csv").read_text().splitlines()[1:]
    assert [line.split(",")[4] != "" for line in csv_rows] == [t in (3, 6, 7) for t in range(1, 8)]


def test_skipping_evaluations_leaves_the_training_and_the_evaluated_figures_unchanged(float_run, tmp_path):
    """Evaluation in clear draws nothing: K = 3 gives K = 1's rounds, model and figures where it evaluates."""
    common = dict(rounds=5, eval_epsilon=math.inf, noise_multiplier=1.5, **DP)
    every = ldpfl.federate(float_run, out=tmp_path / "every", **common)
    some = ldpfl.federate(float_run, out=tmp_path / "some", eval_every=3, **common)
    for a, b in zip(every.rounds, some.rounds, strict=True):
        if b["round"] in (3, 5):
            assert a == {**b, "seconds": a["seconds"]}
        else:
            keys = [k for k in a if not k.startswith("test_") and k not in ("per_client", "seconds")]
            assert {k: a[k] for k in keys} == {k: b[k] for k in keys} and math.isnan(b["test_accuracy"])
    assert some.test_accuracy == (None, None, every.test_accuracy[2], None, every.test_accuracy[4])
    assert some.final_accuracy == every.final_accuracy == every.rounds[-1]["test_accuracy"]
    ledgers = [_metrics(r)["privacy_ledger"]["clients"] for r in (every, some)]
    assert [[row.pop("evaluation_releases") for row in rows] for rows in ledgers] == [[5] * 4, [2] * 4]
    assert ledgers[0] == ledgers[1]  # the same DP-SGD figures; the evaluation in clear (inf) either way
    a, b = (read_model(r.outputs.model).state_dict for r in (every, some))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("cut", [3, 4])
def test_a_resumed_run_keeps_the_evaluation_schedule(every_third, float_run, tmp_path, cut):
    """Interrupted after an evaluated (3) or an unevaluated (4) round, then resumed: the uninterrupted run's rows."""
    config = FederationConfig(**EVERY_THIRD)

    def stop(row: dict) -> None:
        if row["round"] == cut:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_federation(float_run, config, out_dir=tmp_path / "cut", progress=False, on_round=stop)
    resumed = run_federation(float_run, config, out_dir=tmp_path / "cut", resume=True, progress=False)
    assert resumed.resumed_from_round == cut
    whole = json.loads((every_third / "federation" / "metrics.json").read_text())
    again = json.loads((tmp_path / "cut" / "metrics.json").read_text())
    assert _without_timing(again["rounds"]) == _without_timing(whole["rounds"])
    assert again["privacy_ledger"] == whole["privacy_ledger"]


def test_inspect_reads_a_run_evaluated_every_third_round(every_third):
    inspect = command("inspect")
    text = inspect(every_third)
    assert text.exit_code == 0, text.output
    metrics = json.loads((every_third / "federation" / "metrics.json").read_text())
    accuracies = {r["round"]: r["test_accuracy"] for r in metrics["rounds"]}
    assert f"federation  7 rounds (3 evaluated), final test accuracy {accuracies[7]:.4f}" in text.output
    assert "over 3 noised evaluations" in text.output
    shown = inspect(every_third, "--json")
    assert shown.exit_code == 0, shown.output
    federation = json.loads(shown.stdout)["federation"]
    assert federation["final_test_accuracy"] == accuracies[7] and federation["problem"] is None
    assert federation["rounds"] == 7 and federation["evaluated_rounds"] == 3
    assert federation["best_test_accuracy"] == max(accuracies[t] for t in (3, 6, 7))
    assert federation["test_accuracy_per_round"] == [[t, accuracies[t]] for t in range(1, 8)]


@pytest.mark.parametrize(("flags", "fragment"), [
    (["--dp-sgd"], "exactly one of"),
    (["--dp-sgd", "--target-epsilon", "1", "--noise-multiplier", "1"], "not both"),
    (["--dp-sgd", "--target-epsilon", "1", "--perturbation", "gaussian"], "perturbation"),
    (["--target-epsilon", "1"], "dp-sgd"),
    (["--dp-sgd", "--target-epsilon", "1", "--delta", "1/n"], "delta"),
    (["--dp-sgd", "--noise-multiplier", "1", "--sensitivity", "1"], "sensitivity"),
    (["--dp-sgd", "--target-epsilon", "1", "--neighbours", "swap"], "neighbours"),
    (["--dp-sgd", "--target-epsilon", "1e-9", "--delta", "1e-12"], "out of reach"),
    (["--eval-epsilon", "1"], "apply to dp-sgd only"),
    (["--dp-sgd", "--target-epsilon", "1", "--eval-clean"], "eval-clean"),
    (["--dp-sgd", "--target-epsilon", "1", "--eval-epsilon", "0"], "eval-epsilon"),
    (["--dp-sgd", "--target-epsilon", "1", "--eval-every", "0"], "eval-every must be an integer >= 1, got 0"),
    (["--eval-every", "x"], "eval-every"),
])
def test_bad_dp_sgd_combinations_are_one_line_and_write_nothing(float_run, tmp_path, flags, fragment):
    out = tmp_path / "fed"
    line = one_error_line(federate(float_run, *flags, "--out", out))
    assert fragment in line.replace("`", "").replace("--", ""), line
    assert not out.exists()
