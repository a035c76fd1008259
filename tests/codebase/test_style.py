"""Style checks run by the test suite (and so by ``.ci/run``): ruff (lint, numpy docstrings) and mypy.

The configuration is in pyproject.toml: ruff checks the whole tree (``D`` rules for the package source),
mypy checks every module of ``ldpfl/`` itself (the app and its lazy API names) and every package.
mypy cannot follow setuptools' ``package-dir`` mapping (``mechanisms/`` installed as ``ldpfl.mechanisms``),
so it reads a tree of links laid out as installed.
Each test skips only when its tool is not installed; the
``test`` extra installs both.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from repository import ROOT

MAPPED = ("mechanisms", "contract", "stage1_features", "stage2_federate")  # pyproject's package-dir
TYPED = ("ldpfl.common", "ldpfl.mechanisms", "ldpfl.contract", "ldpfl.stage1_features", "ldpfl.stage2_federate",
         "ldpfl.api", "ldpfl.inspection")  # packages mypy checks
TYPED_MODULES = ("ldpfl", *sorted(f"ldpfl.{p.stem}" for p in (ROOT / "ldpfl").glob("*.py") if p.stem != "__init__"))


def run_tool(module: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install -e '.[test]')")
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def installed_layout(root: Path) -> Path:
    """Lay the source out under ``root`` as installed (links): ``root/ldpfl/mechanisms`` is ``mechanisms/``."""
    package = root / "ldpfl"
    package.mkdir(parents=True)
    for path in (ROOT / "ldpfl").iterdir():
        if path.suffix in (".py", ".typed"):
            (package / path.name).symlink_to(path)
        elif (path / "__init__.py").is_file():  # a subpackage of the app (ldpfl/api)
            (package / path.name).symlink_to(path, target_is_directory=True)
    for folder in MAPPED:
        (package / folder).symlink_to(ROOT / folder, target_is_directory=True)
    return root


def test_ruff_check_passes() -> None:
    result = run_tool("ruff", "check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_passes_on_every_package(tmp_path: Path) -> None:
    packages = [*(arg for name in TYPED_MODULES for arg in ("-m", name)),
                *(arg for name in TYPED for arg in ("-p", name))]
    result = run_tool("mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(tmp_path / "cache"),
                      *packages, cwd=installed_layout(tmp_path / "src"))  # options: [tool.mypy] in pyproject
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success" in result.stdout
