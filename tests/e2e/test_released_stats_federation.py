"""Offline federation over ``stats:K`` files spends nothing (issue 40 item 2).

One small real export (MNIST-5k, ``--limit 600``, 2 silos, scatter, ``stats:32`` at ε 3 add/remove, with the clean
test files) serves every test. Over it run, once per module: the FC federation (``--eval-clean``), the closed-form
LDA head, a tuning sweep of its ``shrinkage`` and a second FC run. They must leave every figure of the guarantee and
every file as it was, state that stage 2 is post-processing of the released files, and evaluate on the silos' clean
test files (which a stats file's empty test split cannot give).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from cli_checks import assert_usage_error, ok
from cli_checks import run as invoke
from federate_files import write_run

import ldpfl
from ldpfl.contract.client_reader import read_client_file
from ldpfl.contract.release_guarantee import RELEASED_FILES_NOTE
from ldpfl.mechanisms.statistics_model import SHRINKAGE
from ldpfl.stage2_federate.closed_form import fit_lda, read_stats_run
from ldpfl.stage2_federate.ledger import CLOSED_FORM_COUNTED
from ldpfl.stage2_federate.model_file import read_model

EPSILON = 3.0
WIDTH = 32
CLASSES = 10
SWEEP = (0.01, 0.3, 1.0)
SMALL = ["--dataset", "mnist5k", "--limit", "600", "--clients", "2", "--extractor", "scatter", "--seed", "3",
         "--quiet"]


def file_state(run: Path) -> dict[str, Any]:
    """Return every file of the run (client files, clean files, manifest): its sha256 and, for HDF5, its attributes."""
    state: dict[str, Any] = {}
    for path in sorted(p for p in run.iterdir() if p.is_file() and not p.name.startswith(".")):
        entry: dict[str, Any] = {"sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
        if path.suffix == ".h5":
            with h5py.File(path, "r") as handle:
                entry["attrs"] = {k: repr(np.asarray(v).tolist()) for k, v in handle.attrs.items()}  # NaN == NaN
        state[path.name] = entry
    return state


def metrics(out: Path) -> dict[str, Any]:
    return json.loads((out / "metrics.json").read_text())


@pytest.fixture(scope="module")
def stats_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two silos' stats:32 files at ε 3 and their clean test files (about 8 s)."""
    out = tmp_path_factory.mktemp("released-stats") / "run"
    ok(invoke("export", *SMALL, "--release", f"stats:{WIDTH}", "--epsilon", EPSILON, "--keep-clean-test",
              "--out", out))
    return out


@pytest.fixture(scope="module")
def runs(stats_run: Path) -> dict[str, Any]:
    """Every federation over the same files, and the files' state before and after them all."""
    before = file_state(stats_run)
    out = stats_run.parent
    fc = out / "fc"
    text = ok(invoke("federate", stats_run, "--rounds", "2", "--hidden", "none", "--eval-clean", "--seed", "1",
                     "--out", fc))
    lda = out / "lda"
    shown = ok(invoke("federate", stats_run, "--head", "lda", "--eval-clean", "--out", lda)).output
    sweep = {s: ldpfl.federate(stats_run, head="lda", shrinkage=s, eval_clean=True, out=out / f"lda-{s}")
             for s in SWEEP}
    second = ldpfl.federate(stats_run, rounds=1, hidden=(16,), seed=2, out=out / "fc-2")
    outs = [fc, lda, *(r.outputs.directory for r in sweep.values()), second.outputs.directory]
    return {"before": before, "after": file_state(stats_run), "outs": outs, "fc": fc, "lda": lda, "sweep": sweep,
            "second": second, "fc_text": text.output, "lda_text": shown}


def test_every_run_leaves_the_files_and_every_guarantee_figure_as_they_were(stats_run: Path,
                                                                               runs: dict[str, Any]) -> None:
    assert runs["after"] == runs["before"]  # the files, their attributes and the manifest: untouched
    guarantees = [metrics(out)["release_guarantee"] for out in runs["outs"]]
    assert all(RELEASED_FILES_NOTE in g.pop("notes") for g in guarantees)  # beside it, whether clean figures were
    assert len(guarantees) == 2 + len(SWEEP) + 1 and all(g == guarantees[0] for g in guarantees[1:])  # every figure
    report = read_client_file(stats_run / "client_000.h5").metadata.privacy_report
    replace_one = report.probabilities["epsilon_replace_one"]
    first = guarantees[0]
    assert math.isclose(report.probabilities["epsilon_add_remove"], EPSILON, rel_tol=1e-6)
    assert first["epsilon"] == pytest.approx(replace_one, rel=1e-12) == first["epsilon_replace_one"]
    assert first["epsilon_add_remove"] == pytest.approx(EPSILON, rel=1e-6) and first["neighbours"]
    assert [c["epsilon_add_remove"] for c in first["clients"]] == [pytest.approx(EPSILON, rel=1e-6)] * 2
    assert [c["epsilon_replace_one"] for c in first["clients"]] == [pytest.approx(replace_one, rel=1e-12)] * 2


def test_the_ledger_says_stage_2_adds_nothing_to_the_released_files(runs: dict[str, Any]) -> None:
    for out in runs["outs"]:
        ledger = metrics(out)["privacy_ledger"]
        assert not ledger["adds_privacy_loss"] and RELEASED_FILES_NOTE in ledger["notes"]
        assert all(row["epsilon"] is None for row in ledger["clients"])
    lda = metrics(runs["lda"])
    assert lda["privacy_ledger"]["counted"] == CLOSED_FORM_COUNTED
    assert [row["rounds"] for row in lda["privacy_ledger"]["clients"]] == [0, 0]  # nothing uploaded
    assert all(entry["release"].startswith("none: the closed-form head uploads nothing") for entry in lda["privacy"])
    assert RELEASED_FILES_NOTE in runs["fc_text"] and RELEASED_FILES_NOTE in runs["lda_text"]
    assert "the closed-form head" in runs["lda_text"] and "(no round)" in runs["lda_text"]


def test_the_clean_evaluation_of_stats_files_gives_numbers(runs: dict[str, Any]) -> None:
    fc = metrics(runs["fc"])["rounds"]
    assert len(fc) == 2
    for record in fc:  # the shared files hold no test row: the clean test files are what measures the model
        assert record["test_accuracy"] is None and record["rejected"] == []
        assert 0.0 <= record["clean_test_accuracy"] <= 1.0 and math.isfinite(record["clean_test_loss"])
    (lda,) = metrics(runs["lda"])["rounds"]
    assert lda["clean_test_accuracy"] > 0.2 and lda["train_accuracy"] > 0.5  # 10 classes; ε 3 on 450 records
    assert "clean test accuracy" in runs["lda_text"] and "after the closed-form head lda (no round)" in runs["lda_text"]
    for shrinkage, result in runs["sweep"].items():
        assert result.record.history[0]["clean_test_accuracy"] is not None
        assert metrics(result.outputs.directory)["closed_form"]["shrinkage"] == shrinkage
    assert metrics(runs["lda"])["closed_form"]["shrinkage"] == SHRINKAGE
    assert runs["second"].test_accuracy == (None,)  # the FC run without eval_clean: no test row to measure


def test_the_lda_model_is_the_head_of_the_pooled_statistics_and_predict_reads_it(stats_run: Path,
                                                                                 runs: dict[str, Any]) -> None:
    saved = read_model(runs["lda"] / "model.pt")
    assert sorted(saved.state_dict) == ["net.0.bias", "net.0.weight"]
    assert tuple(saved.state_dict["net.0.weight"].shape) == (CLASSES, WIDTH)
    assert saved.trained_on is not None and saved.trained_on["model"]["hidden"] == []
    assert saved.trained_on["head"] == {"head": "lda", "shrinkage": SHRINKAGE}
    head = fit_lda([c.released for c in read_stats_run(stats_run).clients])
    np.testing.assert_array_equal(saved.state_dict["net.0.weight"].numpy(), head.weights.T)
    np.testing.assert_array_equal(saved.state_dict["net.0.bias"].numpy(), head.biases)
    correct = rows = 0
    for index in (0, 1):  # predict each silo's clean test records: together, the run's clean_test_accuracy
        local = stats_run / f"client_00{index}.local.h5"
        predicted = ldpfl.predict(released=local, model=runs["lda"] / "model.pt")
        labels = read_client_file(local).labels["test"]
        expected = (read_client_file(local).features["test"].astype(np.float64) @ head.weights.astype(np.float64)
                    + head.biases).argmax(axis=1)
        np.testing.assert_array_equal(predicted.predicted, expected)
        correct, rows = correct + int(np.sum(predicted.predicted == labels)), rows + len(labels)
    (record,) = metrics(runs["lda"])["rounds"]
    assert correct / rows == pytest.approx(record["clean_test_accuracy"], abs=1e-12)


@pytest.mark.parametrize(("args", "fragments"), [
    (["--head", "lda", "--dp-sgd", "--noise-multiplier", "1"], ["--head lda", "--dp-sgd"]),
    (["--head", "lda", "--perturbation", "ldpsign"], ["--head lda", "--perturbation"]),
    (["--head", "lda", "--engine", "flower"], ["--head lda", "--engine local"]),
    (["--head", "lda", "--resume"], ["--resume", "--head lda"]),
    (["--shrinkage", "0.5"], ["--shrinkage", "--head lda"]),
])
def test_settings_lda_cannot_take_are_refused_in_one_line_and_write_nothing(stats_run: Path, tmp_path: Path,
                                                                            args: list[str],
                                                                            fragments: list[str]) -> None:
    out = tmp_path / "refused"
    assert_usage_error(invoke("federate", stats_run, *args, "--out", out), *fragments)
    assert not out.exists()


def test_lda_over_files_that_are_not_stats_releases_is_refused(tmp_path: Path) -> None:
    run = write_run(tmp_path / "bits", clients=2)
    assert_usage_error(invoke("federate", run, "--head", "lda"), "--head lda", "stats:K", "client_000.h5")
    assert not (run / "federation").exists()
