"""Record-level DP-SGD in stage 2 (``ldpfl federate --dp-sgd``): one accountant per silo over the whole run.

The ledger's figures are dp-accounting's own for the σ, q and steps each silo took; a resumed run restores the
accountant (its figures equal an uninterrupted run's); a run calibrated for a target cannot be extended past
it; the silos' evaluation replies carry the Gaussian noise their test records' figure accounts for; bad
combinations are refused in one line with nothing written.
"""

from __future__ import annotations

import json
from pathlib import Path

import dp_accounting
import pytest
from cli_checks import command, one_error_line
from dp_accounting import pld
from federate_files import write_run

import ldpfl
from ldpfl.mechanisms import FLOAT32
from ldpfl.stage2_federate import evaluation_noise as noise

federate = command("federate")
DP = dict(hidden=(), dp_sgd=True, device="cpu", seed=3, lr=2.0)


@pytest.fixture(scope="module")
def float_run(tmp_path_factory) -> Path:
    """Four silos of 64 float32 training rows (8 values, 4 classes; tests/federate_files.py)."""
    return write_run(tmp_path_factory.mktemp("dp") / "run", clients=4, rows=64, features=8,
                     feature_format=FLOAT32)


def _direct(sigma: float, q: float, steps: int, delta: float, relation) -> float:
    accountant = pld.PLDAccountant(relation)
    accountant.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps))
    return accountant.get_epsilon(delta)


def _metrics(result) -> dict:
    return json.loads(Path(result.outputs.metrics_json).read_text())


def test_each_silos_ledger_is_dp_accountings_over_the_steps_it_took(float_run, tmp_path):
    result = ldpfl.federate(float_run, rounds=4, clients_per_round=2, target_epsilon=2.0, local_steps=2,
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
        assert row["epsilon_replace_one"] <= 2.0  # the target, over every step the run may take
    guarantee = metrics["release_guarantee"]
    # synthetic files are shareable and unrandomized here: their figure is inf, DP-SGD's is the updates' alone
    assert guarantee["epsilon"] == "inf"
    assert all(row["updates_only"]["epsilon"] <= 2.0 for row in guarantee["clients"])
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
    args = [float_run, "--dp-sgd", "--target-epsilon", "2", "--hidden", "none", "--seed", "1", "--out", out, "-q"]
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
    common = dict(rounds=3, target_epsilon=2.0, **DP)
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
])
def test_bad_dp_sgd_combinations_are_one_line_and_write_nothing(float_run, tmp_path, flags, fragment):
    out = tmp_path / "fed"
    line = one_error_line(federate(float_run, *flags, "--out", out))
    assert fragment in line.replace("`", "").replace("--", ""), line
    assert not out.exists()
