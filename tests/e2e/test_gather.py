"""``ldpfl.contract.gather``: the silos' single-file run directories gathered into one run that federate reads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import pytest
from federate_files import write_run

from ldpfl.contract.client_reader import open_client_file
from ldpfl.contract.digest import sha256_file
from ldpfl.contract.gather import GatherError, gather_runs
from ldpfl.contract.layout import MANIFEST_NAME, client_file_name
from ldpfl.contract.manifest import read_manifest, record_for, write_manifest
from ldpfl.contract.plan import PLAN_FILE, SharedPlan, write_plan
from ldpfl.contract.run_dir import validate_run
from ldpfl.contract.schema import FormatError
from ldpfl.mechanisms import MechanismSpec


def split_into_silos(run_dir: Path, root: Path, plan: SharedPlan | list | None = None) -> list[Path]:
    """One run directory per client file, each with a manifest listing only its file (as a silo's export).

    With ``plan`` (one for all, or one per silo): each file records its fingerprint and its silo holds a copy.
    """
    manifest = read_manifest(run_dir)
    silos = []
    plans = plan if isinstance(plan, list) else [plan] * len(manifest.files)
    for record, plan in zip(manifest.files, plans, strict=True):
        silo = root / f"silo_{record.client_index}"
        silo.mkdir(parents=True)
        target = silo / record.path
        shutil.copyfile(run_dir / record.path, target)
        if plan is not None:
            with h5py.File(target, "r+") as handle:
                handle.attrs["plan_fingerprint"] = plan.fingerprint
            write_plan(plan, silo / PLAN_FILE)
        write_manifest(silo, [record_for(target, record.client_index, sha256_file(target), record.rows)],
                       {"tool": "ldpfl export"})
        silos.append(silo)
    return silos


def a_plan(epsilon: float = 0.5) -> SharedPlan:
    spec = MechanismSpec.resolve("uer", {"epsilon": epsilon, "alpha": 10.0, "integer_bits": 2, "fraction_bits": 3},
                                 features=8)
    return SharedPlan("mnist5k", ("0", "1", "2", "3"), "synthetic", (8,), 8, spec)


def no_leftovers(root: Path) -> bool:
    return not [p for p in root.iterdir() if p.name.startswith(".")]


def test_gathered_run_validates_and_keeps_every_file(tmp_path):
    silos = split_into_silos(write_run(tmp_path / "all", clients=3), tmp_path / "silos", a_plan())
    result = gather_runs(silos, tmp_path / "run")
    manifest, files = validate_run(tmp_path / "run")
    assert [r.client_index for r in manifest.files] == [0, 1, 2]
    assert manifest.info["tool"] == "ldpfl gather" and manifest.info["plan_fingerprint"] == a_plan().fingerprint
    assert result.plan_fingerprint == a_plan().fingerprint
    assert json.loads((tmp_path / "run" / PLAN_FILE).read_text())["fingerprint"] == a_plan().fingerprint
    for index in range(3):
        name = client_file_name(index)
        assert (tmp_path / "run" / name).read_bytes() == (tmp_path / "silos" / f"silo_{index}" / name).read_bytes()
        assert files[index][1].plan_fingerprint == a_plan().fingerprint
    assert no_leftovers(tmp_path)


def test_a_file_exported_without_the_plan_is_named(tmp_path):
    silos = split_into_silos(write_run(tmp_path / "all", clients=2), tmp_path / "silos")
    for silo in silos:
        write_plan(a_plan(), silo / PLAN_FILE)  # the plan is there, but the files do not record it
    with pytest.raises(ValueError) as error:  # the source's own validation (run_dir.plan_problems) finds it
        gather_runs(silos, tmp_path / "run")
    assert str(silos[0]) in str(error.value)
    assert f"{client_file_name(0)} was not exported with {PLAN_FILE}" in str(error.value)
    assert not (tmp_path / "run").exists() and no_leftovers(tmp_path)


def test_refusals_name_the_disagreeing_file_and_leave_nothing(tmp_path):
    silos = split_into_silos(write_run(tmp_path / "all", clients=3, features_of={2: 9}), tmp_path / "silos")
    with pytest.raises(FormatError) as error:
        gather_runs(silos, tmp_path / "run")
    assert "do not form one run" in str(error.value) and "silo_2/client_002.h5" in str(error.value)
    assert not (tmp_path / "run").exists() and no_leftovers(tmp_path)

    same = split_into_silos(write_run(tmp_path / "b", clients=2), tmp_path / "same")
    twice = tmp_path / "again"
    shutil.copytree(same[0], twice)
    with pytest.raises(GatherError, match="is client 0, and so is"):
        gather_runs([same[0], twice], tmp_path / "run")
    with pytest.raises(GatherError, match="given twice"):
        gather_runs([same[0], same[0]], tmp_path / "run")

    two = split_into_silos(write_run(tmp_path / "c", clients=2), tmp_path / "two", [a_plan(), a_plan(epsilon=1.0)])
    with pytest.raises(GatherError) as error:
        gather_runs(two, tmp_path / "run")
    assert str(two[1] / PLAN_FILE) in str(error.value) and "is not the plan of" in str(error.value)
    mixed = [two[0], same[1]]  # silo 1 exported without a plan
    with pytest.raises(GatherError, match=f"{same[1]} has no {PLAN_FILE}"):
        gather_runs(mixed, tmp_path / "run")
    with pytest.raises(GatherError, match="not the plan of the plan given"):
        gather_runs(two[:1], tmp_path / "run", plan=a_plan(epsilon=2.0))

    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(GatherError, match="not an empty directory"):
        gather_runs(same[:1], tmp_path / "full")
    assert not (tmp_path / "run").exists() and no_leftovers(tmp_path)


def test_a_corrupt_source_is_named(tmp_path):
    silos = split_into_silos(write_run(tmp_path / "all", clients=2), tmp_path / "silos")
    target = silos[1] / client_file_name(1)
    data = bytearray(target.read_bytes())
    data[-10] ^= 0xFF
    target.write_bytes(bytes(data))
    with pytest.raises(FormatError) as error:
        gather_runs(silos, tmp_path / "run")
    assert str(target) in str(error.value) and "sha256" in str(error.value)
    assert not (tmp_path / "run").exists()
    assert (silos[0] / MANIFEST_NAME).is_file()


def test_class_names_round_trip_and_must_agree(tmp_path):
    silos = split_into_silos(write_run(tmp_path / "all", clients=2), tmp_path / "silos", a_plan())
    for silo, names in zip(silos, (["0", "1", "2", "3"], ["0", "1", "3", "2"]), strict=True):
        path = silo / client_file_name(int(silo.name[-1]))
        with h5py.File(path, "r+") as handle:
            handle.attrs["class_names"] = json.dumps(names)
        rows = read_manifest(silo).files[0].rows
        write_manifest(silo, [record_for(path, int(silo.name[-1]), sha256_file(path), rows)], {"tool": "ldpfl export"})
    _, listed = validate_run(silos[0])
    assert listed[0][1].class_names == ("0", "1", "2", "3")
    with pytest.raises(FormatError) as error:
        gather_runs(silos, tmp_path / "run")
    assert "attribute 'class_names' differs" in str(error.value) and str(silos[1] / client_file_name(1)) in str(
        error.value)
    with h5py.File(silos[1] / client_file_name(1), "r+") as handle:  # 3 names for 4 classes: the file is invalid
        handle.attrs["class_names"] = json.dumps(["a", "b", "c"])
    with pytest.raises(FormatError, match="'class_names' holds 3 names"), \
            open_client_file(silos[1] / client_file_name(1)):
        pass
