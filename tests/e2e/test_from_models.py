"""``ldpfl export --from-models`` (issue 15 item 2): one CNN training, many releases, every release counted.

One tiny source export (MNIST-5k, 120 records, 2 clients, 1 epoch) with saved CNNs, the clean test
files and the input bit density; the re-releases reuse its CNNs, partition and hold-out splits.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from cli_checks import run as invoke

from ldpfl import mechanisms
from ldpfl.contract.client_reader import read_client_file
from ldpfl.contract.digest import sha256_file
from ldpfl.contract.layout import MANIFEST_NAME, PARTITION_FILE, client_file_name, local_file_name
from ldpfl.contract.manifest import read_manifest

pytestmark = pytest.mark.slow

SOURCE = ["--dataset", "mnist5k", "--limit", "120", "--clients", "2", "--epochs", "1", "--batch-size", "32",
          "--no-augment", "--quiet"]
SOURCE_EPSILON = 0.01  # rr per bit: a finite exact ε per record, so totals stay finite




def digests(run: Path) -> dict[str, str]:
    return {p.name: sha256_file(p) for p in sorted(run.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("source") / "run"
    result = invoke("export", *SOURCE, "--seed", "7", "--mechanism", "rr", "--epsilon", str(SOURCE_EPSILON),
                    "--save-models", "--keep-clean-test", "--store-input-density", "--out", str(out))
    assert result.exit_code == 0, result.output
    return out


def rerelease(source: Path, out: Path, *args: str) -> dict:
    result = invoke("export", "--from-models", str(source), "--out", str(out), "--quiet", "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_flatten_none_from_models_gives_the_original_clean_features(source: Path, tmp_path: Path) -> None:
    before = digests(source)
    out = tmp_path / "none"
    summary = rerelease(source, out, "--mechanism", "none", "--seed", "8", "--keep-clean-test")
    assert summary["release"] == "flatten" and summary["feature_width"] == 10_240
    encoding = mechanisms.FixedPointEncoding(4, 5)
    step = 2.0 ** -5  # one fraction bit: the encoding of a value computed in other float rounding moves by ≤ 1 step
    for i in range(2):
        original = read_client_file(source / client_file_name(i))
        clean = read_client_file(source / local_file_name(i))  # the source's unrandomized test features
        again = read_client_file(out / client_file_name(i))
        assert {s: list(v) for s, v in again.labels.items()} == {s: list(v) for s, v in original.labels.items()}
        width = again.metadata.feature_width
        values = {s: encoding.decode(mechanisms.unpack_bits(again.features[s], width)) for s in ("train", "test")}
        clean_test = encoding.decode(mechanisms.unpack_bits(clean.features["test"], width))
        assert np.allclose(values["test"], clean_test, atol=step, rtol=0)
        # the whole training split against the source's density of 1s of its unrandomized encoding
        bits = mechanisms.unpack_bits(again.features["train"], width)
        assert np.allclose(bits.mean(axis=0), original.input_bit_density, atol=2 / len(bits))
        assert read_client_file(out / local_file_name(i)).features["test"].tobytes() == clean.features["test"].tobytes()
    assert digests(source) == before  # the source run is only read


def test_rerelease_records_every_release_and_the_total_epsilon(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "label"
    result = invoke("export", "--from-models", str(source), "--out", str(out), "--quiet", "--release", "label",
                    "--mechanism", "krr", "--epsilon", "2", "--seed", "9", "--keep-clean-test")
    assert result.exit_code == 0, result.output
    first = read_manifest(source).info["privacy_report"]["exact_epsilon_per_record"]
    assert math.isfinite(first)
    total = first + 2.0
    assert f"total exact epsilon per record across 2 releases = {total:.6g}" in result.stderr
    manifest = read_manifest(out)
    assert manifest.info["from_models"] == str(source.resolve()) and manifest.info["release"] == "label"
    assert manifest.info["config"]["clients"] == 2 and manifest.info["config"]["limit"] == 120  # the source's
    history = manifest.info["release_history"]
    for i in range(2):
        entries = history[f"client_{i:03d}"]
        assert [(e["mechanism"], e["release"]) for e in entries] == [("rr", "flatten"), ("krr", "label")]
        assert entries[0]["run"] == str(source.resolve()) and entries[1]["run"] == "."
        assert entries[0]["sha256"] == sha256_file(source / client_file_name(i))
        assert entries[1]["sha256"] == sha256_file(out / client_file_name(i))
        assert entries[1]["exact_epsilon_per_record"] == 2.0
    assert manifest.info["local_files"]["files"][0]["path"] == local_file_name(0)
    assert "sha256" not in manifest.info["local_files"]["files"][0]  # unrandomized records: not hashed
    shown = invoke("inspect", str(out))
    assert shown.exit_code == 0, shown.output
    assert "total eps/record" in shown.stdout and f"{total:.6g}" in shown.stdout
    report = json.loads(invoke("inspect", str(out), "--json").stdout)
    assert report["release_history"]["0"]["total_exact_epsilon_per_record"] == pytest.approx(total)
    # a re-release of the re-release (its CNNs found through its from_models): the history carries all three
    third = rerelease(out, tmp_path / "scores", "--release", "scores", "--mechanism", "duchi", "--epsilon", "1")
    assert third["exact_epsilon_per_record"] == 1.0
    chain = read_manifest(tmp_path / "scores").info["release_history"]["client_001"]
    assert [(e["mechanism"], e["run"]) for e in chain] == [("rr", str(source.resolve())),
                                                          ("krr", str(out.resolve())), ("duchi", ".")]
    report = json.loads(invoke("inspect", str(tmp_path / "scores"), "--json").stdout)
    assert report["release_history"]["1"]["total_exact_epsilon_per_record"] == pytest.approx(total + 1.0)
    federated = invoke("federate", str(out), "--rounds", "1", "--hidden", "16", "--local-epochs", "1", "--threads",
                       "1", "--eval-clean", "--json", "--quiet")
    assert federated.exit_code == 0, federated.output
    assert len(json.loads(federated.stdout)["clean_test_accuracy"]) == 1


@pytest.mark.parametrize(("args", "fragment"), [
    (["--release", "bottleneck:8", "--mechanism", "duchi"], "needs CNNs trained with that bottleneck layer"),
    (["--clients", "3"], "clients is 2 there, 3 here"),
    (["--dataset", "fashion-mnist"], "dataset is 'mnist5k' there"),
    (["--save-models"], "`save_models` has nothing to save".replace("`save_models`", "--save-models")),
])
def test_from_models_refusals_exit_2_and_create_nothing(source: Path, tmp_path: Path, args: list[str],
                                                        fragment: str) -> None:
    out = tmp_path / "new"
    result = invoke("export", "--from-models", str(source), "--out", str(out), *args)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert fragment in result.output and len(result.output.strip().splitlines()) == 1
    assert not out.exists()


def test_from_models_needs_its_own_out_directory(source: Path) -> None:
    before = digests(source)
    result = invoke("export", "--from-models", str(source), "--mechanism", "none")
    assert result.exit_code == 2 and "give its directory with --out" in result.output
    result = invoke("export", "--from-models", str(source), "--out", str(source), "--mechanism", "none")
    assert result.exit_code == 2 and "is the source run itself" in result.output
    assert digests(source) == before


def test_default_export_still_refuses_to_rerelease_silently(source: Path) -> None:
    before = digests(source)
    result = invoke("export", *SOURCE, "--seed", "7", "--mechanism", "none", "--out", str(source))
    assert result.exit_code == 2 and "holds an export with other settings" in result.output
    assert digests(source) == before


def make_old_format(source: Path, target: Path) -> Path:
    """A copy of ``source`` as an export before this change wrote it: no stored hold-out, no history."""
    shutil.copytree(source, target)
    with np.load(target / PARTITION_FILE) as data:
        pools = {k: data[k] for k in data.files if not k.endswith(("_train", "_test"))}
    np.savez(target / PARTITION_FILE, **pools)
    manifest = json.loads((target / MANIFEST_NAME).read_text())
    for key in ("release_history", "release", "from_models", "local_files"):
        manifest.pop(key, None)
    manifest["config"].pop("release", None)
    manifest["partition_file"]["sha256"] = sha256_file(target / PARTITION_FILE)
    manifest["schema_version"] = 2
    (target / MANIFEST_NAME).write_text(json.dumps(manifest))
    return target


def test_runs_exported_before_need_their_seed_to_redraw_the_holdout(source: Path, tmp_path: Path) -> None:
    old = make_old_format(source, tmp_path / "old")
    wrong = invoke("export", "--from-models", str(old), "--out", str(tmp_path / "a"), "--mechanism", "none",
                   "--seed", "8")
    assert wrong.exit_code == 2 and "pass the --seed of that run" in wrong.output
    assert not (tmp_path / "a").exists()
    summary = rerelease(old, tmp_path / "b", "--mechanism", "none", "--seed", "7")
    assert [c["rows"] for c in summary["clients"]] == [{"train": 54, "test": 6}] * 2
    history = read_manifest(tmp_path / "b").info["release_history"]["client_000"]
    assert [e["mechanism"] for e in history] == ["rr", "none"]  # the old manifest: one flatten release per file
    with np.load(tmp_path / "b" / PARTITION_FILE) as data:  # the new run stores the recovered split
        assert {"client_000_train", "client_000_test"} <= set(data.files)


def test_a_source_with_private_labels_is_released_again(tmp_path: Path) -> None:
    """k-RR labels in the source cannot match the partition row by row: the rows per split are checked instead,
    and the second release composes the first one's values and labels."""
    source = tmp_path / "private"
    result = invoke("export", *SOURCE, "--seed", "7", "--mechanism", "rr", "--epsilon", str(SOURCE_EPSILON),
                    "--label-epsilon", "1", "--save-models", "--out", str(source))
    assert result.exit_code == 0, result.output
    summary = rerelease(source, tmp_path / "again", "--release", "label", "--mechanism", "krr", "--epsilon", "1",
                        "--label-epsilon", "1", "--seed", "8")
    assert [c["rows"] for c in summary["clients"]] == [{"train": 54, "test": 6}] * 2
    again = read_client_file(tmp_path / "again" / client_file_name(0)).metadata
    parts = {p.kind: p for p in again.release_guarantee.parts}
    first = read_client_file(source / client_file_name(0)).metadata
    assert first.label_release.mechanism == again.label_release.mechanism == "krr"
    first_values = next(p for p in first.release_guarantee.parts if p.kind == "features")
    assert math.isclose(parts["re-release"].epsilon, first_values.epsilon + first.label_release.epsilon)
