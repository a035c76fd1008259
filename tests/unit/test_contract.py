"""The file contract (``contract/``): atomic writes, JSON helpers, schema versions, HDF5 interop, run checks."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest
from federate_files import write_run

from ldpfl.contract.atomic import atomic_path, atomic_write, atomic_write_text
from ldpfl.contract.client_reader import open_client_file, read_client_file
from ldpfl.contract.jsonout import json_ready, refuse_seed_keys
from ldpfl.contract.layout import METRICS_PATH, client_file_name, client_files, client_index_from_name
from ldpfl.contract.manifest import read_manifest, write_manifest
from ldpfl.contract.run_dir import check_run_dir, validate_run
from ldpfl.contract.schema import SCHEMA_VERSION, SUPPORTED_SCHEMA_VERSIONS, FormatError
from ldpfl.contract.version import package_version

H5DUMP = shutil.which("h5dump")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return write_run(tmp_path_factory.mktemp("run"), clients=2, rows=16)


# ----------------------------------------------------------------------------------------------------
# Atomic writes


def test_atomic_write_replaces_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "out.bin"
    atomic_write(target, lambda handle: handle.write(b"first"))
    atomic_write_text(target, "second")
    assert target.read_text() == "second" and [p.name for p in target.parent.iterdir()] == ["out.bin"]


def test_a_failed_atomic_write_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")

    def fail(handle) -> None:
        handle.write(b"half")
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        atomic_write(target, fail)
    with pytest.raises(KeyError), atomic_path(target, suffix=".keras") as tmp:
        tmp.write_text("half")
        assert tmp.name.startswith(".out.txt.") and tmp.name.endswith(".tmp.keras")
        raise KeyError("interrupted")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]


# ----------------------------------------------------------------------------------------------------
# JSON, names, version


def test_json_ready_and_seed_refusal() -> None:
    data = {"a": np.float32(0.5), "b": [math.inf, -math.inf, math.nan], "c": np.arange(2), "p": Path("x")}
    assert json.dumps(json_ready(data)) == '{"a": 0.5, "b": ["inf", "-inf", null], "c": [0, 1], "p": "x"}'
    refuse_seed_keys({"randomness": "seeded", "config": [{"clients": 2}]}, "config")
    with pytest.raises(ValueError, match="found key 'root_seed'"):
        refuse_seed_keys({"config": [{"root_seed": 1}]}, "config")


def test_client_file_names_and_paths(run: Path) -> None:
    assert client_file_name(7) == "client_007.h5" and client_index_from_name("client_1234.h5") == 1234
    assert client_index_from_name("client_1.h5") is None and client_index_from_name(".client_000.h5.1.tmp") is None
    assert sorted(client_files(run)) == [0, 1] and METRICS_PATH == Path("federation") / "metrics.json"
    assert package_version() and package_version() != "unknown"


# ----------------------------------------------------------------------------------------------------
# Schema versions and HDF5 interop


def test_booleans_are_int8_and_version_1_files_still_read(run: Path, tmp_path: Path) -> None:
    path = tmp_path / "client_000.h5"
    shutil.copyfile(run / client_file_name(0), path)
    with h5py.File(path, "r") as handle:
        assert handle.attrs["private"].dtype == np.int8 and handle.attrs["schema_version"] == SCHEMA_VERSION == 7
        assert handle.attrs["release"] == "flatten" and handle.attrs["local_only"] == 0
        assert handle.attrs["generator"] == "PCG64"  # the fixture's run is seeded
    with h5py.File(path, "r+") as handle:  # what version 4 wrote: no generator (every writer used PCG64)
        handle.attrs["schema_version"] = 4
        del handle.attrs["generator"]
    assert read_client_file(path).metadata.generator == "PCG64"
    with h5py.File(path, "r+") as handle:  # what version 1 wrote: a numpy-bool enum, no release/local_only
        handle.attrs["private"] = np.bool_(False)
        handle.attrs["schema_version"] = 1
        del handle.attrs["release"], handle.attrs["local_only"]
    with open_client_file(path) as (_, metadata, rows):
        assert metadata.schema_version == 1 and not metadata.private and rows["train"] == 16
        assert metadata.release == "flatten" and not metadata.local_only  # versions 1 and 2: flatten, shared
        assert metadata.generator == "PCG64"
    with h5py.File(path, "r+") as handle:  # version 3 must carry the attributes version 3 added
        handle.attrs["schema_version"] = 3
    with pytest.raises(FormatError, match="missing attribute 'release'"):
        read_client_file(path)
    with h5py.File(path, "r+") as handle:  # version 5 must carry the generator
        handle.attrs["schema_version"] = 5
        handle.attrs["release"], handle.attrs["local_only"] = "flatten", np.int8(0)
    with pytest.raises(FormatError, match="missing attribute 'generator'"):
        read_client_file(path)
    with h5py.File(path, "r+") as handle:
        handle.attrs["schema_version"] = 8
    with pytest.raises(FormatError, match="'schema_version' is 8, this reader supports 1, 2, 3, 4, 5, 6, 7"):
        read_client_file(path)


def test_version_1_manifest_is_read_and_unknown_versions_refused(run: Path, tmp_path: Path) -> None:
    target = tmp_path / "run"
    shutil.copytree(run, target)
    path = target / "manifest.json"
    for version in SUPPORTED_SCHEMA_VERSIONS:
        path.write_text(json.dumps(json.loads(path.read_text()) | {"schema_version": version}))
        assert len(read_manifest(target).files) == 2
    path.write_text(json.dumps(json.loads(path.read_text()) | {"schema_version": 9}))
    with pytest.raises(FormatError, match="'schema_version' is 9"):
        read_manifest(target)


@pytest.mark.skipif(H5DUMP is None, reason="h5dump (Debian package hdf5-tools) is not installed")
def test_h5dump_prints_every_root_attribute(run: Path) -> None:
    path = run / client_file_name(0)
    with h5py.File(path, "r") as handle:
        names = sorted(handle.attrs)
    assert {"private", "schema", "schema_version", "privacy_report"} <= set(names)
    result = subprocess.run([H5DUMP, "-A", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    printed = [line.split('"')[1] for line in result.stdout.splitlines() if line.strip().startswith("ATTRIBUTE")]
    assert sorted(printed) == names


# ----------------------------------------------------------------------------------------------------
# The run-directory validator


def test_check_run_dir_reports_every_fact_without_raising(run: Path, tmp_path: Path) -> None:
    target = tmp_path / "run"
    shutil.copytree(run, target)
    shutil.copyfile(target / client_file_name(1), target / "client_005.h5")  # unlisted, misnamed
    (target / ".client_009.h5.123.ab.tmp").write_bytes(b"half written")  # ignored
    check = check_run_dir(target)
    assert [f.name for f in check.files] == ["client_000.h5", "client_001.h5", "client_005.h5"]
    assert [f.error for f in check.listed] == [None, None]
    extra = check.unlisted[0]
    assert extra.record is None and extra.error is None and extra.sha256_matches is None
    assert extra.name_problem() == "attribute 'client_index' is 1 but the file is named client_005.h5"
    assert check.problems() == ["client indices [1] appear in more than one file"]
    assert [f.name for f in check_run_dir(target, unlisted=False).files] == ["client_000.h5", "client_001.h5"]
    with pytest.raises(FormatError, match=r"lists 2 of the 3 client files .* not listed: client_005\.h5"):
        validate_run(target)  # federate refuses to leave a present client file out silently (issue 13)
    (target / "client_005.h5").unlink()
    manifest, checked = validate_run(target)
    assert [record.client_index for record, _ in checked] == [0, 1] and len(manifest.files) == 2


def test_validate_run_names_the_first_problem(run: Path, tmp_path: Path) -> None:
    target = tmp_path / "run"
    shutil.copytree(run, target)
    manifest = read_manifest(target)
    write_manifest(target, [], manifest.info)
    with pytest.raises(FormatError, match="lists no client files"):
        validate_run(target)
    write_manifest(target, [manifest.files[0], manifest.files[0]], manifest.info)
    with pytest.raises(FormatError, match=r"lists a client index twice: \[0, 0\]"):
        validate_run(target)
    swapped = [manifest.files[0].__class__(1, "client_000.h5", manifest.files[0].sha256, manifest.files[0].bytes,
                                           manifest.files[0].rows)]
    write_manifest(target, swapped, manifest.info)
    with pytest.raises(FormatError, match="attribute 'client_index' is 0 but the manifest lists this file as client 1"):
        validate_run(target)
    (target / client_file_name(0)).unlink()
    check = check_run_dir(target)
    assert check.listed[0].error is not None and "listed in the manifest but missing" in str(check.listed[0].error)
    shutil.rmtree(target)
    assert "no manifest" in str(check_run_dir(target).manifest_error) and check_run_dir(target).files == ()


def test_available_memory_is_psutils_figure_capped_by_the_cgroup(tmp_path: Path, monkeypatch) -> None:
    import collections

    import psutil

    from ldpfl.contract import memory

    figure = collections.namedtuple("svmem", "available")
    monkeypatch.setattr(psutil, "virtual_memory", lambda: figure(5000))
    monkeypatch.setattr(memory, "_CGROUP", tmp_path)
    assert memory.available_memory() == (5000, "available memory per psutil")  # no cgroup files
    (tmp_path / "memory.max").write_text("max\n")
    assert memory.available_memory()[0] == 5000  # a cgroup without a limit
    (tmp_path / "memory.max").write_text("3000\n")
    (tmp_path / "memory.current").write_text("1000\n")
    assert memory.available_memory() == (2000, "the cgroup's memory.max less memory.current")
    (tmp_path / "memory.current").write_text("9000\n")
    assert memory.available_memory()[0] == 0  # over the limit: nothing left
    (tmp_path / "memory.max").write_text("100000\n")
    assert memory.available_memory()[0] == 5000  # the system's figure is the smaller
    assert memory.memory_shortfall(4000) is None
    assert memory.memory_shortfall(6000) == ("needs at least 5.9 KiB of memory, but only 4.9 KiB is available "
                                             "(available memory per psutil)")
