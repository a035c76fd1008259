"""``ldpfl export --release stats:K`` (issue 40): the file, its guarantee, its determinism, every refusal.

MNIST-5k through the ScatterNet with ``--limit 600`` (about 270 training records a client): seconds a test.
"""

from __future__ import annotations

import math
from pathlib import Path

import h5py
import numpy as np
import pytest
from cli_checks import assert_usage_error
from cli_checks import run as invoke

import ldpfl
from ldpfl.contract import released_statistics
from ldpfl.contract.client_reader import open_client_file, read_client_file
from ldpfl.contract.run_dir import validate_run
from ldpfl.mechanisms import accounting
from ldpfl.mechanisms import sufficient_statistics as ss
from ldpfl.mechanisms.gaussian_statistics import GaussianStatistics

SMALL = ["--dataset", "mnist5k", "--limit", "600", "--clients", "2", "--quiet", "--extractor", "scatter"]
STATS = ["--release", "stats:32", "--epsilon", "2"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("stats") / "run"
    result = invoke("export", *SMALL, *STATS, "--seed", "5", "--keep-clean-test", "--out", out)
    assert result.exit_code == 0, result.output
    return out


def test_the_file_holds_synthetic_rows_and_the_release(run: Path) -> None:
    validate_run(run)  # every file passes the run's checks, the statistics' own included
    for index in (0, 1):
        data = read_client_file(run / f"client_00{index}.h5")
        meta = data.metadata
        assert (meta.release, meta.mechanism, meta.features, meta.feature_format) == (
            "stats:32", "gaussian-stats", 32, "float32")
        assert len(data.labels["test"]) == 0 and len(data.labels["train"]) > 200
        assert meta.label_release is not None and meta.label_release.synthetic
        with open_client_file(run / f"client_00{index}.h5") as (handle, metadata, _):
            released = released_statistics.read_release(handle, metadata)
            assert released_statistics.statistics_problems(handle, metadata) == []
        counts = np.rint(released.statistics.counts).astype(int)
        assert meta.label_histograms["train"] == np.maximum(counts, 1).tolist() or \
            sum(meta.label_histograms["train"]) == len(data.labels["train"])
        local = read_client_file(run / f"client_00{index}.local.h5")  # the clean test records, projected, kept
        assert local.metadata.local_only and local.features["test"].shape[1] == 32
        clip = GaussianStatistics(epsilon=2.0, width=32).clip_for(32)
        assert np.linalg.norm(local.features["test"], axis=1).max() <= clip * (1 + 1e-6)


def test_the_guarantee_is_the_release_under_both_relations(run: Path) -> None:
    meta = read_client_file(run / "client_000.h5").metadata
    report = meta.privacy_report
    mechanism = GaussianStatistics(epsilon=2.0, width=32)
    assert report.probabilities["epsilon_add_remove"] == pytest.approx(2.0, abs=1e-6)
    factor = ss.replace_one_factor(centered=True)
    replace_one = accounting.epsilon([accounting.GaussianEvent(1 / (mechanism.mu * factor))], 1e-5,
                                     neighbours=accounting.ADD_REMOVE)
    assert report.exact_epsilon_per_record == pytest.approx(replace_one, rel=1e-9)
    guarantee = meta.release_guarantee
    assert guarantee is not None and guarantee.epsilon == pytest.approx(replace_one, rel=1e-9)
    parts = {p.kind: p.epsilon for p in guarantee.parts}
    assert parts == {"features": pytest.approx(replace_one), "labels": 0.0, "extractor": 0.0}


def test_inspect_flags_a_synthetic_row_the_statistics_do_not_give(run: Path, tmp_path: Path) -> None:
    copy = tmp_path / "client_000.h5"
    copy.write_bytes((run / "client_000.h5").read_bytes())
    with h5py.File(copy, "r+") as handle:
        handle["train/features"][3, :] = handle["train/features"][3, :] + 1.0
    with open_client_file(copy) as (handle, metadata, _):
        (problem,) = released_statistics.statistics_problems(handle, metadata)
    assert "train/features row 3 differs" in problem


def test_a_seeded_release_writes_the_same_files_on_every_executor(run: Path, tmp_path: Path) -> None:
    """Serial (the fixture) and two worker processes: the same statistics, synthetic rows and labels."""
    out = tmp_path / "parallel"
    result = invoke("export", *SMALL, *STATS, "--seed", "5", "--clients-parallel", "2", "--out", out)
    assert result.exit_code == 0, result.output
    for index in (0, 1):
        with h5py.File(run / f"client_00{index}.h5") as one, h5py.File(out / f"client_00{index}.h5") as two:
            for name in ("train/features", "train/labels", *(f"released_statistics/{d}"
                                                             for d in released_statistics.DATASETS)):
                np.testing.assert_array_equal(one[name][...], two[name][...], err_msg=name)


def test_the_api_names_it_as_the_cli_does(tmp_path: Path) -> None:
    result = ldpfl.export(dataset="mnist5k", clients=2, extractor="scatter", limit=400, release="stats:16",
                          mechanism_params={"epsilon": 1.0, "delta": 1e-4, "projection_key": 7}, seed=1,
                          out=tmp_path / "api")
    assert (result.release, result.mechanism, result.features) == ("stats:16", "gaussian-stats", 16)
    meta = read_client_file(tmp_path / "api" / "client_000.h5").metadata
    assert meta.mechanism_parameters["projection_key"] == 7 and meta.mechanism_parameters["delta"] == 1e-4
    assert math.isclose(meta.privacy_report.probabilities["epsilon_add_remove"], 1.0, abs_tol=1e-6)


@pytest.mark.parametrize(("args", "fragments"), [
    (["--epsilon", "0"], ["epsilon"]),
    (["--epsilon", "-1"], ["epsilon"]),
    (["--epsilon", "nan"], ["epsilon"]),
    (["--epsilon", "inf"], ["epsilon"]),
    (["--epsilon", "2", "--delta", "0.01"], ["delta", "1/n"]),
    (["--epsilon", "2", "--delta", "1.5"], ["delta"]),
    (["--epsilon", "2", "--label-epsilon", "1"], ["--label-epsilon"]),
])
def test_bad_budgets_are_refused_in_one_line_and_write_nothing(tmp_path: Path, args: list[str],
                                                               fragments: list[str]) -> None:
    out = tmp_path / "bad"
    assert_usage_error(invoke("export", *SMALL, "--release", "stats:32", *args, "--out", out), *fragments)
    assert not out.exists() or not any(out.iterdir())


def test_k_larger_than_the_features_and_a_trained_extractor_are_refused(tmp_path: Path) -> None:
    out = tmp_path / "bad"
    assert_usage_error(invoke("export", *SMALL, "--release", "stats:4000", "--epsilon", "1", "--out", out),
                       "3969")
    assert_usage_error(invoke("export", "--dataset", "mnist5k", "--limit", "300", "--extractor", "mnist-cnn",
                              "--release", "stats:32", "--epsilon", "1", "--out", out), "trained on the silo's")
    assert_usage_error(invoke("export", *SMALL, "--release", "stats:32", "--out", out), "epsilon")
    assert not out.exists() or not any(out.iterdir())


def test_labels_outside_the_plans_classes_are_refused(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.random((200, 6)).astype(np.float32)
    np.savez(tmp_path / "a.npz", x=x, y=rng.integers(0, 3, 200))
    np.savez(tmp_path / "b.npz", x=x, y=rng.integers(0, 4, 200))  # a class the plan does not have
    plan = tmp_path / "plan.json"
    made = invoke("plan", "--data", tmp_path / "a.npz", "--extractor", "none", "--release", "stats:4",
                  "--mechanism", "gaussian-stats", "--epsilon", "1", "--param", "clip=1", "--out", plan)
    assert made.exit_code == 0, made.output
    good = invoke("export", "--plan", plan, "--data", tmp_path / "a.npz", "--client-index", "0", "--clients", "2",
                  "--quiet", "--out", tmp_path / "a")
    assert good.exit_code == 0, good.output
    out = tmp_path / "b"
    assert_usage_error(invoke("export", "--plan", plan, "--data", tmp_path / "b.npz", "--client-index", "1",
                              "--clients", "2", "--quiet", "--out", out), "3")
    assert not out.exists() or not any(out.iterdir())


def test_an_empty_class_is_released_as_noise_and_said(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    x = rng.random((300, 5)).astype(np.float32)
    y = rng.integers(0, 2, 300)
    y[:2] = 2  # class 2 has records in one silo at most
    np.savez(tmp_path / "d.npz", x=x, y=y)
    result = invoke("export", "--data", tmp_path / "d.npz", "--extractor", "none", "--clients", "2",
                    "--partition", "shards", "--release", "stats:5", "--epsilon", "1", "--seed", "2",
                    "--out", tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert "no training records" in result.output and "noise alone" in result.output
