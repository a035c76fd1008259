"""Imports point one way: mechanisms → contract → stage1_features / stage2_federate → the ldpfl app.

One name is installed: the repository's folders ``mechanisms/``, ``contract/``, ``stage1_features/`` and
``stage2_federate/`` are the packages ``ldpfl.mechanisms`` … (pyproject's ``package-dir``), and ``ldpfl/`` holds
the app (CLI, inspect, predict, demo). Every module is parsed with ``ast`` (imports inside functions included,
relative imports resolved); each import of a project module is checked against what its layer may use, and the
old top-level names are refused.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from repository import ROOT

SUBPACKAGES = ("mechanisms", "contract", "stage1_features", "stage2_federate")  # folders mapped into ldpfl
FOLDERS = (*SUBPACKAGES, "ldpfl")
APP = "app"  # the layer of ldpfl's own modules (ldpfl/*.py)

ALLOWED = {
    "mechanisms": {"mechanisms"},
    "contract": {"contract", "mechanisms"},
    "stage1_features": {"stage1_features", "contract", "mechanisms"},
    "stage2_federate": {"stage2_federate", "contract", "mechanisms"},
    APP: {*SUBPACKAGES, APP},
}
INSPECT_MODULES = ("ldpfl.inspect", "ldpfl.inspect_")  # ldpfl inspect reads files: no stage imports
INSPECT_ALLOWED = {APP, "contract", "mechanisms"}


def module_name(path: Path) -> str:
    """The installed name of a source file: ``mechanisms/uer.py`` is ``ldpfl.mechanisms.uer``."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    return ".".join(parts if parts[0] == "ldpfl" else ("ldpfl", *parts))


def layer_of(name: str) -> str | None:
    """The layer of an installed module name; None for modules outside the project."""
    parts = name.split(".")
    if parts[0] != "ldpfl":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in SUBPACKAGES else APP


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
            if name != "ldpfl":  # `from ldpfl import x` loads ldpfl/__init__ (any ldpfl.* import does) and x
                found.append((node.lineno, name))
            if node.module is None or name == "ldpfl":  # `from . import x`: x may be a module of the package
                found += [(node.lineno, f"{name}.{alias.name}".lstrip(".")) for alias in node.names]
    return found


def violations(module: str, source: str, is_package: bool = False) -> list[str]:
    """The imports of ``module`` that its layer may not make."""
    layer = layer_of(module)
    assert layer is not None, module
    allowed = ALLOWED[layer]
    if module.startswith(INSPECT_MODULES):
        allowed = INSPECT_ALLOWED
    out = []
    for line, name in imported_modules(source, module, is_package):
        if name.split(".")[0] in SUBPACKAGES:
            out.append(f"{module}:{line} imports {name} (the old top-level name; use ldpfl.{name})")
            continue
        target = layer_of(name)
        if target is not None and target not in allowed:
            out.append(f"{module}:{line} imports {name} ({layer} may import {', '.join(sorted(allowed))})")
    return out


def project_modules() -> list[tuple[str, Path]]:
    return [(module_name(p), p) for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))]


def test_every_layer_imports_only_below_it() -> None:
    modules = project_modules()
    assert len(modules) > 40 and {layer_of(m) for m, _ in modules} == {*SUBPACKAGES, APP}
    problems = [v for module, path in modules
                for v in violations(module, path.read_text(), path.name == "__init__.py")]
    assert problems == []


def test_scripts_and_tests_use_the_installed_name() -> None:
    scripts = [p for folder in ("tests", "bench", "experiments") for p in sorted((ROOT / folder).rglob("*.py"))]
    old = [f"{p.relative_to(ROOT)}:{line} imports {name}" for p in scripts
           for line, name in imported_modules(p.read_text(), "script")
           if name.split(".")[0] in SUBPACKAGES]
    assert len(scripts) > 40 and old == []


@pytest.mark.parametrize("module, source", [
    ("ldpfl.mechanisms.uer", "from ldpfl.contract.schema import FormatError"),
    ("ldpfl.contract.schema", "import ldpfl.stage1_features.cnn"),
    ("ldpfl.stage2_federate.data", "from ldpfl.stage1_features import cnn"),
    ("ldpfl.stage2_federate.data", "from ldpfl import stage1_features"),
    ("ldpfl.stage2_federate.cli", "def f():\n    from ldpfl.cli import cli"),
    ("ldpfl.stage1_features.cli", "from ldpfl import __version__"),
    ("ldpfl.inspect_file", "from ldpfl.stage2_federate.data import load_run"),
    ("ldpfl.inspect", "from ldpfl.stage1_features.export import run_export"),
    ("ldpfl.demo", "from stage1_features.export import run_export"),  # the old top-level name
    ("ldpfl.mechanisms.uer", "import mechanisms.base"),
])
def test_a_violating_import_is_found(module: str, source: str) -> None:
    assert violations(module, source)


def test_relative_imports_are_resolved() -> None:
    source = "from .perturbation import TARGETS\nfrom . import budgets\nfrom ..contract import layout"
    assert imported_modules(source, "ldpfl.stage2_federate.cli") == [
        (1, "ldpfl.stage2_federate.perturbation"), (2, "ldpfl.stage2_federate"),
        (2, "ldpfl.stage2_federate.budgets"), (3, "ldpfl.contract")]
    assert violations("ldpfl.inspect_cli", "from .demo import run_demo") == []  # the app itself
    assert violations("ldpfl.demo", "from ldpfl.stage1_features.export import run_export") == []
    assert violations("ldpfl.stage1_features.cli", "from ldpfl import mechanisms") == []
    assert violations("ldpfl.stage1_features.export", "from ..stage2_federate import data") == [
        "ldpfl.stage1_features.export:1 imports ldpfl.stage2_federate (stage1_features may import contract, "
        "mechanisms, stage1_features)"]
