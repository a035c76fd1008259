"""The DP-SGD extractor (issue 22 item 3): ``ldpfl export --cnn-epsilon E --cnn-delta D``.

Refusals (one ``Error:`` line, exit 2, nothing written), the DP nets (no batch-mixing layer), the record
``extractor_training`` of the client files, its carrying over by ``--from-models``, and the accounting
recomputed independently with dp-accounting, also for the file's one guarantee over the DP CNN, the values and the
labels (issue 22 items 1 and 4). DP training runs on Keras' JAX backend, which a process picks
once: exports that train run in a fresh process.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import dp_accounting
import h5py
import pytest
from cli_checks import one_error_line, run
from click.testing import CliRunner
from dp_accounting.pld import PLDAccountant
from repository import ROOT

from ldpfl.cli import cli
from ldpfl.common.errors import ParameterError
from ldpfl.contract import release_guarantee as rg
from ldpfl.contract.client_reader import read_client_file
from ldpfl.contract.layout import client_file_name
from ldpfl.stage1_features.export.config import ExportConfig
from ldpfl.stage1_features.models import cnn, dp_training

DP_FIELDS = {"training", "epsilon", "delta", "noise_multiplier", "sampling_probability", "steps", "records",
             "clipping_norm", "library", "accountant"}


def independent_epsilon(sigma: float, q: float, steps: int, delta: float) -> float:
    """ε of T self-composed Poisson-subsampled Gaussian steps by dp-accounting's PLD accountant (finer grid)."""
    accountant = PLDAccountant(value_discretization_interval=1e-4)
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    return float(accountant.get_epsilon(delta))


def ldpfl_in_fresh_process(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.run([sys.executable, "-c", "from ldpfl.cli import main; main()", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("args", "flag"), [
    (["--cnn-epsilon", "0"], "--cnn-epsilon"),
    (["--cnn-epsilon", "-1"], "--cnn-epsilon"),
    (["--cnn-epsilon", "nan"], "--cnn-epsilon"),
    (["--cnn-epsilon", "inf"], "--cnn-epsilon"),
    (["--cnn-epsilon", "100.5"], "--cnn-epsilon"),
    (["--cnn-epsilon", "2", "--cnn-delta", "0"], "--cnn-delta"),
    (["--cnn-epsilon", "2", "--cnn-delta", "1"], "--cnn-delta"),
    (["--cnn-epsilon", "2", "--cnn-delta", "nan"], "--cnn-delta"),
    (["--cnn-delta", "1e-5"], "--cnn-epsilon"),
    (["--cnn-epsilon", "2", "--keras-backend", "tensorflow"], "--keras-backend"),
    (["--cnn-epsilon", "2", "--noise-aware", "--release", "bottleneck:4", "--mechanism", "duchi"], "--noise-aware"),
])
def test_a_bad_dp_budget_is_one_error_line_and_writes_nothing(tmp_path: Path, args: list[str], flag: str) -> None:
    out = tmp_path / "run"
    line = one_error_line(run("export", *args, "--out", out, "--quiet"))
    assert flag in line
    assert not out.exists()


def test_the_config_names_the_parameters_and_picks_jax_without_augmentation() -> None:
    for bad in (0.0, math.nan, math.inf, 101.0, True):
        with pytest.raises(ParameterError, match="cnn_epsilon"):
            ExportConfig(cnn_epsilon=bad)
    with pytest.raises(ParameterError, match="cnn_delta"):
        ExportConfig(cnn_epsilon=1.0, cnn_delta=1.5)
    with pytest.raises(ParameterError, match="cnn_epsilon"):
        ExportConfig(cnn_delta=1e-6)
    config = ExportConfig(cnn_epsilon=4)
    assert (config.keras_backend, config.cnn_delta, config.training().augment) == ("jax", 1e-5, False)
    assert config.dp_budget() == dp_training.DPBudget(4.0, 1e-5)
    assert ExportConfig().keras_backend == "tensorflow" and ExportConfig().dp_budget() is None


def test_auto_picks_the_small_dp_net_where_the_paper_uses_a_cnn() -> None:
    assert cnn.resolve_extractor(cnn.AUTO, "fashion-mnist", dp=True) == "dp-cnn"
    assert cnn.resolve_extractor(cnn.AUTO, "mnist5k", dp=True) == "dp-cnn"
    assert cnn.resolve_extractor(cnn.AUTO, "covtype", dp=True) == cnn.NO_EXTRACTOR
    assert cnn.resolve_extractor(cnn.AUTO, "fashion-mnist") == cnn.CIFAR_CNN  # the paper's, without DP


@pytest.mark.parametrize("shape", [(28, 28, 1), (32, 32, 3)])
def test_batchnorm_nets_are_refused_and_the_dp_variants_mix_no_records(shape: tuple[int, int, int]) -> None:
    for name in (cnn.MNIST_CNN, cnn.CIFAR_CNN):
        with pytest.raises(ParameterError, match="BatchNormalization"):
            dp_training.refuse_batch_mixing(cnn.build_model(name, shape, 10), name)
    for name in ("mnist-cnn-gn", "cifar-cnn-gn", "dp-cnn"):
        model = cnn.build_model(name, shape, 10)
        assert dp_training.batch_mixing_layers(model) == []
        assert "DEVIATION" in cnn.architecture(name).summary
        assert int(model.get_layer(cnn.FLATTEN_LAYER).output.shape[-1]) == cnn.flatten_width(name, shape)


def test_the_library_calibration_meets_the_target_by_dp_accountings_own_count() -> None:
    budget = dp_training.DPBudget(2.0, 1e-5)
    batch, steps = dp_training.dp_plan(records=1000, batch_size=50, epochs=10)
    assert (batch, steps) == (50, 200)
    sigma = dp_training.dp_keras_config(budget, batch, 1000, steps, seed=0).noise_multiplier
    recorded = dp_training.accountant_epsilon(sigma, batch, 1000, steps, budget.delta)
    ours = independent_epsilon(sigma, batch / 1000, steps, budget.delta)
    assert ours <= budget.epsilon + 1e-3 and recorded <= budget.epsilon
    assert abs(ours - recorded) < 0.01  # two PLD discretizations (1e-3, 1e-4) of the same event
    # a smaller σ would have exceeded the target: the calibration is tight, not just safe
    assert independent_epsilon(0.95 * sigma, batch / 1000, steps, budget.delta) > budget.epsilon


def test_a_batchnorm_extractor_or_none_under_dp_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    for extractor, fragment in (("cifar-cnn", "BatchNormalization"), ("none", "trains none")):
        out = tmp_path / extractor
        done = ldpfl_in_fresh_process("export", "--cnn-epsilon", "2", "--extractor", extractor, "--limit", "100",
                                      "--out", str(out), "--quiet")
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and lines[-1].startswith("Error: "), done.stderr[-2000:]
        assert fragment in lines[-1] and "--extractor" in lines[-1] and "Traceback" not in done.stderr
        assert not out.exists()


@pytest.fixture(scope="module")
def dp_export(tmp_path_factory) -> tuple[Path, dict]:
    """One DP-SGD export (ε 4, δ 1e-5) with k-RR class values (ε 2) and k-RR labels (ε 1), its models saved.

    Shared by the two tests below (each DP-SGD export compiles the DP training step anew in a fresh interpreter).
    Returns the run directory and the command's ``--json`` summary.
    """
    source = tmp_path_factory.mktemp("dp") / "dp"
    done = ldpfl_in_fresh_process("export", "--cnn-epsilon", "4", "--cnn-delta", "1e-5", "--limit", "100",
                                  "--clients", "1", "--epochs", "1", "--batch-size", "30", "--mechanism", "krr",
                                  "--release", "label", "--epsilon", "2", "--label-epsilon", "1", "--save-models",
                                  "--seed", "5", "--out", str(source), "--quiet", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    return source, json.loads(done.stdout)


@pytest.mark.slow
def test_a_dp_export_records_its_training_and_from_models_carries_it(dp_export, tmp_path: Path) -> None:
    source, summary = dp_export
    again = tmp_path / "again"
    assert summary["extractor"] == "dp-cnn"
    records = {}
    for client in range(1):
        meta = read_client_file(source / client_file_name(client)).metadata
        record = dict(meta.extractor_training)
        assert DP_FIELDS <= set(record) and record["training"] == "dp-sgd", record
        n = meta.label_histograms["train"]
        assert record["records"] == sum(n) and record["library"] == "jax-privacy 2.0.0"
        batch, steps = dp_training.dp_plan(record["records"], 30, 1)
        assert record["steps"] == steps and record["sampling_probability"] == pytest.approx(batch / sum(n))
        ours = independent_epsilon(record["noise_multiplier"], record["sampling_probability"], record["steps"],
                                   record["delta"])
        assert ours <= 4.0 + 1e-3 and record["epsilon"] <= 4.0
        assert ours == pytest.approx(record["epsilon"], abs=0.01)
        records[client] = record
    done = ldpfl_in_fresh_process("export", "--from-models", str(source), "--mechanism", "krr", "--release", "label",
                                  "--epsilon", "1", "--seed", "6", "--out", str(again), "--quiet")
    assert done.returncode == 0, done.stderr[-3000:]
    for client in range(1):
        with h5py.File(again / client_file_name(client)) as handle:
            assert json.loads(handle.attrs["extractor_training"]) == records[client]


def independent_pld(events: list, delta: float) -> float:
    """ε of ``events`` composed by dp-accounting's PLD accountant (replace-one, its default grid)."""
    accountant = PLDAccountant(dp_accounting.NeighboringRelation.REPLACE_ONE)
    for event in events:
        accountant.compose(event)
    return float(accountant.get_epsilon(delta))


@pytest.mark.slow
def test_a_dp_extractor_with_private_labels_gives_dp_accountings_composition(dp_export) -> None:
    run, _ = dp_export  # issue 22 items 1 and 4: the file's one guarantee over the DP CNN, the values and the labels
    report = json.loads(CliRunner().invoke(cli, ["inspect", str(run), "--json"]).stdout)
    guarantee = report["files"][0]["release_guarantee"]
    with h5py.File(run / client_file_name(0), "r") as handle:
        sgd = json.loads(handle.attrs["extractor_training"])
        labels = json.loads(handle.attrs["label_release"])
        values_eps = float(handle.attrs["exact_epsilon_per_record"])
    k = 10
    events = [dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
                  sgd["sampling_probability"], dp_accounting.GaussianDpEvent(sgd["noise_multiplier"])), sgd["steps"]),
              dp_accounting.RandomizedResponseDpEvent(k / (math.exp(values_eps) + k - 1), k),  # the class, by k-RR
              dp_accounting.RandomizedResponseDpEvent(k / (math.exp(labels["epsilon"]) + k - 1), k)]
    assert guarantee["private"] and guarantee["delta"] == 1e-5 and guarantee["method"] == rg.METHOD_PLD
    assert guarantee["epsilon"] == pytest.approx(independent_pld(events, 1e-5), rel=1e-9)
    assert {p["kind"] for p in guarantee["parts"]} == {"features", "labels", "extractor"}


def test_raw_features_record_no_training(tmp_path: Path) -> None:
    out = tmp_path / "raw"
    result = run("export", "--dataset", "digits", "--extractor", "none", "--mechanism", "none", "--limit", "60",
                 "--seed", "1", "--out", out, "--quiet")
    assert result.exit_code == 0, result.output
    assert read_client_file(out / client_file_name(0)).metadata.extractor_training == {"training": "none"}
