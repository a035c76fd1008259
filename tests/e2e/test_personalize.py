"""``ldpfl personalize`` (issue 41): a silo's own model after a DP-SGD federation, made and kept on the silo.

One real run: MNIST-5k through the weight-free ScatterNet, 2 silos, local-only files, a 4-round DP-SGD federation
of a linear head with σ given (no calibration). Checked: the silo's ε over the federation and the fine-tuning (and
a resumed fine-tuning) is dp-accounting's own for the total steps; a clear-personalized model is marked local-only,
said so by ``predict`` and refused where a released model is expected; the interpolation weight does not move when
the test records change (it is chosen on the training records only, by cross-fitting); every refusal is one line,
exit 2, nothing written.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
from cli_checks import command, ok, one_error_line
from cli_checks import run as run_cli
from dp_accounting import pld
from federate_files import write_run

import ldpfl
from ldpfl.contract.digest import sha256_file
from ldpfl.mechanisms.randomness import make_randomness
from ldpfl.stage2_federate.model import FederatedMLP
from ldpfl.stage2_federate.model_file import read_model, save_model
from ldpfl.stage2_federate.personalize.run import personalize_silo, prepare, summary_lines
from ldpfl.stage2_federate.personalize.settings import PersonalizeSettings

personalize = command("personalize")
ROUNDS = 4
SIGMA = 2.0


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """Two local-only ScatterNet silos of MNIST-5k (270 training, 30 test records each) and a DP-SGD federation."""
    out = tmp_path_factory.mktemp("personalize") / "run"
    ldpfl.export(dataset="mnist5k", clients=2, extractor="scatter", limit=600, seed=3, local_only=True, out=out)
    ldpfl.federate(out, rounds=ROUNDS, dp_sgd=True, noise_multiplier=SIGMA, optimizer="sgd", hidden=(), seed=1,
                   device="cpu")
    return out


@pytest.fixture(scope="module")
def clear(run, tmp_path_factory) -> ldpfl.PersonalizeResult:
    """Client 0's clear-personalized model (local-only), from the run's global model."""
    return ldpfl.personalize(run, client_index=0, method="clear", epochs=2, seed=1,
                             out=tmp_path_factory.mktemp("clear") / "clear")


def _direct(sigma: float, q: float, steps: int, delta: float, relation) -> float:
    accountant = pld.PLDAccountant(relation)
    accountant.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps))
    return accountant.get_epsilon(delta)


def _ledger_row(run: Path, client: int) -> dict:
    metrics = json.loads((run / "federation" / "metrics.json").read_text())
    return next(r for r in metrics["privacy_ledger"]["clients"] if r["client"] == client)


def test_dp_fine_tuning_continues_the_silos_accountant(run, tmp_path):
    row = _ledger_row(run, 0)
    assert row["steps"] == ROUNDS  # one local step a round, every round
    first = ldpfl.personalize(run, client_index=0, method="dp", steps=5, seed=2, out=tmp_path / "dp")
    again = ldpfl.personalize(run, client_index=0, method="dp", steps=3, seed=3, resume=tmp_path / "dp",
                              out=tmp_path / "dp2")
    for result, steps in ((first, ROUNDS + 5), (again, ROUNDS + 5 + 3)):
        accountant = result.summary["accountant"]
        assert accountant["steps"] == steps and accountant["federation_steps"] == ROUNDS
        sigma, q = accountant["noise_multiplier"], accountant["sampling_probability"]
        assert (sigma, q, accountant["clip"]) == (SIGMA, row["sampling_probability"], row["clip"])
        for key, relation in (("epsilon_replace_one", dp_accounting.NeighboringRelation.REPLACE_ONE),
                              ("epsilon_add_remove", dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)):
            assert accountant[key] == pytest.approx(_direct(sigma, q, steps, 1e-5, relation), rel=1e-9)
        assert not result.local_only and result.epsilon == accountant["epsilon_replace_one"]
        assert result.epsilon > row["epsilon_replace_one"]  # the fine-tuning adds to the federation's figure
    shown = json.loads(ok(run_cli("inspect", again.out, "--json")).stdout)  # its folder: the model and accountant
    assert shown["kind"] == "client 0's personalized model (dp)" and shown["sha256"] == sha256_file(again.model)
    assert shown["personalization"]["released"] is True and shown["personalization"]["local_only"] is False
    assert shown["personalization"]["epsilon"] == again.epsilon and shown["personalization"]["steps"] == ROUNDS + 8
    assert f"may be released: epsilon {again.epsilon:.6g} at delta 1e-05 (replace-one)" in ok(
        run_cli("inspect", again.model)).output
    line = _refused(run, tmp_path, "--method", "dp", "--resume", again.out, "--steps", 200, "--max-epsilon",
                    round(again.epsilon + 0.01, 3))  # the bound applies to the resumed accountant's total
    assert f"({ROUNDS + 8} steps)" in line and "past --max-epsilon" in line
    mark = read_model(again.model).trained_on["personalization"]
    assert mark["local_only"] is False and mark["method"] == "dp"
    assert "own_heldout" not in json.dumps(read_model(again.model).trained_on)  # the clear figures stay out
    own = again.summary["own_heldout"]
    assert own["released"] is False and "NOT released" in own["note"]
    assert len(own["personalized"]["per_class_accuracy"]) == 10 and own["personalized"]["records"] == 30


def test_a_proximal_tie_keeps_the_dp_model_nearer_the_global_one_at_the_same_epsilon(run, tmp_path):
    """Ditto's λ (``proximal``) involves no record: the same accountant, a model nearer the global one."""
    start = read_model(run / "federation" / "model.pt").state_dict
    distance = {}
    for lam in (0.0, 1.0):
        result = ldpfl.personalize(run, client_index=0, method="dp", steps=5, lr=2.0, proximal=lam, seed=2,
                                   out=tmp_path / f"dp{lam:g}")
        assert result.summary["settings"]["proximal"] == lam
        assert result.summary["accountant"]["steps"] == ROUNDS + 5
        distance[lam] = (result.epsilon, sum(float((read_model(result.model).state_dict[k] - start[k]).norm() ** 2)
                                             for k in start) ** 0.5)
    assert distance[1.0][0] == distance[0.0][0]
    # the same noise (seed): each tied step divides the deviation by 1 + ηλ = 3, so it stays about one step's
    # size, while the untied one adds up 5 steps
    assert 0 < distance[1.0][1] < distance[0.0][1] / 2


def test_a_clear_model_is_local_only_and_refused_where_a_released_one_is_expected(run, clear, tmp_path):
    assert clear.local_only and clear.epsilon == float("inf")
    assert read_model(clear.model).trained_on["personalization"]["local_only"] is True
    predicted = ldpfl.predict(released=run / "client_000.h5", model=clear.model)
    assert any("LOCAL ONLY" in w for w in predicted.warnings)
    assert predicted.summary["model_personalization"]["local_only"] is True
    line = one_error_line(personalize(run, "--client-index", 0, "--method", "dp", "--model", clear.model,
                                      "--out", tmp_path / "from_clear"))
    assert "local-only model" in line and "not a released model" in line
    assert not (tmp_path / "from_clear").exists()


def test_inspect_describes_a_personalized_and_a_global_model(run, clear):
    text = ok(run_cli("inspect", clear.out)).output
    assert f"{clear.model}: client 0's personalized model (clear)" in text
    assert "LOCAL ONLY: trained on the silo's records in clear; epsilon = inf if shipped" in text
    shown = json.loads(ok(run_cli("inspect", clear.model, "--json")).stdout)
    assert shown["personalization"] | {"global_model_sha256": None} == {
        "method": "clear", "client_index": 0, "client_file": "client_000.h5", "global_model_sha256": None,
        "local_only": True, "released": False, "epsilon": "inf"}
    assert shown["personalization"]["global_model_sha256"] == sha256_file(run / "federation" / "model.pt")
    assert "a federation's global model" in ok(run_cli("inspect", run / "federation")).output
    line = one_error_line(run_cli("inspect", clear.model, "--plot", clear.out / "x.png"))
    assert "apply to client files, not to a model" in line and not (clear.out / "x.png").exists()


FIGURES = ("accuracy", "correct", "records", "per_class_accuracy", "per_class_records")


def test_predict_reports_the_silos_own_figures_of_the_personalized_and_the_global_model(run, clear, tmp_path):
    made = clear.summary["own_heldout"]
    shown = ldpfl.predict(released=run / "client_000.h5", model=clear.model)  # the local-only file's test split
    own = shown.summary["own_heldout"]
    assert own["released"] is False and own["evaluated_on"] == "own-heldout" and "NOT released" in own["note"]
    assert own["personalized"]["local_only"] is True and own["personalized"]["method"] == "clear"
    assert own["personalized"]["model"] == str(clear.model)
    assert own["global"]["model"] == str(run / "federation" / "model.pt")  # found by the sha256 the model records
    for role in ("global", "personalized"):  # the same rows, the same figures as the personalization's
        assert {k: own[role][k] for k in FIGURES} == {k: made[role][k] for k in FIGURES}, role
    assert len(own["global"]["per_class_accuracy"]) == 10 and own["global"]["records"] == 30
    through = ldpfl.predict(run, client_index=0, model=clear.model).summary["own_heldout"]  # the pipeline, rerun
    for role in ("global", "personalized"):  # a local-only file's clean rows are the extractor's values as they are
        assert {k: through[role][k] for k in FIGURES} == {k: made[role][k] for k in FIGURES}, role
    alone = ldpfl.predict(released=run / "client_000.h5").summary["own_heldout"]  # the global model by itself
    assert "personalized" not in alone and {k: alone["global"][k] for k in FIGURES} == {k: made["global"][k]
                                                                                          for k in FIGURES}
    text = ok(run_cli("predict", "--released", run / "client_000.h5", "--model", clear.model, "--out",
                      tmp_path / "q.csv")).stdout
    g, p = made["global"]["accuracy"], made["personalized"]["accuracy"]
    assert (f"own held-out accuracy (30 records): global {g:.4f}, personalized (clear, LOCAL ONLY) {p:.4f} -- kept on "
            "the silo, NOT released") in text
    assert "per class (global / personalized (clear, LOCAL ONLY); records): 0: " in text


def test_predict_refuses_a_global_model_the_personalization_did_not_start_from(run, clear, tmp_path):
    other = _crafted(run, tmp_path)  # the run's record, other weights: another sha256
    out = tmp_path / "p.csv"
    line = one_error_line(run_cli("predict", "--released", run / "client_000.h5", "--model", clear.model,
                                  "--global-model", other, "--out", out))
    assert "is not the global model" in line and "started from" in line
    line = one_error_line(run_cli("predict", "--released", run / "client_000.h5", "--global-model", other, "--out",
                                  out))
    assert "not a personalized model" in line
    assert not out.exists()


def test_personalize_prints_the_own_figures_per_class(run, clear):
    lines = summary_lines(clear.summary)
    made = clear.summary["own_heldout"]
    assert lines[1].startswith(f"own held-out accuracy (30 records): global {made['global']['accuracy']:.4f}, "
                               "personalized (clear, LOCAL ONLY) ")
    assert lines[2].startswith("  per class (global / personalized (clear, LOCAL ONLY); records): ")
    assert made["personalized"]["local_only"] is True and made["released"] is False


def test_the_interpolation_weight_is_chosen_on_training_records_only(run):
    settings = PersonalizeSettings("interpolate", epochs=3)
    prepared = prepare(run, 0, settings, model=run / "federation" / "model.pt")
    first = personalize_silo(prepared, make_randomness(5))
    records = prepared.records
    scrambled = dataclasses.replace(records, test_labels=(records.test_labels + 3) % 10,
                                    test_features=records.test_features[::-1].copy())
    second = personalize_silo(dataclasses.replace(prepared, records=scrambled), make_randomness(5))
    a, b = first.summary["interpolation"], second.summary["interpolation"]
    assert a["weight"] == b["weight"] and a["table"] == b["table"]
    assert first.summary["own_heldout"]["personalized"] != second.summary["own_heldout"]["personalized"]
    best = max(row["accuracy"] for row in a["table"])
    chosen = next(r for r in a["table"] if r["weight"] == a["weight"])["accuracy"]
    assert chosen == best or a["weight"] == 0.0  # the best, or the silo's own model (the one-SE rule)
    assert a["fold_sizes"] == [54] * 5  # the 270 training records, each scored once out of its fold


def _crafted(run: Path, tmp_path: Path, width: int | None = None, **changes) -> Path:
    """A copy of the run's model with ``changes`` to its record (and another input width), beside its metrics."""
    saved = read_model(run / "federation" / "model.pt")
    record = {**saved.trained_on, **changes}
    model = FederatedMLP(width or record["model"]["input_width"], [], 10, 0.0)
    folder = tmp_path / "crafted"
    folder.mkdir()
    shutil.copy(run / "federation" / "metrics.json", folder / "metrics.json")
    return save_model(folder / "model.pt", model, record)


def _refused(run: Path, tmp_path: Path, *args: object) -> str:
    out = tmp_path / "out"
    line = one_error_line(personalize(run, "--client-index", 0, "--out", out, *args))
    assert not out.exists()
    return line


def test_a_model_of_another_shape_or_feature_space_is_refused(run, tmp_path):
    line = _refused(run, tmp_path, "--method", "clear", "--model", _crafted(run, tmp_path, width=17))
    assert "feature_width is 3969 here, the model takes 17" in line
    other = tmp_path / "other"
    other.mkdir()
    line = _refused(run, other, "--method", "clear", "--model", _crafted(run, other, extractor="none"))
    assert "extractor is 'scatter' here" in line


def test_a_file_from_another_run_is_refused(run, tmp_path):
    record = read_model(run / "federation" / "model.pt").trained_on
    clients = [{**c, "sha256": "0" * 64} for c in record["clients"]]
    line = _refused(run, tmp_path, "--method", "clear", "--model", _crafted(run, tmp_path, clients=clients))
    assert "a file from another run" in line


def test_dp_fine_tuning_past_max_epsilon_is_refused_before_training(run, tmp_path):
    federation = _ledger_row(run, 0)["epsilon_replace_one"]
    line = _refused(run, tmp_path, "--method", "dp", "--steps", 200, "--max-epsilon", round(federation + 0.01, 3))
    assert "past --max-epsilon" in line and "--steps" in line


def test_resuming_on_another_silos_accountant_is_refused(run, tmp_path):
    ldpfl.personalize(run, client_index=1, method="dp", steps=2, seed=1, out=tmp_path / "silo1")
    line = _refused(run, tmp_path, "--method", "dp", "--resume", tmp_path / "silo1")
    assert "client 1's accountant" in line and "another silo's accountant" in line


@pytest.mark.parametrize(("args", "fragment"), [
    (("--method", "clear", "--proximal", 0.5), "--proximal ties DP fine-tuning"),
    (("--method", "dp", "--proximal", -1), "--proximal must be a finite number >= 0"),
])
def test_a_proximal_tie_outside_dp_fine_tuning_is_refused(run, tmp_path, args, fragment):
    assert fragment in _refused(run, tmp_path, *args)


def test_a_proximal_tie_on_a_resume_is_refused(run, tmp_path):
    ldpfl.personalize(run, client_index=0, method="dp", steps=2, seed=1, out=tmp_path / "first")
    line = _refused(run, tmp_path, "--method", "dp", "--resume", tmp_path / "first", "--proximal", 0.5)
    assert "which --resume does not read" in line


def test_dp_without_a_dp_sgd_federation_is_refused(run, tmp_path):
    model = _crafted(run, tmp_path)
    metrics = json.loads((model.parent / "metrics.json").read_text())
    metrics["config"]["dp_sgd"] = False
    (model.parent / "metrics.json").write_text(json.dumps(metrics))
    line = _refused(run, tmp_path, "--method", "dp", "--model", model)
    assert "did not train with DP-SGD" in line


def test_a_randomized_file_without_the_silos_clean_records_is_refused(tmp_path):
    synthetic = write_run(tmp_path / "randomized", clients=2, rows=16)
    line = _refused(synthetic, tmp_path, "--method", "clear")
    assert "client_000.local.h5" in line and "clean" in line


@pytest.fixture(scope="module")
def stats_run(tmp_path_factory) -> Path:
    """Two digits silos' stats:16 releases (raw values, epsilon 3), their clean test files, and the LDA head."""
    out = tmp_path_factory.mktemp("stats") / "run"
    ldpfl.export(dataset="digits", clients=2, extractor="none", release="stats:16", mechanism="gaussian-stats",
                 mechanism_params={"epsilon": 3.0}, keep_clean_test=True, seed=3, out=out)
    ldpfl.federate(out, head="lda")
    return out


def test_a_released_statistics_file_personalizes_on_the_silos_rebuilt_clean_records(stats_run, tmp_path):
    made = ldpfl.personalize(stats_run, client_index=0, method="clear", epochs=3, seed=1, out=tmp_path / "clear")
    summary = made.summary
    assert made.local_only and summary["records"]["source"].startswith("rebuilt on the silo from digits")
    assert summary["records"]["train"] == len(np.load(stats_run / "partition.npz")["client_000_train"])
    # the rebuilt test rows are those the silo kept (projected, clipped): the same figures as on its clean file
    kept = ldpfl.predict(released=stats_run / "client_000.local.h5", model=made.model).summary["own_heldout"]
    for role in ("global", "personalized"):
        assert {k: kept[role][k] for k in FIGURES} == {k: summary["own_heldout"][role][k] for k in FIGURES}, role
    assert summary["own_heldout"]["global"]["accuracy"] > 0.3  # the LDA head of two releases, far above chance


def test_dp_fine_tuning_of_a_released_statistics_file_is_refused(stats_run, tmp_path):
    line = _refused(stats_run, tmp_path, "--method", "dp")
    assert "released statistics once (stats:16)" in line and "no training accountant covers" in line


def test_a_statistics_file_without_the_silos_data_split_is_refused(stats_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(stats_run, copy)
    (copy / "partition.npz").unlink()
    line = _refused(copy, tmp_path, "--method", "clear")
    assert "client_000.local.h5 holds test records only" in line and "nor could it rebuild" in line
    assert "partition.npz" in line


def test_help_and_json(run, tmp_path):
    assert "--max-epsilon" in personalize("--help").output
    result = personalize(run, "--client-index", 1, "--method", "interpolate", "--epochs", 2, "--seed", 1, "--json",
                         "--out", tmp_path / "i")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["local_only"] is True and summary["shipping"]["epsilon"] == "inf"
    assert 0.0 <= summary["interpolation"]["weight"] <= 1.0
    assert np.isfinite(summary["own_heldout"]["global"]["accuracy"])
