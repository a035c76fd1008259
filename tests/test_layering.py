"""Imports point one way: mechanisms → contract → stage1_features / stage2_federate → ldpfl.

Every module of the five packages is parsed with ``ast`` (imports inside functions included, relative
imports resolved), and each import of one of the packages is checked against what its layer may use.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("mechanisms", "contract", "stage1_features", "stage2_federate", "ldpfl")

ALLOWED = {
    "mechanisms": {"mechanisms"},
    "contract": {"contract", "mechanisms"},
    "stage1_features": {"stage1_features", "contract", "mechanisms"},
    "stage2_federate": {"stage2_federate", "contract", "mechanisms"},
    "ldpfl": set(PACKAGES),
}
INSPECT_MODULES = ("ldpfl.inspect", "ldpfl.inspect_")  # ldpfl inspect reads files: no stage imports
INSPECT_ALLOWED = {"ldpfl", "contract", "mechanisms"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``source``, relative ones resolved."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                name = ".".join(part for part in [*base, node.module or ""] if part)
            else:
                name = node.module or ""
            found.append((node.lineno, name))
            if node.module is None:  # `from . import x`: x is a module of the package
                found += [(node.lineno, f"{name}.{alias.name}".lstrip(".")) for alias in node.names]
    return found


def violations(module: str, source: str, is_package: bool = False) -> list[str]:
    """The imports of ``module`` that its layer may not make."""
    layer = module.split(".")[0]
    allowed = ALLOWED[layer]
    if module.startswith(INSPECT_MODULES):
        allowed = INSPECT_ALLOWED
    out = []
    for line, name in imported_modules(source, module, is_package):
        top = name.split(".")[0]
        if top in PACKAGES and top not in allowed:
            out.append(f"{module}:{line} imports {name} ({layer} may import {', '.join(sorted(allowed))})")
    return out


def project_modules() -> list[tuple[str, Path]]:
    return [(module_name(p), p) for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]


def test_every_layer_imports_only_below_it() -> None:
    modules = project_modules()
    assert len(modules) > 40 and {m.split(".")[0] for m, _ in modules} == set(PACKAGES)
    problems = [v for module, path in modules
                for v in violations(module, path.read_text(), path.name == "__init__.py")]
    assert problems == []


@pytest.mark.parametrize("module, source", [
    ("mechanisms.uer", "from contract.schema import FormatError"),
    ("contract.schema", "import stage1_features.cnn"),
    ("stage2_federate.data", "from stage1_features import cnn"),
    ("stage2_federate.cli", "def f():\n    from ldpfl.cli import cli"),
    ("stage1_features.cli", "from ldpfl import __version__"),
    ("ldpfl.inspect_file", "from stage2_federate.data import load_run"),
    ("ldpfl.inspect", "from stage1_features.export import run_export"),
])
def test_a_violating_import_is_found(module: str, source: str) -> None:
    assert violations(module, source)


def test_relative_imports_are_resolved() -> None:
    source = "from .perturbation import TARGETS\nfrom . import budgets\nfrom ..contract import layout"
    assert imported_modules(source, "stage2_federate.cli") == [
        (1, "stage2_federate.perturbation"), (2, "stage2_federate"), (2, "stage2_federate.budgets"),
        (3, "contract")]
    assert violations("ldpfl.inspect_cli", "from .demo import run_demo") == []  # ldpfl itself
    assert violations("ldpfl.demo", "from stage1_features.export import run_export") == []
    assert violations("stage1_features.export", "from ..stage2_federate import data") == [
        "stage1_features.export:1 imports stage2_federate (stage1_features may import contract, mechanisms, "
        "stage1_features)"]
