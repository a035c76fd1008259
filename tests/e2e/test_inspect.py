"""``ldpfl inspect``: good runs (uer, none, pdpm), bit statistics, corrupted files, plots, light imports."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from cli_checks import command
from click.testing import CliRunner
from heavy_imports import heavy_modules_after
from inspect_files import (
    FEATURES,
    NUM_CLASSES,
    PDPM_PARAMS,
    ROWS,
    UER_PARAMS,
    external_storage,
    flip_data_bytes,
    foreign_hdf5,
    huge_shape,
    non_hdf5,
    truncated_copy,
    write_client,
    write_metrics,
    write_run,
)

from ldpfl import mechanisms as mech
from ldpfl.cli import cli
from ldpfl.contract.layout import client_file_name
from ldpfl.inspection.bits import binomial_se
from ldpfl.inspection.file import ERROR, FLAGGED, OK
from ldpfl.inspection.report import inspect_path
from ldpfl.inspection.text import inspection_text

K_SE = 5.0
L = 10  # m = 4, n = 5
DIGITS = ["sign", "2^3", "2^2", "2^1", "2^0", "2^-1", "2^-2", "2^-3", "2^-4", "2^-5"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


invoke = command("inspect")


def strict_json(text: str) -> dict:
    """Parse JSON, refusing the non-standard NaN/Infinity tokens."""
    return json.loads(text, parse_constant=lambda token: pytest.fail(f"non-standard JSON token {token}"))


def file_bits(path: Path, split: str) -> np.ndarray:
    """The stored bits of ``split``, unpacked directly with h5py (independent of inspect)."""
    with h5py.File(path, "r") as handle:
        return np.unpackbits(handle[split]["features"][()], axis=1, count=FEATURES * L)


def file_labels(path: Path, split: str) -> np.ndarray:
    with h5py.File(path, "r") as handle:
        return handle[split]["labels"][()]


@pytest.fixture(scope="module")
def uer_run(tmp_path_factory) -> Path:
    """Three uer clients with /stats/input_bit_density, a manifest and federation metrics."""
    run = tmp_path_factory.mktemp("uer-run")
    write_run(run, mechanism="uer", store_density=True, seed=10)
    write_metrics(run, [0.42, 0.61, 0.7, 0.74])
    return run


@pytest.fixture(scope="module")
def uer_run_no_density(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("uer-run-plain")
    write_run(run, mechanism="uer", clients=2, seed=20)
    return run


@pytest.fixture(scope="module")
def none_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("none-run")
    write_run(run, mechanism="none", clients=2, store_density=True, seed=30)
    return run


@pytest.fixture(scope="module")
def pdpm_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("pdpm-run")
    write_run(run, mechanism="pdpm", clients=2, seed=40)
    return run


# ----------------------------------------------------------------------------------------------------
# Good files.


def test_uer_run_json_matches_the_written_content(uer_run: Path) -> None:
    result = invoke(uer_run, "--json")
    assert result.exit_code == 0, result.output
    data = strict_json(result.stdout)
    assert data["kind"] == "run" and data["ok"] and data["problems"] == []
    expected = mech.create_mechanism("uer", **UER_PARAMS).report()
    assert [f["file"] for f in data["files"]] == [client_file_name(i) for i in range(3)]
    for index, f in enumerate(data["files"]):
        path = uer_run / f["file"]
        assert f["status"] == OK and f["flags"] == [] and f["error"] is None
        assert f["manifest"]["status"] == "ok" and f["checksums"] == "ok"
        assert f["rows"] == {"train": ROWS[0], "test": ROWS[1]}
        for split in ("train", "test"):
            assert f["label_histograms"][split] == np.bincount(file_labels(path, split), minlength=NUM_CLASSES).tolist()
        meta = f["metadata"]
        stated = [meta[k] for k in ("client_index", "mechanism", "integer_bits", "fraction_bits", "features")]
        assert stated == [index, "uer", 4, 5, FEATURES]
        privacy = f["privacy"]
        assert privacy["nominal_epsilon"] == 0.5
        assert privacy["exact_epsilon_per_record"] == pytest.approx(expected.exact_epsilon_per_record, rel=1e-12)
        assert privacy["exact_epsilon_per_coordinate"] == pytest.approx(expected.exact_epsilon_per_coordinate,
                                                                         rel=1e-12)
        assert privacy["agrees"] is True and privacy["randomness"] == "seeded"
        # Observed densities: recomputed here from the raw bits; within 5 SE of the prediction.
        train, test = file_bits(path, "train"), file_bits(path, "test")
        classes = {c["name"]: c for c in f["bit_statistics"]["classes"]}
        assert list(classes) == ["all", "even", "odd", *DIGITS]
        direct = {"all": np.s_[:, :], "even": np.s_[:, 0::2], "odd": np.s_[:, 1::2],
                  **{d: np.s_[:, j::L] for j, d in enumerate(DIGITS)}}
        for name, cls in classes.items():
            assert cls["observed"]["train"] == pytest.approx(train[direct[name]].mean(), abs=1e-12)
            assert cls["observed"]["test"] == pytest.approx(test[direct[name]].mean(), abs=1e-12)
            se = binomial_se(cls["predicted"], cls["positions"] * ROWS[0])
            assert abs(cls["observed"]["train"] - cls["predicted"]) <= K_SE * se, name
            assert cls["low"] <= cls["predicted"] <= cls["high"] and not cls["flagged"]
    assert data["federation"]["rounds"] == 4 and data["federation"]["final_test_accuracy"] == 0.74


def test_uer_range_is_the_mechanism_probabilities(uer_run: Path) -> None:
    """With l = 10 even, every digit has one parity: its range is [P(1|0), P(1|1)] of that UER class."""
    even, odd = mech.create_mechanism("uer", **UER_PARAMS).effective_bit_classes()
    report = inspect_path(uer_run / client_file_name(0)).files[0]
    classes = {c.name: c for c in report.bits.classes}
    for j, digit in enumerate(DIGITS):
        cls = even if j % 2 == 0 else odd
        assert classes[digit].low == pytest.approx(min(cls.p_one_given_zero, cls.p_one_given_one), rel=1e-12)
        assert classes[digit].high == pytest.approx(max(cls.p_one_given_zero, cls.p_one_given_one), rel=1e-12)


def test_uer_run_text_table(uer_run: Path) -> None:
    result = invoke(uer_run)
    assert result.exit_code == 0 and result.stderr == ""
    exact = mech.create_mechanism("uer", **UER_PARAMS).report().exact_epsilon_per_record
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.strip().startswith("client"))
    for column in ("train", "test", "train labels", "release", "mechanism", "nominal eps", "features eps/record",
                   "total eps/record", "sha", "status"):
        assert column in header
    for i in range(3):
        row = next(line for line in lines if client_file_name(i) in line).split()
        hist = "/".join(map(str, np.bincount(file_labels(uer_run / client_file_name(i), "train"),
                                             minlength=NUM_CLASSES)))
        assert row == [str(i), client_file_name(i), str(ROWS[0]), str(ROWS[1]), hist, "flatten", "uer", "0.5",
                       f"{exact:.6g}", "inf", "ok", "ok"]  # clear labels, non-private CNN: no finite total
    assert "release guarantee: epsilon = inf per record (not private: labels)" in result.stdout
    assert "federation  4 rounds, final test accuracy 0.74" in result.stdout
    assert "all readable clients agree" in result.stdout


def test_single_file_text_sections(uer_run: Path) -> None:
    path = uer_run / client_file_name(1)
    result = invoke(path)
    assert result.exit_code == 0, result.output
    out = result.stdout
    exact = mech.create_mechanism("uer", **UER_PARAMS).report()
    for text in ("status      ok", "sha256 matches the manifest", "HDF5 checksums ok", "client      1 of 3",
                 "m=4, n=5, l=10 bits per value, r=12 features",
                 f"nominal eps 0.5   |   exact eps {exact.exact_epsilon_per_record:.6g} per record",
                 f"{exact.exact_epsilon_per_coordinate:.6g} per bit", "parameters reproduce", "class even",
                 "class odd"):
        assert text in out, text
    for split, rows in zip(("train", "test"), ROWS, strict=True):
        hist = np.bincount(file_labels(path, split), minlength=NUM_CLASSES).tolist()
        line = next(line.split() for line in out.splitlines() if line.split()[:1] == [split])
        assert line == [split, str(rows), *map(str, hist)]
    table = out[out.index("bit statistics"):].splitlines()
    assert [line.split()[0] for line in table[2:15]] == ["all", "even", "odd", *DIGITS]


def test_details_prints_every_file_section(uer_run: Path) -> None:
    result = invoke(uer_run, "--details")
    assert result.exit_code == 0
    headers = [line.split()[:1] for line in result.stdout.splitlines()]  # "privacy" also appears in the text
    assert result.stdout.count("bit statistics") == 3 and headers.count(["privacy"]) == 3  # of seeded randomness


def test_without_input_density_says_what_is_needed(uer_run_no_density: Path) -> None:
    result = invoke(uer_run_no_density / client_file_name(0))
    assert result.exit_code == 0
    flat = " ".join(result.stdout.split())
    assert "--store-input-density" in flat and "does NOT cover" in flat and "--mechanism none" in flat
    report = inspect_path(uer_run_no_density / client_file_name(0)).files[0]
    assert not report.bits.input_density_stored
    assert all(c.predicted is None and c.low is not None and c.high is not None for c in report.bits.classes)
    assert report.status == OK


def test_none_with_density_matches_it_exactly(none_run: Path) -> None:
    result = inspect_path(none_run)
    assert result.ok
    for report in result.files:
        assert not report.privacy.private and report.privacy.exact_epsilon_per_record == math.inf
        train = file_bits(report.path, "train")
        for cls in report.bits.classes:
            assert cls.deterministic and cls.deviation_se == 0.0
        assert report.bits.classes[0].predicted == pytest.approx(train.mean(), abs=1e-6)
    text = invoke(none_run / client_file_name(0)).stdout
    assert "NOT PRIVATE" in text and "exact eps inf per record" in text
    assert strict_json(invoke(none_run, "--json").stdout)["files"][0]["privacy"]["exact_epsilon_per_record"] == "inf"


def test_block_size_does_not_change_the_statistics(uer_run: Path) -> None:
    path = uer_run / client_file_name(2)
    whole, streamed = inspect_path(path).files[0], inspect_path(path, block_rows=7).files[0]
    for split in ("train", "test"):
        np.testing.assert_array_equal(whole.bits.ones[split], streamed.bits.ones[split])
    assert whole.to_dict()["bit_statistics"] == streamed.to_dict()["bit_statistics"]
    assert whole.label_histograms == streamed.label_histograms


def test_pdpm_float_statistics(pdpm_run: Path) -> None:
    path = pdpm_run / client_file_name(0)
    report = inspect_path(path).files[0]
    assert report.status == OK and report.bits is None
    m = mech.create_mechanism("pdpm", **PDPM_PARAMS)
    assert list(report.floats.outputs.values()) == list(m.output_values())
    with h5py.File(path, "r") as handle:
        values = np.concatenate([handle[s]["features"][()] for s in ("train", "test")]).astype(np.float64)
    fractions = report.floats.output_fractions
    for name, value in zip(("high", "low", "centre"), m.output_values(), strict=True):
        assert fractions[name] == pytest.approx(np.mean(values == np.float32(value)), abs=1e-12) and fractions[name] > 0
    assert fractions["other"] == 0.0 and sum(fractions.values()) == pytest.approx(1.0)
    np.testing.assert_allclose(report.floats.mean, values.mean(axis=0), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(report.floats.std, values.std(axis=0), rtol=1e-10)
    text = invoke(path).stdout
    assert "output shares" in text and "float statistics" in text and "exact eps 12 per record" in text


def test_gaussian_float_file(tmp_path: Path) -> None:
    params = {"epsilon": 1.0, "dim": FEATURES}
    write_client(tmp_path / "client_000.h5", mechanism="gaussian", params=params, client_count=1)
    report = inspect_path(tmp_path / "client_000.h5").files[0]
    assert report.status == OK and report.floats.output_fractions is None
    assert report.manifest.status == "no manifest"
    sigma = mech.create_mechanism("gaussian", **params).sigma
    assert np.median(report.floats.std) == pytest.approx(sigma, rel=0.25)  # noise dominates the clipped values


# ----------------------------------------------------------------------------------------------------
# Files that are not what their attributes say.


@pytest.mark.parametrize("stated, randomized_by, expected", [
    ("uer", "none", "lies outside the range"),  # unrandomized bits labelled uer
    ("none", "uer", "predicted from /stats/input_bit_density"),  # randomized bits labelled none
    ("uer", "rr", "lies outside the range"),  # the wrong mechanism
])
def test_bits_that_contradict_their_attributes_are_flagged(tmp_path: Path, stated: str, randomized_by: str,
                                                            expected: str) -> None:
    path = tmp_path / "client_000.h5"
    write_client(path, mechanism=stated, store_density=True, bits_from=randomized_by, client_count=1)
    result = invoke(path)
    assert result.exit_code == 1
    report = inspect_path(path).files[0]
    assert report.status == FLAGGED and any(expected in flag for flag in report.flags), report.flags
    assert expected in result.stdout


def test_tampered_privacy_report_is_flagged(tmp_path: Path) -> None:
    m = mech.create_mechanism("uer", **UER_PARAMS)
    report = m.report().to_dict() | {"exact_epsilon_per_record": 0.5}
    path = tmp_path / "client_000.h5"
    write_client(path, privacy_report=report, client_count=1)
    result = inspect_path(path)
    assert result.exit_code == 1
    assert result.files[0].privacy.agrees is False
    assert any("stored exact_epsilon_per_record = 0.5" in f for f in result.files[0].flags)


def test_label_histogram_attribute_mismatch_is_flagged(uer_run: Path, tmp_path: Path) -> None:
    path = tmp_path / "client_000.h5"
    shutil.copyfile(uer_run / client_file_name(0), path)
    with h5py.File(path, "r+") as handle:
        handle.attrs["label_histograms"] = json.dumps({"train": [1, 2, 3, 4], "test": [0, 0, 0, 80]})
    report = inspect_path(path).files[0]
    assert report.status == FLAGGED
    assert any("differs from attribute 'label_histograms'" in f for f in report.flags)


def test_none_records_its_encoding_and_a_contradiction_is_flagged(none_run: Path, tmp_path: Path) -> None:
    """``ldpfl export`` records m and n among the parameters of ``none`` (it takes none of its own)."""
    with h5py.File(none_run / client_file_name(0), "r") as handle:
        assert json.loads(handle.attrs["mechanism_parameters"]) == {"integer_bits": 4, "fraction_bits": 5}
    path = tmp_path / "client_000.h5"
    shutil.copyfile(none_run / client_file_name(0), path)
    with h5py.File(path, "r+") as handle:
        handle.attrs["mechanism_parameters"] = json.dumps({"integer_bits": 3, "fraction_bits": 5})
    report = inspect_path(path).files[0]
    assert report.status == FLAGGED
    assert report.flags == ["mechanism parameter integer_bits = 3 differs from the file's integer_bits = 4"]


def test_client_index_that_contradicts_the_file_name_is_flagged(uer_run: Path, tmp_path: Path) -> None:
    shutil.copyfile(uer_run / client_file_name(0), tmp_path / "client_005.h5")
    report = inspect_path(tmp_path / "client_005.h5").files[0]
    assert report.status == FLAGGED
    assert report.flags == ["attribute 'client_index' is 0 but the file is named client_005.h5"]


# ----------------------------------------------------------------------------------------------------
# Broken and hostile files: one line, non-zero exit, no traceback.


def test_json_attribute_that_is_not_an_object(uer_run: Path, tmp_path: Path) -> None:
    path = tmp_path / "client_000.h5"
    shutil.copyfile(uer_run / client_file_name(0), path)
    with h5py.File(path, "r+") as handle:
        handle.attrs["privacy_report"] = "[1, 2]"
    result = invoke(path)
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [f"Error: {path}: attribute 'privacy_report' is not a JSON object"]


def _truncated(src: Path, dst: Path) -> Path:
    return truncated_copy(src, dst)


def _flipped(src: Path, dst: Path) -> Path:
    return flip_data_bytes(src, dst)


CORRUPTIONS = {
    "truncated": (_truncated, "not a readable HDF5 file"),
    "flipped-data-bytes": (_flipped, "'train/features' rows 0:240 failed its Fletcher-32 checksum"),
    "foreign-hdf5": (lambda src, dst: foreign_hdf5(dst), "not an ldpfl feature file"),
    "external-storage": (external_storage, "'train/features' uses external storage (refused)"),
    "huge-declared-shape": (huge_shape, "declares 1000000000 rows, beyond the limits"),
    "not-hdf5": (lambda src, dst: non_hdf5(dst), "not a readable HDF5 file (Unable to synchronously open file (file "
                                                 "signature not found))"),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_bad_file_gives_one_line_error(kind: str, uer_run: Path, tmp_path: Path) -> None:
    make, expected = CORRUPTIONS[kind]
    bad = make(uer_run / client_file_name(0), tmp_path / "client_000.h5")
    result = invoke(bad)
    assert result.exit_code == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {bad}: ") and expected in lines[0], result.stderr
    assert "Traceback" not in result.output
    data = strict_json(invoke(bad, "--json").stdout)
    assert data["files"][0]["status"] == ERROR and expected in data["files"][0]["error"]


def test_flipped_bytes_are_data_not_metadata(uer_run: Path, tmp_path: Path) -> None:
    """The flipped copy still opens and validates: only reading the chunk catches it."""
    bad = flip_data_bytes(uer_run / client_file_name(0), tmp_path / "x.h5")
    with h5py.File(bad, "r") as handle:
        assert handle["train/features"].shape == (ROWS[0], 15)
        handle["test/features"][()]  # another dataset still reads
        with pytest.raises(OSError):
            handle["train/features"][()]


def test_run_directory_still_reports_the_good_files(uer_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(uer_run, run)
    flip_data_bytes(uer_run / client_file_name(1), run / client_file_name(1))  # listed: sha and checksum fail
    foreign_hdf5(run / "client_009.h5")  # not listed
    result = invoke(run)
    assert result.exit_code == 1
    rows = {line.split()[1]: line for line in result.stdout.splitlines() if ".h5" in line}
    assert rows[client_file_name(0)].rstrip().endswith("ok   ok")
    assert rows[client_file_name(2)].rstrip().endswith("ok   ok")
    assert "BAD  ERROR:" in rows[client_file_name(1)] and "Fletcher-32" in rows[client_file_name(1)]
    assert "ERROR: attribute 'schema'" in rows["client_009.h5"]
    errors = result.stderr.splitlines()
    assert len(errors) == 2 and all(line.startswith("Error: ") for line in errors)
    assert "Traceback" not in result.output
    data = strict_json(invoke(run, "--json").stdout)
    status = {f["file"]: (f["status"], f["manifest"]["status"]) for f in data["files"]}
    assert status == {client_file_name(0): (OK, "ok"), client_file_name(1): (ERROR, "mismatch"),
                      client_file_name(2): (OK, "ok"), "client_009.h5": (ERROR, "not listed")}


def test_sha_mismatch_alone_is_flagged(uer_run: Path, tmp_path: Path) -> None:
    """A valid file whose bytes changed after export (here: an attribute) fails its manifest hash."""
    run = tmp_path / "run"
    shutil.copytree(uer_run, run)
    with h5py.File(run / client_file_name(0), "r+") as handle:
        handle.attrs["created_utc"] = "2000-01-01T00:00:00+00:00"
    result = inspect_path(run)
    report = result.files[0]
    assert report.error is None and report.manifest.status == "mismatch" and report.status == FLAGGED
    assert result.exit_code == 1 and "BAD" in inspection_text(result)


def test_unlisted_and_mismatched_clients_are_run_problems(uer_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(uer_run, run)
    write_client(run / "client_007.h5", mechanism="none", client_index=1, client_count=3)
    result = inspect_path(run)
    assert result.exit_code == 1
    assert any("attribute 'mechanism' differs" in p for p in result.problems)
    assert any("client indices [1] appear in more than one file" in p for p in result.problems)
    extra = next(f for f in result.files if f.name == "client_007.h5")
    assert extra.status == FLAGGED and "not listed in manifest.json" in extra.flags
    assert "run problems" in inspection_text(result)


def test_directory_without_client_files(tmp_path: Path) -> None:
    result = invoke(tmp_path)
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [f"Error: {tmp_path}: no client files (*.h5) and no manifest listing any: "
                                          "not an ldpfl run directory"]


def test_malformed_metrics_is_a_note(uer_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(uer_run, run)
    (run / "federation" / "metrics.json").write_text('{"rounds": [{"round": "x"')
    result = inspect_path(run)
    assert result.ok and result.federation.problem and "unreadable" in result.notes[-1]


# ----------------------------------------------------------------------------------------------------
# Plot, help, imports.


@pytest.mark.parametrize("target", ["uer-run", "uer-file", "pdpm-run"])
def test_plot_is_a_readable_png(target: str, uer_run: Path, pdpm_run: Path, tmp_path: Path) -> None:
    from matplotlib import image

    path = {"uer-run": uer_run, "uer-file": uer_run / client_file_name(0), "pdpm-run": pdpm_run}[target]
    out = tmp_path / "inspect.png"
    result = invoke(path, "--plot", out)
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.stdout
    assert out.read_bytes()[:8] == PNG_SIGNATURE
    pixels = image.imread(out)
    panels = 3 if target == "uer-run" else 2  # accuracy per round only where metrics.json exists
    assert pixels.ndim == 3 and pixels.shape[0] >= panels * 300 and pixels.shape[1] >= 1000
    assert float(pixels[..., :3].std()) > 0.05  # not a blank image
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inspect.png"]  # no temporary file left


def test_plot_with_json_keeps_stdout_pure(uer_run: Path, tmp_path: Path) -> None:
    result = invoke(uer_run, "--json", "--plot", tmp_path / "p.png")
    assert result.exit_code == 0 and strict_json(result.stdout)["ok"]
    assert "wrote" in result.stderr


def test_plot_into_a_missing_directory(uer_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "missing" / "p.png"
    result = invoke(uer_run, "--plot", out)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.splitlines() == [f"Error: {out}: directory {out.parent} does not exist"]


def test_help_describes_the_command() -> None:
    result = CliRunner().invoke(cli, ["inspect", "--help"])
    assert result.exit_code == 0
    for text in ("client file", "run directory", "Fletcher-32", "--json", "--details", "--plot", "Exit status"):
        assert text in result.output


@pytest.mark.parametrize("plot", [False, True])
def test_inspect_imports_neither_tensorflow_nor_torch(plot: bool, uer_run: Path, tmp_path: Path) -> None:
    args = ["inspect", str(uer_run)] + (["--plot", str(tmp_path / "p.png")] if plot else [])
    _, heavy = heavy_modules_after(args)
    assert heavy == (["matplotlib"] if plot else [])
