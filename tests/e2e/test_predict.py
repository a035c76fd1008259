"""``ldpfl predict`` (issue 16 item 5): a silo's records through its pipeline and the federated model.

Done-when: on a silo's held-out records, ``predict`` reproduces the federated test accuracy of the run
that trained the model, on the same records and release:

* clean (default): the sum over the silos of the records predicted right equals the last round's
  ``clean_test_accuracy`` (``federate --eval-clean``) times the test rows, and every record's prediction
  equals the one made from the stored clean file ``client_NNN.local.h5``;
* the stored randomized rows (``--released client_NNN.h5``) reproduce ``test_accuracy`` exactly;
* ``--randomized`` draws fresh randomness (the stored draws came from the export's release stream, after
  the training split's), so its accuracy is compared within binomial standard errors.

The fast run is ``digits`` (raw features, extractor ``none``: no CNN); the CNN and the own-data cross-silo
runs are marked slow.
"""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_checks import assert_usage_error, ok, run

from ldpfl import prediction as pr
from ldpfl.contract.layout import client_file_name, local_file_name
from ldpfl.contract.plan import PLAN_FILE, read_plan
from ldpfl.stage2_federate.model import FederatedMLP
from ldpfl.stage2_federate.model_file import CLEAN_TEST, RANDOMIZED_TEST, read_model, save_model

CLIENTS = 3


def predict_json(*args: object) -> dict:
    return json.loads(ok(run("predict", *args, "--json", "--quiet")).stdout)


def last_round(run_dir: Path) -> dict:
    return json.loads((run_dir / "federation" / "metrics.json").read_text())["rounds"][-1]


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory) -> Path:
    """digits, 3 clients, uer (ε = 50) over the raw 64 values (r·l = 640 bits), clean test files, 3 rounds."""
    out = tmp_path_factory.mktemp("digits") / "run"
    ok(run("export", "--dataset", "digits", "--clients", CLIENTS, "--mechanism", "uer", "--epsilon", 50, "--seed", 3,
           "--keep-clean-test", "--quiet", "--out", out))
    ok(run("federate", out, "--rounds", 3, "--eval-clean", "--hidden", 64, "--optimizer", "adam", "--seed", 1,
           "--threads", 1, "--quiet"))
    return out


def test_the_saved_model_records_what_it_was_trained_on(digits_run: Path) -> None:
    saved = read_model(digits_run / "federation" / "model.pt")
    record = saved.trained_on
    assert record is not None and set(saved.state_dict) == {"net.0.weight", "net.0.bias", "net.3.weight",
                                                             "net.3.bias"}
    assert record["dataset"] == "digits" and record["num_classes"] == 10 and record["class_names"] is None
    assert record["plan_fingerprint"] is None and record["release"] == "flatten" and record["extractor"] == "none"
    assert (record["features"], record["integer_bits"], record["fraction_bits"]) == (64, 4, 5)
    assert record["feature_format"] == "packed-bits" and record["feature_width"] == 640
    assert record["mechanism"] == "uer" and [p["epsilon"] for p in record["mechanism_parameters"]] == [50.0]
    assert [c["file"] for c in record["clients"]] == [client_file_name(i) for i in range(CLIENTS)]
    assert record["model"] == {"input_width": 640, "hidden": [64], "num_classes": 10, "dropout": 0.1}
    assert record["evaluated_on"] == [RANDOMIZED_TEST, CLEAN_TEST]
    final = last_round(digits_run)
    assert record["last_round"] == {k: final[k] for k in ("round", "test_accuracy", "clean_test_accuracy")}
    # tensors and JSON only: a plain torch.load with weights_only reads it
    assert torch.load(digits_run / "federation" / "model.pt", weights_only=True)["format"] == "ldpfl-global-model"


def test_clean_predictions_reproduce_the_clean_test_accuracy(digits_run: Path) -> None:
    correct = total = 0
    for i in range(CLIENTS):
        fresh = predict_json(digits_run, "--client-index", i)
        stored = predict_json("--released", digits_run / local_file_name(i))
        assert fresh["inputs"] == "clean" and fresh["split"] == "test" and not fresh["privacy"]["randomized"]
        # record by record: the pipeline run on the raw records gives what the stored clean file gives
        assert [p["predicted_class"] for p in fresh["predictions"]] == [p["predicted_class"]
                                                                         for p in stored["predictions"]]
        assert [p["label"] for p in fresh["predictions"]] == [p["label"] for p in stored["predictions"]]
        correct, total = correct + fresh["correct"], total + fresh["records"]
        for summary in (fresh, stored):  # the silo's own held-out records in clear: its own figures, not released
            own = summary["own_heldout"]
            assert own["released"] is False and own["evaluated_on"] == "own-heldout" and "personalized" not in own
            assert (own["global"]["accuracy"], own["global"]["records"]) == (summary["accuracy"], summary["records"])
            assert own["global"]["per_class_accuracy"] == summary["per_class_accuracy"]
        labels = np.array([p["label"] for p in fresh["predictions"]])
        right = np.array([p["label"] == p["predicted_class"] for p in fresh["predictions"]])
        assert fresh["per_class_records"] == np.bincount(labels, minlength=10).tolist()
        expected = [pytest.approx(right[labels == c].mean()) if (labels == c).any() else None for c in range(10)]
        assert fresh["per_class_accuracy"] == expected
    final = last_round(digits_run)
    assert correct == round(final["clean_test_accuracy"] * total)
    assert len({p["predicted_class"] for p in fresh["predictions"]}) > 2  # not a constant model
    assert 0.3 < correct / total  # far above chance (0.1): the test can tell a broken pipeline


def test_stored_randomized_rows_reproduce_the_test_accuracy(digits_run: Path) -> None:
    results = [predict_json("--released", digits_run / client_file_name(i)) for i in range(CLIENTS)]
    assert all(r["inputs"] == "released" and r["privacy"]["randomized"] for r in results)
    # randomized rows a coordinator may hold too: per-class figures, but not the silo's own held-out block
    assert all("own_heldout" not in r and len(r["per_class_accuracy"]) == 10 for r in results)
    assert [sum(round(a * n) for a, n in zip(r["per_class_accuracy"], r["per_class_records"], strict=True) if n)
            for r in results] == [r["correct"] for r in results]
    total = sum(r["records"] for r in results)
    assert sum(r["correct"] for r in results) == round(last_round(digits_run)["test_accuracy"] * total)


def test_randomized_predictions_match_the_test_accuracy_within_its_error(digits_run: Path) -> None:
    # Fresh draws of the same mechanism (the stored test rows came from the export's release stream after
    # the training rows, which a fresh draw does not replay): the stored accuracy p is one draw over n
    # records, the mean of K fresh draws another, so |difference| <= 4 sqrt(p(1-p)/n (1 + 1/K)).
    model = pr.load_global_model(digits_run / "federation" / "model.pt")
    draws = 5
    correct = total = 0
    for i in range(CLIENTS):
        silo = pr.open_silo(digits_run, i)
        records = pr.silo_records(silo)
        for k in range(draws):
            result = pr.predict_silo(silo, records, model, randomized=True, rng=np.random.default_rng([i, k]))
            correct, total = correct + int(np.sum(result.predicted == result.labels)), total + len(result.labels)
    n = total // draws
    p = last_round(digits_run)["test_accuracy"]
    tolerance = 4 * math.sqrt(p * (1 - p) / n * (1 + 1 / draws))
    assert abs(correct / total - p) <= tolerance, (correct / total, p, tolerance)

    shown = ok(run("predict", digits_run, "--client-index", 0, "--randomized", "--seed", 11, "--json", "--quiet"))
    again = ok(run("predict", digits_run, "--client-index", 0, "--randomized", "--seed", 11, "--json", "--quiet"))
    assert "Warning: --randomized releases these 60 records again through mechanism 'uer'" in shown.stderr
    assert "evaluated on: randomized test splits, clean local test files" in shown.stderr
    summary = json.loads(shown.stdout)
    assert summary["inputs"] == "randomized" and summary["privacy"]["randomized"]
    assert summary["privacy"]["exact_epsilon_per_record"] > 0
    assert summary["predictions"] == json.loads(again.stdout)["predictions"]  # --seed: reproducible


def test_output_csv_json_and_progress(digits_run: Path, tmp_path: Path) -> None:
    shown = ok(run("predict", digits_run, "--client-index", 1))
    rows = list(csv.DictReader(io.StringIO(shown.stdout)))
    assert list(rows[0]) == ["index", "predicted_class", "label"] and len(rows) == 60
    assert "record" in shown.stderr and "accuracy" in shown.stderr  # tqdm bar and the summary on stderr
    written = ok(run("predict", digits_run, "--client-index", 1, "--out", tmp_path / "p.csv"))
    assert (tmp_path / "p.csv").read_text() == shown.stdout
    assert "accuracy" in written.stdout and "predictions written to" in written.stdout
    quiet = ok(run("predict", digits_run, "--client-index", 1, "--out", tmp_path / "p.json", "--quiet"))
    assert quiet.stdout == "" and quiet.stderr == ""
    data = json.loads((tmp_path / "p.json").read_text())
    assert [int(r["predicted_class"]) for r in rows] == [p["predicted_class"] for p in data["predictions"]]
    assert [int(r["index"]) for r in rows] == [p["index"] for p in data["predictions"]]
    assert data["summary"]["accuracy"] == pytest.approx(np.mean([r["predicted_class"] == r["label"] for r in rows]))
    # the index is the record's row in the dataset: the held-out split stored in partition.npz
    with np.load(digits_run / "partition.npz") as partition:
        assert [int(r["index"]) for r in rows] == partition["client_001_test"].tolist()


def test_help_shows_examples_and_imports_nothing_heavy() -> None:
    from heavy_imports import heavy_modules_after

    shown, heavy = heavy_modules_after(["predict", "--help"], ["--help"])
    assert heavy == []
    text = " ".join(shown.split())
    assert "ldpfl predict runs/mnist --client-index 0" in text and "--released" in text
    assert "no privacy is spent" in text and "predict a silo's records through its pipeline" in text


def _model_with(digits_run: Path, path: Path, **changes: object) -> Path:
    saved = read_model(digits_run / "federation" / "model.pt")
    model = FederatedMLP(640, [64], 10)
    model.load_state_dict(saved.state_dict)
    save_model(path, model, {**saved.trained_on, **changes})
    return path


def test_mismatching_or_missing_inputs_are_one_line_errors(digits_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "p.csv"
    assert_usage_error(run("predict", digits_run, "--client-index", 7, "--out", out),
                       "has no client_007.h5", "client files there: 0, 1, 2", "--client-index")
    assert_usage_error(run("predict", digits_run), "holds 3 client files", "--client-index")
    assert_usage_error(run("predict", digits_run, "--client-index", 0, "--model", tmp_path / "none.pt"),
                       "no federated model at", "--model")
    other = _model_with(digits_run, tmp_path / "other.pt", release="scores", plan_fingerprint="sha256:00",
                        mechanism_parameters=[{"epsilon": 4.0}])
    assert_usage_error(run("predict", digits_run, "--client-index", 0, "--model", other, "--out", out),
                       "was not trained on", "release is 'flatten' here, the model was trained on 'scores'",
                       "plan_fingerprint is None here", "mechanism_parameters")
    assert_usage_error(run("predict", "--released", digits_run / local_file_name(0), "--model", other),
                       "release is 'flatten' here")
    narrow = FederatedMLP(100, [8], 10)
    save_model(tmp_path / "narrow.pt", narrow, read_model(digits_run / "federation" / "model.pt").trained_on)
    assert_usage_error(run("predict", digits_run, "--client-index", 0, "--model", tmp_path / "narrow.pt"),
                       "feature_width is 640 here, the model takes 100")
    (tmp_path / "junk.pt").write_bytes(b"not a model")
    assert_usage_error(run("predict", digits_run, "--client-index", 0, "--model", tmp_path / "junk.pt"),
                       "junk.pt: not a model saved by ldpfl federate")
    assert_usage_error(run("predict", digits_run, "--client-index", 0, "--out", tmp_path / "p.txt"),
                       "--out must name a .csv or .json file")
    assert_usage_error(run("predict", digits_run, "--client-index", 0, "--seed", 3), "--seed applies to --randomized")
    assert_usage_error(run("predict", digits_run, "--released", digits_run / client_file_name(0)),
                       "--released predicts the rows stored in a client file: leave out RUN_DIR")
    assert_usage_error(run("predict", digits_run, "--client-index", 0, "--dataset", "covtype", "--split", "test"),
                       "--split test is a split of the records the run exported")
    assert not out.exists()


def test_a_model_saved_before_the_record_is_checked_by_shape_and_warned(digits_run: Path, tmp_path: Path) -> None:
    state = read_model(digits_run / "federation" / "model.pt").state_dict
    torch.save(state, tmp_path / "old.pt")  # what ldpfl federate wrote before trained_on existed
    shown = ok(run("predict", digits_run, "--client-index", 2, "--model", tmp_path / "old.pt", "--json", "--quiet"))
    assert "Warning: " in shown.stderr and "records nothing of what it was trained on" in shown.stderr
    assert json.loads(shown.stdout)["predictions"] == predict_json(digits_run, "--client-index", 2)["predictions"]


# ---------------------------------------------------------------------------------------------------
# Own data, one silo at a time (the cross-silo walkthrough), and the CNN path


def shapes(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` 8×8 grey images of 3 learnable classes (a bright band at a class-specific place)."""
    labels = np.arange(n) % 3
    images = rng.integers(0, 60, size=(n, 8, 8)).astype(np.uint8)
    for k in range(3):
        rows = labels == k
        images[rows, 2 * k:2 * k + 3, 1:7] = rng.integers(200, 256, size=(int(rows.sum()), 3, 6))
    return images, labels


@pytest.mark.slow
def test_a_silo_predicts_its_own_and_new_records_with_the_gathered_model(tmp_path: Path) -> None:
    rng = np.random.default_rng(16)
    names = np.array(["circle", "square", "star"])
    images, labels = shapes(rng, 200)
    silos = {0: tmp_path / "a.npz", 1: tmp_path / "b.npz"}
    np.savez(silos[0], x=images[:90], y=names[labels[:90]])
    np.savez(silos[1], x=images[90:180], y=names[labels[90:180]])
    np.savez(tmp_path / "new.npz", x=images[180:], y=names[labels[180:]])  # records the federation never saw
    plan_path = tmp_path / PLAN_FILE
    ok(run("plan", "--data", silos[0], "--name", "shapes", "--extractor", "none", "--mechanism", "uer",
           "--epsilon", 30, "-m", 1, "-n", 3, "--out", plan_path))
    exports = {}
    for index, data in silos.items():
        exports[index] = tmp_path / f"export_{index}"
        ok(run("export", "--plan", plan_path, "--data", data, "--client-index", index, "--clients", 2, "--seed",
               40 + index, "--keep-clean-test", "--quiet", "--out", exports[index]))
    run_dir = tmp_path / "run"
    ok(run("gather", *exports.values(), "--out", run_dir))
    ok(run("federate", run_dir, "--rounds", 3, "--hidden", 32, "--seed", 5, "--threads", 1, "--quiet"))
    model = run_dir / "federation" / "model.pt"
    assert read_model(model).trained_on["plan_fingerprint"] == read_plan(plan_path).fingerprint

    # silo 1, at home: its export directory (CNN-less pipeline, partition, clean file) and the returned model
    own = predict_json(exports[1], "--model", model)
    assert own["client_index"] == 1 and own["split"] == "test" and own["records"] == 9
    stored = predict_json("--released", exports[1] / local_file_name(1), "--model", model)
    assert [p["predicted_class"] for p in own["predictions"]] == [p["predicted_class"] for p in stored["predictions"]]
    assert {p["class_name"] for p in own["predictions"]} <= set(names)
    named = predict_json(exports[1], "--model", model, "--data", silos[1])  # the run's own file: its held-out split
    assert named["split"] == "test" and named["predictions"] == own["predictions"]

    fresh = ok(run("predict", exports[1], "--model", model, "--data", tmp_path / "new.npz"))
    rows = list(csv.DictReader(io.StringIO(fresh.stdout)))
    assert list(rows[0]) == ["index", "predicted_class", "class_name", "label"] and len(rows) == 20
    assert [int(r["label"]) for r in rows] == [list(names).index(n) for n in names[labels[180:]]]
    assert all(r["class_name"] == names[int(r["predicted_class"])] for r in rows)
    assert_usage_error(run("predict", exports[1], "--model", model, "--data", tmp_path / "new.npz", "--split",
                           "test"), "--split test is a split of the records the run exported")

    # a model trained under another plan is refused, naming the fingerprints
    moved = tmp_path / "export_moved"
    shutil.copytree(exports[1], moved)
    other = tmp_path / "other.pt"
    saved = read_model(model)
    mlp = FederatedMLP(saved.trained_on["feature_width"], [32], 3)
    mlp.load_state_dict(saved.state_dict)
    save_model(other, mlp, {**saved.trained_on, "plan_fingerprint": "sha256:" + "0" * 64})
    assert_usage_error(run("predict", moved, "--model", other), "plan_fingerprint is 'sha256:")


@pytest.mark.slow
def test_the_cnn_pipeline_reproduces_the_clean_test_accuracy(tmp_path: Path) -> None:
    out = tmp_path / "run"
    ok(run("export", "--dataset", "mnist5k", "--limit", 300, "--clients", 2, "--epochs", 4, "--batch-size", 16,
           "--no-augment", "--seed", 7, "--mechanism", "rr", "--epsilon", 4, "--save-models", "--keep-clean-test",
           "--quiet", "--out", out))
    ok(run("federate", out, "--rounds", 3, "--eval-clean", "--hidden", 64, "--seed", 1, "--threads", 1, "--quiet"))
    correct = total = 0
    for i in range(2):
        fresh = predict_json(out, "--client-index", i, "--threads", 1)
        stored = predict_json("--released", out / local_file_name(i))
        assert [p["predicted_class"] for p in fresh["predictions"]] == [p["predicted_class"]
                                                                         for p in stored["predictions"]]
        correct, total = correct + fresh["correct"], total + fresh["records"]
    assert correct == round(last_round(out)["clean_test_accuracy"] * total)
    randomized = ok(run("predict", out, "--client-index", 0, "--randomized", "--json", "--quiet", "--threads", 1))
    assert json.loads(randomized.stdout)["records"] == 15 and "Warning: --randomized" in randomized.stderr
    (out / "client_000.keras").unlink()
    assert_usage_error(run("predict", out, "--client-index", 0), "no saved CNN", "--save-models", "--cnn")


def test_the_flower_server_records_what_its_summaries_say(digits_run: Path, tmp_path: Path) -> None:
    from ldpfl.stage2_federate.config import FederationConfig
    from ldpfl.stage2_federate.data import load_run
    from ldpfl.stage2_federate.flower_engine import client_side as cs
    from ldpfl.stage2_federate.flower_engine.server_side import plan_from_summaries
    from ldpfl.stage2_federate.model_file import save_model, summary_record
    from ldpfl.stage2_federate.round_record import RoundRecord
    from ldpfl.stage2_federate.run_outputs import output_paths

    config = FederationConfig(rounds=1, hidden=(64,), seed=1)
    plan = plan_from_summaries(config, [cs.summarize(c) for c in load_run(digits_run).clients])
    paths = output_paths(tmp_path)
    save_model(paths["model"], plan.model,  # as the ServerApp's RunWriter.finish does
               summary_record(plan.clients, config, [RoundRecord(1, 0.0, 0.0, 0.0, 0.5, (0,), (), (), (0,), (1.0,),
                                                                   (None,), False, (), 0.0)]))
    record = read_model(paths["model"]).trained_on
    assert record["engine"] == "flower" and record["feature_width"] == 640 and record["mechanism"] == "uer"
    assert "release" not in record and "mechanism_parameters" not in record  # not in the summaries: not compared
    assert [c["file"] for c in record["clients"]] == [client_file_name(i) for i in range(CLIENTS)]
    assert record["last_round"] == {"round": 1, "test_accuracy": 0.5}
    shown = predict_json(digits_run, "--client-index", 0, "--model", paths["model"])
    assert shown["records"] == 60
