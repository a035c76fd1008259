"""One installed name (issue 21 item 1): the wheel holds only ``ldpfl``, with the repository's folders inside it."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from repository import ROOT

MAPPED = ("mechanisms", "contract", "stage1_features", "stage2_federate")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(out), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (path,) = out.glob("ldpfl-*.whl")
    return zipfile.ZipFile(path)


def test_the_wheel_installs_one_top_level_name(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    assert {n.split("/")[0] for n in names} == {"ldpfl", next(n for n in names if ".dist-info/" in n).split("/")[0]}
    assert "ldpfl/py.typed" in names


def test_every_source_module_is_in_the_wheel_under_ldpfl(wheel: zipfile.ZipFile) -> None:
    sources = {f"ldpfl/{p.relative_to(ROOT).as_posix()}" for folder in MAPPED for p in (ROOT / folder).rglob("*.py")}
    sources |= {p.relative_to(ROOT).as_posix() for p in (ROOT / "ldpfl").glob("*.py")}
    assert len(sources) > 100 and sources <= set(wheel.namelist())


def test_old_top_level_names_do_not_import_outside_the_checkout(tmp_path: Path) -> None:
    code = ("import importlib.util as u, ldpfl.mechanisms, ldpfl.stage2_federate.flower_engine\n"
            f"print([n for n in {MAPPED!r} if u.find_spec(n) is not None])")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
