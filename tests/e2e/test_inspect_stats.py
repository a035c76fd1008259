"""``ldpfl inspect`` of a ``stats:K`` file (issue 40 item 3): the released statistics, their checks, the plot.

One small real export (MNIST-5k, ``--limit 300``, scatter, ``stats:64`` at ε 3) serves every test; tampered copies
are made with h5py (``r+``) in a directory of their own (no manifest, so only the file's own checks speak).
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import h5py
import pytest
from cli_checks import command, ok
from cli_checks import run as invoke_cli
from heavy_imports import heavy_modules_after

from ldpfl.contract.client_reader import open_client_file
from ldpfl.contract.file_checks import file_problems
from ldpfl.mechanisms import accounting

EPSILON = 3.0
WIDTH = 64
CLASSES = 10
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

inspect = command("inspect")


@pytest.fixture(scope="module")
def stats_run(tmp_path_factory) -> Path:
    """Two silos' stats:64 files at ε 3 add/remove (about 6 s)."""
    out = tmp_path_factory.mktemp("stats-run") / "run"
    ok(invoke_cli("export", "--dataset", "mnist5k", "--limit", "300", "--clients", "2", "--extractor", "scatter",
                  "--release", f"stats:{WIDTH}", "--epsilon", EPSILON, "--seed", "3", "--quiet", "--out", out))
    return out


@pytest.fixture(scope="module")
def stats_file(stats_run: Path) -> Path:
    return stats_run / "client_000.h5"


def tampered(source: Path, target_dir: Path, change: Callable[[h5py.File], None]) -> Path:
    """Copy ``source`` alone into ``target_dir`` and apply ``change`` to the copy, opened ``r+``."""
    target = target_dir / source.name
    shutil.copyfile(source, target)
    with h5py.File(target, "r+") as handle:
        change(handle)
    return target


def json_file(path: Path) -> dict:
    result = inspect(path, "--json")
    return json.loads(result.stdout)["files"][0]


def set_json_attribute(name: str, edit: Callable[[dict], None]) -> Callable[[h5py.File], None]:
    def change(handle: h5py.File) -> None:
        value = json.loads(handle.attrs[name])
        edit(value)
        handle.attrs[name] = json.dumps(value)
    return change


def test_text_shows_the_released_statistics_and_both_checks(stats_file: Path) -> None:
    result = inspect(stats_file)
    assert result.exit_code == 0, result.output
    text = result.output
    section = text[text.index("released statistics"):text.index("rows and labels")].splitlines()
    assert section[0].startswith(f"released statistics  (stats:{WIDTH}: no record is released")
    labels = [line.split()[0] for line in section[1:]]
    assert labels == ["released", "counts", "synthetic", "clip", "budget", "noise", "epsilon", "covariance", "check",
                      "check"]
    assert f"per-class sums ({CLASSES} x {WIDTH})" in section[1]
    assert f"C = {0.6 * math.sqrt(WIDTH):.4g} (0.6 sqrt(K), the default)" in text
    assert "shares sums 0.5 / counts 0.05 / second moments 0.45" in text
    assert f"from these sigma and C at delta 1e-05: {EPSILON:g} add-remove" in text
    assert "noise vs epsilon: ok" in text and "synthetic rows: ok" in text
    # the guarantee says what is released, not "the record's stats:64 values, randomized"
    features = next(line for line in text.splitlines() if line.strip().startswith("features "))
    assert "randomized" not in features and "per-class sums, class counts and second moments" in features
    assert "float statistics of the synthetic records" in text
    assert "sigma_moments" not in text  # the report's raw figures are in the section, not dumped again


def test_json_section_recomputes_epsilon_from_the_noise(stats_file: Path) -> None:
    found = json_file(stats_file)
    assert found["status"] == "ok" and found["flags"] == []
    section = found["released_statistics"]
    assert (section["width"], section["classes"], len(section["counts"])) == (WIDTH, CLASSES, CLASSES)
    recomputed = section["epsilon_from_noise"]
    assert abs(recomputed[accounting.ADD_REMOVE] - EPSILON) <= 1e-6
    report = found["metadata"]["privacy_report"]
    assert abs(recomputed[accounting.REPLACE_ONE] - report["exact_epsilon_per_record"]) <= 1e-6
    assert recomputed[accounting.REPLACE_ONE] > recomputed[accounting.ADD_REMOVE]
    assert section["recorded_sigma"] == {f"sigma_{k}": v for k, v in section["sigma"].items()}
    assert sum(section["synthetic_rows_per_class"]) == found["rows"]["train"]
    assert section["synthetic_rows_per_class"] == found["label_histograms"]["train"]
    assert section["checks"] == {"noise_vs_epsilon": {"status": "ok", "findings": []},
                                 "synthetic_rows": {"status": "ok", "findings": []}}
    assert 0 < section["eigenvalues_above_noise_edge"] <= WIDTH


def test_a_tampered_synthetic_row_is_one_finding(stats_file: Path, tmp_path: Path) -> None:
    def change(handle: h5py.File) -> None:
        handle["train/features"][5] = handle["train/features"][5] + 0.5

    copy = tampered(stats_file, tmp_path, change)
    result = inspect(copy)
    assert result.exit_code == 1, result.output
    found = json_file(copy)
    assert len(found["flags"]) == 1 and "\n" not in found["flags"][0]
    assert found["flags"][0].startswith("train/features row 5 differs from the synthetic record")
    checks = found["released_statistics"]["checks"]
    assert checks["noise_vs_epsilon"]["status"] == "ok"
    assert checks["synthetic_rows"] == {"status": "flagged", "findings": found["flags"]}
    assert f"synthetic rows: {found['flags'][0]}" in result.output
    with open_client_file(copy) as (handle, metadata, _):
        assert file_problems(handle, metadata) == found["flags"]  # federate refuses what inspect flags


def test_tampered_sums_give_other_synthetic_rows(stats_file: Path, tmp_path: Path) -> None:
    def change(handle: h5py.File) -> None:
        handle["released_statistics/sums"][0] = handle["released_statistics/sums"][0] + 5.0

    found = json_file(tampered(stats_file, tmp_path, change))
    assert found["status"] == "flagged"
    checks = found["released_statistics"]["checks"]
    assert checks["noise_vs_epsilon"]["status"] == "ok"
    rows = checks["synthetic_rows"]["findings"]  # class 0's mean and the pooled covariance move: every row does
    assert len(rows) == 1 and rows[0].startswith("train/features row ") and found["flags"] == rows


def test_a_tampered_epsilon_parameter_is_flagged(stats_file: Path, tmp_path: Path) -> None:
    copy = tampered(stats_file, tmp_path, set_json_attribute("mechanism_parameters",
                                                             lambda p: p.update(epsilon=2.0)))
    assert inspect(copy).exit_code == 1
    found = json_file(copy)
    noise = found["released_statistics"]["checks"]["noise_vs_epsilon"]["findings"]
    assert any("the privacy report records sigma_sums" in f for f in noise)
    assert any("not the recorded 2" in f for f in noise)
    assert any(f.startswith("privacy report: stored nominal_epsilon = 3.0") for f in found["flags"])
    assert found["released_statistics"]["checks"]["synthetic_rows"]["status"] == "flagged"  # another ridge


def test_a_tampered_noise_scale_in_the_report_is_flagged(stats_file: Path, tmp_path: Path) -> None:
    def halve(report: dict) -> None:
        report["probabilities"]["sigma_moments"] /= 2

    found = json_file(tampered(stats_file, tmp_path, set_json_attribute("privacy_report", halve)))
    assert found["status"] == "flagged"
    noise = found["released_statistics"]["checks"]["noise_vs_epsilon"]["findings"]
    assert noise[0].startswith("the privacy report records sigma_moments")
    assert any("spend epsilon" in f and "not the recorded 3" in f for f in noise)
    assert found["released_statistics"]["checks"]["synthetic_rows"]["status"] == "ok"
    assert found["flags"] == noise


@pytest.mark.parametrize("target", ["file", "run"])
def test_plot_shows_the_release(target: str, stats_run: Path, tmp_path: Path) -> None:
    from matplotlib import image

    path = stats_run / "client_000.h5" if target == "file" else stats_run
    out = tmp_path / "stats.png"
    result = inspect(path, "--plot", out)
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == PNG_SIGNATURE
    pixels = image.imread(out)
    panels = 2 if target == "file" else 3  # counts and spectrum; a run adds the label histogram per client
    assert pixels.shape[0] >= panels * 300 and pixels.shape[0] < (panels + 1) * 400
    assert float(pixels[..., :3].std()) > 0.05


def test_run_details_show_each_file_section(stats_run: Path) -> None:
    result = inspect(stats_run, "--details")
    assert result.exit_code == 0, result.output
    assert result.output.count("released statistics  (stats:64") == 2


def test_inspect_of_a_stats_file_imports_no_framework(stats_file: Path) -> None:
    _, heavy = heavy_modules_after(["inspect", str(stats_file)])
    assert heavy == []


@pytest.mark.parametrize(("value", "finding"), [
    (math.nan, "the released counts hold NaN or infinite values"),
    (1e12, "train holds "),  # checked before any row is drawn: 1e12 rows would not fit
])
def test_crafted_counts_are_one_finding_not_a_traceback(value: float, finding: str, stats_file: Path,
                                                        tmp_path: Path) -> None:
    def change(handle: h5py.File) -> None:
        handle["released_statistics/counts"][0] = value

    copy = tampered(stats_file, tmp_path, change)
    result = inspect(copy, "--plot", tmp_path / "p.png")
    assert result.exit_code == 1 and "Traceback" not in result.output
    found = json_file(copy)
    assert len(found["flags"]) == 1 and found["flags"][0].startswith(finding)
