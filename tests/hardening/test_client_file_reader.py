"""Issue 13, hostile files: each case gives a quick one-line error, and federate refuses what inspect flags.

The files are made valid first, then altered, and the manifest is rewritten with their new sha256 (as a
forger would), so that the check under test, not the sha256 comparison, has to catch them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from cli_checks import stderr_error_line as error_line
from click.testing import CliRunner
from federate_files import write_run

from ldpfl import mechanisms as mech
from ldpfl.cli import cli
from ldpfl.contract.client_reader import open_client_file, read_client_file
from ldpfl.contract.digest import sha256_file
from ldpfl.contract.layout import client_file_name
from ldpfl.contract.manifest import read_manifest, record_for, write_manifest
from ldpfl.contract.run_dir import check_client_file, validate_run
from ldpfl.contract.schema import ClientMetadata, FormatError, label_histogram

FAST = ["--hidden", "8", "--local-epochs", "1", "--batch-size", "16", "--threads", "1", "--seed", "3", "-q"]


def resign(run_dir: Path) -> None:
    """Rewrite the manifest with the files' current sha256 and rows (a forged but consistent run)."""
    manifest = read_manifest(run_dir)
    records = [record_for(run_dir / r.path, r.client_index, sha256_file(run_dir / r.path), r.rows)
               for r in manifest.files]
    info = {k: v for k, v in manifest.info.items() if k not in ("schema", "schema_version", "updated_utc")}
    write_manifest(run_dir, records, info)


def altered_run(tmp_path: Path, name: str, alter) -> Path:
    run = write_run(tmp_path / name, clients=2, rows=16)
    for index in range(2):
        with h5py.File(run / client_file_name(index), "r+") as handle:
            alter(handle)
    resign(run)
    return run


def federate(run: Path, tmp_path: Path):
    return CliRunner().invoke(cli, ["federate", str(run), *FAST, "--rounds", "1", "--out", str(tmp_path / "out")])


def inspect(path: Path):
    return CliRunner().invoke(cli, ["inspect", str(path)])


# ------------------------------------------------------------ case 6/7: attributes that used to trace back

ATTRIBUTE_CASES = {
    "schema_version-array": ("schema_version", np.array([2, 2]), "attribute 'schema_version' is an array of shape"),
    "schema_version-1-array": ("schema_version", np.array([2]), "attribute 'schema_version' is an array of shape"),
    "schema_version-abc": ("schema_version", "abc", "attribute 'schema_version' is 'abc'"),
    "privacy_report-list": ("privacy_report", json.dumps([1, 2]), "attribute 'privacy_report' is not a JSON object"),
    "privacy_report-deep": ("privacy_report", "[" * 100_000, "attribute 'privacy_report' is malformed"),
    "num_classes-inf": ("num_classes", np.float64(np.inf), "attribute 'num_classes' is malformed"),
    "client_index-array": ("client_index", np.arange(3), "attribute 'client_index' is malformed"),
}


@pytest.mark.parametrize("case", ATTRIBUTE_CASES)
def test_malformed_attribute_is_one_line_naming_the_file(case, tmp_path) -> None:
    name, value, expected = ATTRIBUTE_CASES[case]
    run = altered_run(tmp_path, "run", lambda handle: handle.attrs.__setitem__(name, value))
    path = run / client_file_name(0)
    for result, code in ((federate(run, tmp_path), 2), (inspect(path), 1)):
        line = error_line(result, code)
        assert str(path) in line and expected in line, line


def test_manifest_of_deeply_nested_brackets(tmp_path) -> None:
    run = write_run(tmp_path / "run", clients=2, rows=16)
    (run / "manifest.json").write_text("[" * 100_000)
    line = error_line(federate(run, tmp_path), 2)
    assert "manifest.json: unreadable manifest (JSON nested too deeply)" in line
    (run / "manifest.json").write_text("[]")
    assert "is a JSON list, not an object" in error_line(federate(run, tmp_path), 2)


# ---------------------------------------------- case 7: one validation path: federate refuses inspect's flags

FLAGGED = {
    "unknown-mechanism": (lambda h: h.attrs.__setitem__("mechanism", "bogus"), "do not build a mechanism"),
    "epsilon-minus-one": (
        lambda h: h.attrs.__setitem__("privacy_report", json.dumps(
            {**json.loads(h.attrs["privacy_report"]), "nominal_epsilon": -1.0})),
        "stored nominal_epsilon = -1.0"),
}


def _strip_checksums(handle: h5py.File) -> None:
    for split in ("train", "test"):
        for name in ("features", "labels"):
            data = handle[split][name][()]
            del handle[split][name]
            handle[split].create_dataset(name, data=data)


FLAGGED["no-fletcher32"] = (_strip_checksums, "carry no Fletcher-32 checksum")


@pytest.mark.parametrize("case", FLAGGED)
def test_federate_refuses_what_inspect_flags(case, tmp_path) -> None:
    alter, expected = FLAGGED[case]
    run = altered_run(tmp_path, "run", alter)
    path = run / client_file_name(0)
    flagged = inspect(path)
    assert flagged.exit_code != 0 and expected in flagged.output + flagged.stderr, flagged.output
    line = error_line(federate(run, tmp_path), 2)
    assert str(path) in line and expected in line, line
    assert check_client_file(path).error is not None  # the validator itself, for export's resume too
    with pytest.raises(FormatError, match=expected.replace("(", r"\(").replace(".", r"\.")):
        validate_run(run)


def test_a_listed_file_that_inspect_passes_is_accepted(tmp_path) -> None:
    run = write_run(tmp_path / "run", clients=2, rows=16)
    assert inspect(run / client_file_name(0)).exit_code == 0
    assert validate_run(run)[0].files


# ---------------------------------------------------- case 2: a 9 KB file declaring 58 GiB (chunks never written)

R_WIDE = 1_666_666  # · 6 bits = 9,999,996 bits → 1,250,000 bytes per row, at the schema's width limit


def crafted_wide_run(run_dir: Path, rows: int = 50_000) -> Path:
    """A run of one 9 KB client file declaring ``rows`` × 1,250,000 uint8 (58 GiB), its chunks never written."""
    run_dir.mkdir(parents=True)
    spec = mech.MechanismSpec.resolve("none", {"integer_bits": 2, "fraction_bits": 3}, features=R_WIDE)
    metadata = ClientMetadata(
        dataset="mnist5k", num_classes=4, client_index=0, client_count=1, partition={"kind": "crafted"},
        extractor="none", input_shape=(R_WIDE,), integer_bits=2, fraction_bits=3, features=R_WIDE,
        feature_format=spec.feature_format, mechanism=spec.name, mechanism_parameters=spec.recorded_parameters(),
        privacy_report=spec.report().to_dict(), randomness="seeded",
        label_histograms={"train": label_histogram(np.zeros(rows, dtype=np.int64), 4), "test": [0, 0, 0, 0]})
    path = run_dir / client_file_name(0)
    with h5py.File(path, "w", libver="latest") as handle:
        for split, count in (("train", rows), ("test", 0)):
            group = handle.create_group(split)
            group.create_dataset("features", shape=(count, metadata.stored_width), dtype=np.uint8,
                                 chunks=(1, metadata.stored_width), fletcher32=True, maxshape=(None, None))
            group.create_dataset("labels", shape=(count,), dtype=np.int32, chunks=(4096,), fletcher32=True,
                                 maxshape=(None,))
        for key, value in metadata.to_attrs().items():
            handle.attrs[key] = value
    assert path.stat().st_size < 64 * 1024
    write_manifest(run_dir, [record_for(path, 0, sha256_file(path), {"train": rows, "test": 0})],
                   {"dataset": "mnist5k"})
    return run_dir


def test_crafted_file_declaring_58_gib_is_a_quick_error_in_federate_and_inspect(tmp_path) -> None:
    run = crafted_wide_run(tmp_path / "run")
    path = run / client_file_name(0)
    for command, code in ((lambda: federate(run, tmp_path), 2), (lambda: inspect(path), 1)):
        started = time.perf_counter()
        line = error_line(command(), code)
        assert time.perf_counter() - started < 20
        assert str(path) in line and "stores only" in line and "never written" in line, line
    with pytest.raises(FormatError, match="never written"):
        read_client_file(path)


def test_whole_split_read_is_refused_beyond_available_memory(tmp_path, monkeypatch) -> None:
    run = write_run(tmp_path / "run", clients=1, rows=64)
    import ldpfl.contract.memory as memory
    monkeypatch.setattr(memory, "available_memory", lambda: (1000, "test"))
    with pytest.raises(FormatError, match=r"reading splits \['train', 'test'\] whole needs at least .* only 1000 B"):
        read_client_file(run / client_file_name(0))
    metadata, rows = check_client_file(run / client_file_name(0), read_data=True).metadata, None  # blockwise: fine
    assert metadata is not None and rows is None
    with open_client_file(run / client_file_name(0)) as (_, meta, _rows):
        assert meta.features == 8


# ------------------------------------------------------------------ case 7: a manifest that leaves files out


def test_federate_refuses_client_files_the_manifest_does_not_list(tmp_path) -> None:
    run = write_run(tmp_path / "run", clients=3, rows=16)
    manifest = read_manifest(run)
    write_manifest(run, manifest.files[:1], {"dataset": "mnist5k"})  # lists 1 of 3
    line = error_line(federate(run, tmp_path), 2)
    assert "lists 1 of the 3 client files" in line and "client_001.h5, client_002.h5" in line, line


def test_federating_fewer_clients_than_the_run_had_warns(tmp_path) -> None:
    run = write_run(tmp_path / "run", clients=3, rows=16)
    manifest = read_manifest(run)
    write_manifest(run, manifest.files[:2], {"dataset": "mnist5k"})
    (run / client_file_name(2)).unlink()  # never finished: no file, not listed
    result = federate(run, tmp_path)
    assert result.exit_code == 0, result.output
    assert "Warning: the run lists 2 client file(s) but its files say client_count 3" in result.stderr
