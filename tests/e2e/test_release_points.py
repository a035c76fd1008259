"""``ldpfl export --release`` (issue 17 item 1): release points, their mechanisms, files, errors, federation.

The fast tests need no CNN: parsing, the per-release mechanism choices, the release transforms, the
schema attribute, and the one-line exit-2 errors that create nothing. The slow ones train tiny CNNs
(MNIST-5k, 120 records, 1 epoch) and run every release end to end: export -> federate 1 round -> inspect.
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
from cli_checks import one_error_line
from cli_checks import run as invoke

from ldpfl import mechanisms
from ldpfl.contract.client_reader import read_client_file
from ldpfl.contract.layout import client_file_name, local_file_name
from ldpfl.contract.release_point import RELEASE_KINDS, RELEASES, ReleasePoint, parse_release, release_kind
from ldpfl.stage1_features.export.config import ExportConfig
from ldpfl.stage1_features.export.release import (
    RELEASE_DOMAINS,
    check_mechanism,
    release_help,
    release_mechanisms,
    release_values,
)

TINY = ["--dataset", "mnist5k", "--limit", "120", "--clients", "2", "--epochs", "1", "--batch-size", "32",
        "--no-augment", "--quiet", "--seed", "7"]




# ----------------------------------------------------------------------------------------------------
# Release points and their mechanisms (no CNN)


@pytest.mark.parametrize(("text", "point"), [
    ("flatten", ReleasePoint("flatten")), ("bottleneck:16", ReleasePoint("bottleneck", 16)),
    (" Bottleneck:4 ", ReleasePoint("bottleneck", 4)), ("scores", ReleasePoint("scores")),
    ("label", ReleasePoint("label")), ("bottleneck:128", ReleasePoint("bottleneck", 128)),
    ("stats:256", ReleasePoint("stats", 256)), ("STATS:1", ReleasePoint("stats", 1)),
])
def test_release_points_parse_and_print(text: str, point: ReleasePoint) -> None:
    assert parse_release(text) == point
    assert parse_release(str(point)) == point


@pytest.mark.parametrize(("text", "message"), [
    ("bottleneck", "needs its size"), ("bottleneck:0", r"K in \[4, 128\], got 0"),
    ("bottleneck:-3", r"K in \[4, 128\], got -3"), ("bottleneck:3", "got 3"), ("bottleneck:129", "got 129"),
    ("bottleneck:x", "got 'x'"), ("scores:3", "takes no size"), ("logits", "one of flatten"),
    ("stats", "stats needs its size"), ("stats:0", r"K in \[1, 4096\], got 0"), ("stats:4097", "got 4097"),
])
def test_bad_release_points_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_release(text)


def test_each_release_takes_the_mechanisms_of_its_domains() -> None:
    assert release_mechanisms(parse_release("label")) == ["krr", "none", "oue-label"]
    bounded = release_mechanisms(parse_release("scores"))
    assert {"duchi", "piecewise", "hybrid", "laplace", "gaussian", "pdpm", "none"} <= set(bounded)
    assert not {"uer", "rr", "krr", "oue-label"} & set(bounded)
    assert release_mechanisms(parse_release("bottleneck:8")) == bounded
    flatten = release_mechanisms(parse_release("flatten"))
    assert {"uer", "moue", "oue", "rr", "pdpm", "gaussian", "none"} <= set(flatten)
    assert not {"krr", "oue-label", "duchi", "piecewise"} & set(flatten)
    assert release_mechanisms(parse_release("stats:16")) == ["gaussian-stats"]
    assert "gaussian-stats" not in flatten + bounded
    for point in ("flatten", "bottleneck:8", "scores", "label", "stats:16"):
        for name in mechanisms.mechanism_names():
            fits = name in release_mechanisms(parse_release(point))
            if not fits:
                with pytest.raises(ValueError, match="does not give"):
                    check_mechanism(parse_release(point), name)


def test_release_values_map_scores_to_the_box_and_labels_to_one_hot() -> None:
    p = np.array([[0.1, 0.7, 0.2], [1.0, 0.0, 0.0]], dtype=np.float32)
    features = np.arange(8, dtype=np.float32).reshape(2, 4)
    assert np.array_equal(release_values(parse_release("flatten"), features, p), features)
    assert np.array_equal(release_values(parse_release("bottleneck:4"), features, p), features)
    scores = release_values(parse_release("scores"), features, p)
    assert scores.dtype == np.float32 and np.allclose(scores, 2 * p - 1) and scores.min() >= -1 and scores.max() <= 1
    label = release_values(parse_release("label"), features, p)
    assert label.dtype == np.float32 and label.tolist() == [[0, 1, 0], [1, 0, 0]]


def test_config_normalizes_the_release_and_refuses_what_does_not_fit() -> None:
    assert ExportConfig(release=" Bottleneck:08 ", mechanism="duchi").release == "bottleneck:8"
    with pytest.raises(ValueError, match="randomizes bits of the fixed-point encoding, which release 'label'"):
        ExportConfig(release="label", mechanism="uer")
    with pytest.raises(ValueError, match="needs release bottleneck:K"):
        ExportConfig(release="scores", mechanism="duchi", noise_aware=True)


# ----------------------------------------------------------------------------------------------------
# One-line errors, exit code 2, nothing created


@pytest.mark.parametrize(("args", "fragment"), [
    (["--release", "label", "--mechanism", "uer"], "Error: --mechanism 'uer' randomizes bits"),
    (["--release", "scores", "--mechanism", "krr"], "--mechanism 'krr' randomizes one categorical value"),
    (["--release", "bottleneck:8", "--mechanism", "oue-label"], "does not give"),
    (["--mechanism", "duchi"], "--mechanism 'duchi' randomizes vectors in [-1, 1]^d, which --release 'flatten'"),
    (["--release", "bottleneck:0", "--mechanism", "duchi"], "K in [4, 128], got 0"),
    (["--release", "bottleneck:-1", "--mechanism", "duchi"], "got -1"),
    (["--release", "bottleneck:500", "--mechanism", "duchi"], "got 500"),
    (["--release", "label", "--mechanism", "krr", "--epsilon", "0"], "epsilon"),
    (["--release", "scores", "--mechanism", "piecewise", "--epsilon", "-1"], "epsilon"),
    (["--release", "scores", "--mechanism", "duchi", "--extractor", "none"], "--extractor 'none' trains none"),
    (["--release", "label", "--mechanism", "none", "--epsilon", "2"], "takes no parameter 'epsilon'"),
    (["--noise-aware", "--release", "label", "--mechanism", "krr"], "--noise-aware"),
])
def test_bad_combinations_exit_2_and_create_nothing(tmp_path: Path, args: list[str], fragment: str) -> None:
    out = tmp_path / "run"
    line = one_error_line(invoke("export", "--dataset", "mnist5k", "--limit", "100", "--out", str(out), *args))
    assert fragment in line
    assert not out.exists()


def test_bottleneck_wider_than_the_flatten_layer_is_refused(tmp_path: Path) -> None:
    """mnist-cnn on 16×16 images has r = 1·1·64 = 64 flatten values: K = 100 does not fit."""
    data = tmp_path / "small.npz"
    rng = np.random.default_rng(0)
    np.savez(data, x=rng.integers(0, 256, size=(40, 16, 16, 1), dtype=np.uint8), y=np.arange(40) % 2)
    out = tmp_path / "run"
    line = one_error_line(invoke("export", "--data", str(data), "--extractor", "mnist-cnn", "--release",
                                 "bottleneck:100", "--mechanism", "duchi", "--out", str(out)))
    assert "K = 100 exceeds the flatten width r = 64" in line
    assert not out.exists()


def test_release_attribute_must_agree_with_the_width(tmp_path: Path) -> None:
    from federate_files import write_run  # a float32 run without a CNN

    run = write_run(tmp_path / "run", clients=1, features=6, feature_format="float32")
    path = run / client_file_name(0)
    with h5py.File(path, "r+") as handle:
        handle.attrs["release"] = "bottleneck:8"
    with pytest.raises(ValueError, match=r"'features' \(6\) differs from the width 8 of release 'bottleneck:8'"):
        read_client_file(path)
    with h5py.File(path, "r+") as handle:
        handle.attrs["release"] = "logits"
    with pytest.raises(ValueError, match="attribute 'release' is malformed"):
        read_client_file(path)


# ----------------------------------------------------------------------------------------------------
# End to end: every release with a fitting mechanism (tiny CNNs)


def export_json(out: Path, *args: str) -> dict:
    result = invoke("export", *TINY, "--out", str(out), "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def federate_one_round(run: Path, *args: str) -> dict:
    result = invoke("federate", str(run), "--rounds", "1", "--hidden", "32", "--local-epochs", "1", "--threads",
                    "1", "--seed", "1", "--json", "--quiet", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def inspect_ok(run: Path) -> dict:
    result = invoke("inspect", str(run), "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.slow
@pytest.mark.parametrize(("release", "mechanism", "epsilon", "width"), [
    ("bottleneck:8", "piecewise", "5", 8),
    ("label", "krr", "2", 10),
])
def test_trained_release_end_to_end(tmp_path: Path, release: str, mechanism: str, epsilon: str, width: int) -> None:
    summary = export_json(tmp_path, "--release", release, "--mechanism", mechanism, "--epsilon", epsilon,
                          "--keep-clean-test")
    spec = mechanisms.MechanismSpec.resolve(mechanism, {"epsilon": float(epsilon)}, features=width)
    assert summary["release"] == release and summary["features"] == summary["feature_width"] == width
    assert summary["feature_format"] == "float32"
    assert summary["exact_epsilon_per_record"] == spec.report().exact_epsilon_per_record <= float(epsilon) + 1e-9
    data = read_client_file(tmp_path / client_file_name(0))
    meta = data.metadata
    assert (meta.release, meta.features, meta.mechanism, meta.local_only) == (release, width, mechanism, False)
    assert meta.mechanism_parameters[spec.mechanism_class.RECORD_PARAMETER] == width
    assert any(release.split(":")[0] in note for note in meta.privacy().notes)
    clean = read_client_file(tmp_path / local_file_name(0))
    assert clean.metadata.local_only and clean.metadata.mechanism == "none" and clean.rows == {"train": 0, "test": 6}
    if release == "label":  # krr releases one-hot rows; the clean file holds the predicted class's one-hot row
        for values in (data.features["train"], clean.features["test"]):
            assert set(np.unique(values)) <= {0.0, 1.0} and np.all(values.sum(axis=1) == 1)
    else:  # tanh codes in [-1, 1]; piecewise outputs its unbiased estimates
        assert np.all(np.abs(clean.features["test"]) <= 1.0)
    result = federate_one_round(tmp_path, "--eval-clean")
    assert len(result["test_accuracy"]) == 1 and len(result["clean_test_accuracy"]) == 1
    assert 0.0 <= result["clean_test_accuracy"][0] <= 1.0
    csv = (tmp_path / "federation" / "metrics.csv").read_text().splitlines()
    assert csv[0].split(",")[5] == "clean_test_accuracy" and csv[1].split(",")[5] != ""
    report = inspect_ok(tmp_path)
    assert [f["metadata"]["release"] for f in report["files"]] == [release, release]
    assert [f["name"] if "name" in f else f["file"] for f in report["files"]] == ["client_000.h5", "client_001.h5"]
    assert all(f["status"] == "ok" for f in report["files"])


def test_eval_clean_without_local_files_is_one_line(tmp_path: Path) -> None:
    from federate_files import write_run

    run = write_run(tmp_path / "run", clients=2, features=6, feature_format="float32")
    result = invoke("federate", str(run), "--rounds", "1", "--hidden", "8", "--eval-clean", "--quiet")
    line = one_error_line(result)
    assert "client_000.local.h5: missing: --eval-clean needs the local-only clean test file" in line


def test_release_points_and_their_help_come_from_one_registry() -> None:
    assert RELEASE_KINDS == ("flatten", "bottleneck", "scores", "label", "stats")
    text = release_help()
    for name, kind in RELEASES.items():
        assert f"{kind.usage}" in text and kind.domains == RELEASE_DOMAINS[name]
    for mechanism in mechanisms.mechanism_names("category") + mechanisms.mechanism_names("bounded"):
        assert mechanism in text  # every mechanism a low-dimensional release takes is named
    with pytest.raises(ValueError,
                       match="release must be one of flatten, bottleneck:K, scores, label, stats:K; got 'logits'"):
        parse_release("logits")
    with pytest.raises(ValueError, match="is already registered"):
        RELEASES.add("label", release_kind("label"))
