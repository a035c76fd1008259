"""``contract.gather``: the silos' single-file run directories gathered into one run that federate reads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from federate_files import write_run

from contract.gather import GatherError, gather_runs
from contract.layout import MANIFEST_NAME, client_file_name
from contract.manifest import read_manifest, write_manifest
from contract.plan import PLAN_FILE, SharedPlan, write_plan
from contract.run_dir import validate_run
from contract.schema import FormatError
from mechanisms import MechanismSpec


def split_into_silos(run_dir: Path, root: Path) -> list[Path]:
    """One run directory per client file, each with a manifest listing only its file (as a silo's export)."""
    manifest = read_manifest(run_dir)
    silos = []
    for record in manifest.files:
        silo = root / f"silo_{record.client_index}"
        silo.mkdir(parents=True)
        shutil.copyfile(run_dir / record.path, silo / record.path)
        write_manifest(silo, [record], {"tool": "ldpfl export"})
        silos.append(silo)
    return silos


def a_plan(epsilon: float = 0.5) -> SharedPlan:
    spec = MechanismSpec.resolve("uer", {"epsilon": epsilon, "alpha": 10.0, "integer_bits": 2, "fraction_bits": 3},
                                 features=8)
    return SharedPlan("mnist5k", ("0", "1", "2", "3"), "synthetic", (8,), 8, spec)


def no_leftovers(root: Path) -> bool:
    return not [p for p in root.iterdir() if p.name.startswith(".")]


def test_gathered_run_validates_and_keeps_every_file(tmp_path):
    silos = split_into_silos(write_run(tmp_path / "all", clients=3), tmp_path / "silos")
    for silo in silos:
        write_plan(a_plan(), silo / PLAN_FILE)
    result = gather_runs(silos, tmp_path / "run")
    manifest, files = validate_run(tmp_path / "run")
    assert [r.client_index for r in manifest.files] == [0, 1, 2]
    assert manifest.info["tool"] == "ldpfl gather" and manifest.info["plan_fingerprint"] == a_plan().fingerprint
    assert result.plan_fingerprint == a_plan().fingerprint
    assert json.loads((tmp_path / "run" / PLAN_FILE).read_text())["fingerprint"] == a_plan().fingerprint
    for index in range(3):
        name = client_file_name(index)
        assert (tmp_path / "run" / name).read_bytes() == (tmp_path / "all" / name).read_bytes()
    assert no_leftovers(tmp_path)


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

    write_plan(a_plan(), same[0] / PLAN_FILE)
    write_plan(a_plan(epsilon=1.0), same[1] / PLAN_FILE)
    with pytest.raises(GatherError) as error:
        gather_runs(same, tmp_path / "run")
    assert str(same[1] / PLAN_FILE) in str(error.value) and "is not the plan of" in str(error.value)
    (same[1] / PLAN_FILE).unlink()
    with pytest.raises(GatherError, match=f"{same[1]} has no {PLAN_FILE}"):
        gather_runs(same, tmp_path / "run")
    with pytest.raises(GatherError, match="not the plan of the plan given"):
        gather_runs(same[:1], tmp_path / "run", plan=a_plan(epsilon=2.0))

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
