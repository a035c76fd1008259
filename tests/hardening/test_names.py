"""Issue 24 item 1: a name from a plan, a manifest or ``--name`` is a name, never a path.

A hostile or broken coordinator writes the plan and another silo the manifest; neither may make a command
write (or read) outside the directory it was given. ``ldpfl.contract.names.check_name`` is the one check;
these tests reproduce the reported cases (a plan whose ``dataset`` is an absolute path, ``--name ../../x``)
and fuzz plans and manifests with random names, comparing the file tree before and after each command.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from cli_checks import ok, one_error_line, run

from ldpfl.contract.layout import MANIFEST_NAME
from ldpfl.contract.manifest import read_manifest
from ldpfl.contract.names import MAX_NAME_BYTES, MAX_NAME_CHARS, UnsafeName, check_name, child_path, name_problem
from ldpfl.contract.plan import PLAN_FILE, PlanError, read_plan
from ldpfl.contract.schema import FormatError

UNSAFE = ["", ".", "..", "../x", "a/b", "/abs/dir", "a\\b", "x/../../y", "a..b", "\x00", "a\nb", "tab\tname",
          " lead", "trail ", "\u202eexe.gnp", "\udcff", "a" * (MAX_NAME_CHARS + 1), "é" * (MAX_NAME_BYTES // 2 + 1)]
SAFE = ["shapes", "mnist5k", "fashion-mnist", "Clinic A", "données", "日本語", "a.b", "x" * MAX_NAME_CHARS]


@pytest.mark.parametrize("name", UNSAFE)
def test_unsafe_names_are_refused_naming_the_origin(name):
    assert name_problem(name) is not None
    with pytest.raises(UnsafeName, match="^name "):
        check_name(name, "name")
    with pytest.raises(UnsafeName) as caught:
        check_name(name, "name")
    assert caught.value.parameters == ("name",)  # the CLI shows it as --name


@pytest.mark.parametrize("name", SAFE)
def test_safe_names_pass_and_stay_in_their_directory(tmp_path, name):
    assert check_name(name, "name") == name
    assert child_path(tmp_path, name, "name").parent == tmp_path


def test_a_non_string_is_no_name():
    assert "must be a string" in name_problem(3)
    with pytest.raises(UnsafeName, match="key 'dataset' of plan.json 3 must be a string"):
        check_name(3, "key 'dataset' of plan.json")


# ---------------------------------------------------------------------------------------------------
# The command line


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Return every file under ``root`` with its size and mtime, and every directory (as ``(-1, 0)``)."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder, name)
            info = path.lstat()
            found[str(path.relative_to(root))] = (-1, 0) if path.is_dir() else (info.st_size, info.st_mtime_ns)
    return found


def changes(before: dict, after: dict) -> set[str]:
    """Return the paths created, removed or changed between two :func:`tree` snapshots."""
    return {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


@pytest.fixture
def silo(tmp_path, monkeypatch) -> dict[str, Path]:
    """A 40-record .npz silo, a valid plan over it, and a working directory 3 levels below ``tmp_path``."""
    rng = np.random.default_rng(24)
    data = tmp_path / "silo.npz"
    np.savez(data, x=rng.integers(0, 256, size=(40, 8, 8)).astype(np.uint8), y=np.arange(40) % 2)
    plan = tmp_path / PLAN_FILE
    ok(run("plan", "--data", data, "--name", "shapes", "--extractor", "none", "--mechanism", "uer", "--epsilon", 8,
           "-m", 1, "-n", 3, "--out", plan))
    work = tmp_path / "a" / "b" / "work"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    return {"root": tmp_path, "data": data, "plan": plan, "work": work}


def plan_naming(silo: dict[str, Path], dataset: str, path: Path) -> Path:
    """Write the silo's plan with ``dataset`` and no fingerprint (a coordinator's edit) to ``path``."""
    content = json.loads(silo["plan"].read_text())
    content["dataset"] = dataset
    del content["fingerprint"]
    path.write_text(json.dumps(content))
    return path


def silo_export(silo: dict[str, Path], *options: object):
    return run("export", "--data", silo["data"], "--client-index", 0, "--clients", 2, "--seed", 1, "--quiet",
               *options)


def test_a_plan_naming_an_absolute_directory_writes_nothing_there(silo):
    target = silo["root"] / "elsewhere"
    bad = plan_naming(silo, str(target), silo["root"] / "bad_plan.json")
    before = tree(silo["root"])
    line = one_error_line(silo_export(silo, "--plan", bad))
    assert "bad_plan.json" in line and "path separator" in line
    assert not target.exists() and changes(before, tree(silo["root"])) == set()
    with pytest.raises(PlanError, match="dataset"):
        read_plan(bad)


@pytest.mark.parametrize("name", ["../../x", "/abs/x", "..", "a/../b"])
def test_name_option_cannot_leave_runs(silo, name):
    before = tree(silo["root"])
    line = one_error_line(silo_export(silo, "--name", name))
    assert line.startswith("Error: --name ")
    assert changes(before, tree(silo["root"])) == set()
    one_error_line(run("plan", "--data", silo["data"], "--name", name, "--out", silo["root"] / "p.json"))
    assert changes(before, tree(silo["root"])) == set()


def test_a_safe_name_goes_under_runs(silo):
    ok(silo_export(silo, "--name", "clinic A", "--extractor", "none"))
    assert (silo["work"] / "runs" / "clinic A" / MANIFEST_NAME).is_file()


def fuzz_name(rng: np.random.Generator) -> str:
    """Return a random name: plain, or with separators, ``..``, an absolute path, unicode, controls, huge."""
    plain = "".join(rng.choice(list("abcXYZ019_-. é日€"), size=int(rng.integers(1, 12))))
    kind = int(rng.integers(0, 9))
    if kind == 0:
        return plain
    if kind == 1:
        return "/".join(["..", ".."][: int(rng.integers(1, 3))] + [plain])
    if kind == 2:
        return "/" + plain
    if kind == 3:
        return plain + rng.choice(["/", "\\", "\x00", "\n", "\udcff", "\u202e"]) + plain
    if kind == 4:
        return plain * int(rng.integers(40, 400))
    if kind == 5:
        return rng.choice([".", "..", "", " ", plain + " "])
    if kind == 6:
        return "".join(chr(int(c)) for c in rng.integers(0x20, 0x3000, size=int(rng.integers(1, 30))))
    return f"{plain}/{plain}" if kind == 7 else f"..{plain}"


def test_fuzzed_plan_names_write_nothing_outside_runs(silo):
    rng = np.random.default_rng(2024)
    root, runs = silo["root"], silo["work"] / "runs"
    plans = root / "plans"
    plans.mkdir()
    exported = 0
    for case in range(40):
        name = fuzz_name(rng)
        path = plan_naming(silo, name, plans / f"plan_{case}.json")
        before = tree(root)
        result = silo_export(silo, "--plan", path)
        created = changes(before, tree(root))
        outside = {p for p in created if not (root / p).resolve().is_relative_to(runs)}
        assert outside == set(), (name, outside)
        if name_problem(name) is None:
            assert result.exit_code == 0, (name, result.output)
            assert (runs / name / MANIFEST_NAME).is_file()
            exported += 1
        else:
            assert created == set(), (name, created)
            assert "Error:" in one_error_line(result)
    assert 0 < exported < 40  # both kinds were drawn


def test_fuzzed_manifest_names_read_and_gather_nothing_outside(silo):
    rng = np.random.default_rng(4242)
    root = silo["root"]
    source = root / "export"
    ok(silo_export(silo, "--plan", silo["plan"], "--out", source))
    manifest = json.loads((source / MANIFEST_NAME).read_text())
    (root / "secret.h5").write_bytes(b"not for the run")
    for case in range(30):
        name = fuzz_name(rng) if case % 3 else rng.choice(["../secret.h5", str(root / "secret.h5"), ".."])
        entry = dict(manifest["files"][0], path=name)
        (source / MANIFEST_NAME).write_text(json.dumps(manifest | {"files": [entry]}))
        out = root / f"gathered_{case}"
        before = tree(root)
        inspected = run("inspect", source)
        gathered = run("gather", source, "--out", out)
        created = changes(before, tree(root))
        assert {p for p in created if not (root / p).is_relative_to(out)} == set(), (name, created)
        if name_problem(name) is not None:
            with pytest.raises(FormatError, match="must name a file in the run directory"):
                read_manifest(source)
            assert inspected.exit_code != 0 and gathered.exit_code == 2 and created == set(), name
            assert one_error_line(gathered)
