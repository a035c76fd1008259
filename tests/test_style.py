"""Style checks run by the test suite (and so by ``.ci/run``): ruff (lint, numpy docstrings) and mypy.

The configuration is in pyproject.toml: ruff checks the whole tree (``D`` rules for the package source),
mypy checks ``contract/`` and ``mechanisms/``. Each test skips only when its tool is not installed; the
``test`` extra installs both.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_tool(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install -e '.[test]')")
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_ruff_check_passes() -> None:
    result = run_tool("ruff", "check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_passes_on_contract_and_mechanisms() -> None:
    result = run_tool("mypy")  # files and options: [tool.mypy] in pyproject.toml
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success" in result.stdout
