"""Issue 42 item 3: a silo's duplicated records are counted at gather and inspect, and dropped with --dedupe."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from federate_files import write_run

from ldpfl.cli import cli
from ldpfl.contract.client_reader import read_client_file
from ldpfl.contract.client_writer import write_client_file
from ldpfl.contract.digest import sha256_file
from ldpfl.contract.duplicates import (
    DuplicateCount,
    beyond_chance,
    chance_pairs,
    count_and_keep,
    count_duplicates,
    log_equal_bits,
    log_equal_values,
    row_digests,
)
from ldpfl.contract.gather import gather_runs
from ldpfl.contract.layout import client_file_name
from ldpfl.contract.manifest import read_manifest, record_for, write_manifest
from ldpfl.contract.run_dir import validate_run
from ldpfl.contract.schema import label_histogram


def test_digests_tell_records_apart_by_bytes_and_label():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 5)).astype(np.float32)
    y = rng.integers(0, 3, 200)
    x[7], y[7] = x[2], y[2]  # a repeated record
    x[8], y[8] = x[3], (y[3] + 1) % 3  # the same row with another label: another record
    x[9] = x[4]
    x[9, 0] = -x[4, 0]  # one sign bit apart
    digests = row_digests(x, y)
    assert len(np.unique(digests)) == 199
    swapped = x.copy()
    swapped[:, [0, 1]] = swapped[:, [1, 0]]  # the same words in other columns
    assert not np.isin(row_digests(swapped, y), digests).any()


def test_counts_and_what_dedupe_keeps():
    train = row_digests(np.arange(12, dtype=np.uint8).reshape(6, 2) % 8, np.zeros(6))  # rows 4, 5 repeat 0, 1
    test = row_digests(np.array([[0, 1], [9, 9], [9, 9], [2, 3]], dtype=np.uint8), np.zeros(4))
    counts, keep = count_and_keep({"train": train, "test": test})
    assert counts == DuplicateCount(train=2, test=1, test_in_train=2)
    assert keep["train"].tolist() == [True, True, True, True, False, False]
    assert keep["test"].tolist() == [False, True, False, False]
    assert counts.total == 5 == (~keep["train"]).sum() + (~keep["test"]).sum()


def test_chance_of_equal_rows_and_the_flag_bound():
    assert np.exp(log_equal_bits(np.full(10, 0.5))) == pytest.approx(2.0**-10)
    assert np.exp(log_equal_bits(np.array([0.0, 1.0]))) == pytest.approx(1.0)  # constant bits always agree
    assert np.exp(log_equal_values(np.array([[0.5, 0.25, 0.25]] * 2))) == pytest.approx(0.375**2)
    assert chance_pairs(1001, np.log(1e-3)) == pytest.approx(500.5)
    # PDPM on 12 coordinates: 320 rows hold a few equal pairs by chance; a few repeats are not flagged, 30 are
    pairs = chance_pairs(320, log_equal_values(np.array([[0.6, 0.2, 0.2]] * 12)))
    assert 1 < pairs < 5
    assert not beyond_chance(5, pairs) and beyond_chance(30, pairs)
    assert beyond_chance(5, 0.0) and not beyond_chance(0, 0.0)


def repeat_records(run_dir: Path, index: int, copies: int = 10, test_from_train: int = 8) -> Path:
    """Rewrite client ``index`` as the issue's faulty silo: its training rows ``copies`` times with flipped labels,
    and its first test rows replaced by training rows; its manifest entry follows."""
    path = run_dir / client_file_name(index)
    data = read_client_file(path)
    x, y = data.features["train"], data.labels["train"]
    tx, ty = data.features["test"].copy(), data.labels["test"].copy()
    tx[:test_from_train], ty[:test_from_train] = x[:test_from_train], y[:test_from_train]
    flipped = (y + 1) % data.metadata.num_classes
    train = (np.concatenate([x, *[x] * (copies - 1)]), np.concatenate([y, *[flipped] * (copies - 1)]))
    splits = {"train": train, "test": (tx, ty)}
    meta = dataclasses.replace(data.metadata, label_histograms={
        s: label_histogram(labels, data.metadata.num_classes) for s, (_, labels) in splits.items()})
    digest = write_client_file(path, meta, splits, overwrite=True)
    manifest = read_manifest(run_dir)
    records = [record_for(path, index, digest, {s: len(v[1]) for s, v in splits.items()}) if r.client_index == index
               else r for r in manifest.files]
    write_manifest(run_dir, records, manifest.info)
    return path


def silos_of(run_dir: Path, root: Path) -> list[Path]:
    """One run directory per client file (as separate silos export them)."""
    silos = []
    for record in read_manifest(run_dir).files:
        silo = root / f"silo_{record.client_index}"
        silo.mkdir(parents=True)
        target = silo / record.path
        target.write_bytes((run_dir / record.path).read_bytes())
        write_manifest(silo, [record_for(target, record.client_index, sha256_file(target), record.rows)],
                       {"tool": "ldpfl export"})
        silos.append(silo)
    return silos


@pytest.fixture
def faulty_silos(tmp_path: Path) -> list[Path]:
    run = write_run(tmp_path / "all", clients=3, rows=40)
    repeat_records(run, 2)  # 40 train rows: 9 repeated copies (flipped, so 40 records twice: 40 + 320 repeats)
    return silos_of(run, tmp_path / "silos")


FAULTY = DuplicateCount(train=320, test=0, test_in_train=8)  # copies 2-10 of the 40 training rows with 2 labels:
# 40 rows + 40 flipped distinct records, 320 repeats; 8 test rows repeat training rows


def test_gather_counts_each_silos_duplicates_and_keeps_them(faulty_silos, tmp_path):
    result = gather_runs(faulty_silos, tmp_path / "run")
    assert result.duplicates == {0: DuplicateCount(), 1: DuplicateCount(), 2: FAULTY}
    assert not result.deduplicated
    assert [line.split()[2] for line in result.duplicate_lines()] == ["2"]
    assert "320 duplicated training rows" in result.duplicate_lines()[0] and "--dedupe" in result.duplicate_lines()[0]
    assert (tmp_path / "run" / client_file_name(2)).read_bytes() == \
        (faulty_silos[2] / client_file_name(2)).read_bytes()
    assert result.to_dict()["files"][2]["duplicates"] == FAULTY.to_dict()


def test_gather_dedupe_drops_them_and_the_run_validates(faulty_silos, tmp_path):
    result = gather_runs(faulty_silos, tmp_path / "run", dedupe=True)
    manifest, files = validate_run(tmp_path / "run")
    entry = {r.client_index: r for r in manifest.files}
    assert entry[2].rows == {"train": 80, "test": 12}  # 400 - 320, 20 - 8
    assert count_duplicates(tmp_path / "run" / client_file_name(2)) == DuplicateCount()
    assert manifest.info["deduplicated"] == {"2": FAULTY.to_dict()}
    assert files[2][1].label_histograms["train"] == label_histogram(
        read_client_file(tmp_path / "run" / client_file_name(2)).labels["train"], 4)
    for index in (0, 1):  # files without duplicates are the silos' bytes
        assert entry[index].sha256 == sha256_file(faulty_silos[index] / client_file_name(index))
    assert result.to_dict()["files"][2]["dropped"] == FAULTY.total


def test_cli_gather_and_inspect_report_duplicates(faulty_silos, tmp_path):
    runner = CliRunner()
    out = runner.invoke(cli, ["gather", *map(str, faulty_silos), "--out", str(tmp_path / "run"), "--json"])
    assert out.exit_code == 0, out.output
    summary = json.loads(out.output)
    assert summary["files"][2]["duplicates"]["test_in_train"] == 8 and "seed" not in out.output
    text = runner.invoke(cli, ["gather", *map(str, faulty_silos), "--out", str(tmp_path / "clean"), "--dedupe"])
    assert text.exit_code == 0 and "dropped" in text.output
    assert "client   2  320 duplicated training rows" in text.output

    faulty = tmp_path / "run" / client_file_name(2)
    shown = runner.invoke(cli, ["inspect", str(faulty)])
    assert shown.exit_code == 1  # flagged
    assert FAULTY.describe() in shown.output
    assert FAULTY.describe() == "320 duplicated training rows, 0 duplicated test rows, 8 test rows that repeat a " \
                                "training row"
    found = json.loads(runner.invoke(cli, ["inspect", str(faulty), "--json"]).output)
    assert found["files"][0]["duplicates"] == FAULTY.to_dict() | {"chance_pairs": pytest.approx(0, abs=1e-3)}
    clean = runner.invoke(cli, ["inspect", str(tmp_path / "clean" / client_file_name(2)), "--json"])
    assert json.loads(clean.output)["files"][0]["duplicates"]["total"] == 0
    run = runner.invoke(cli, ["inspect", str(tmp_path / "run")])
    assert "client 2: 320 duplicated training rows" in run.output
