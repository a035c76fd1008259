"""Imports point one way: common → mechanisms → contract → stage1_features / stage2_federate → the ldpfl app.

One name is installed: the repository's folders ``mechanisms/``, ``contract/``, ``stage1_features/`` and
``stage2_federate/`` are the packages ``ldpfl.mechanisms`` … (pyproject's ``package-dir``), and ``ldpfl/`` holds
the app (CLI, inspect, predict, demo). ``ldpfl/common/`` is the floor below them all (the shared errors and the
generic registry): it imports nothing of the project, and every layer may import it. Every module is parsed
with ``ast`` (imports inside functions included, relative imports resolved); each import of a project module is
checked against what its layer may use, and the old top-level names are refused.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from repository import ROOT

SUBPACKAGES = ("mechanisms", "contract", "stage1_features", "stage2_federate")  # folders mapped into ldpfl
FOLDERS = (*SUBPACKAGES, "ldpfl")
APP = "app"  # the layer of ldpfl's own modules (ldpfl/*.py)
FLOOR = "common"  # ldpfl/common: below every layer

ALLOWED = {
    FLOOR: {FLOOR},
    "mechanisms": {FLOOR, "mechanisms"},
    "contract": {FLOOR, "contract", "mechanisms"},
    "stage1_features": {FLOOR, "stage1_features", "contract", "mechanisms"},
    "stage2_federate": {FLOOR, "stage2_federate", "contract", "mechanisms"},
    APP: {FLOOR, *SUBPACKAGES, APP},
}
INSPECT_MODULES = ("ldpfl.inspection", "ldpfl.api.inspect_job")  # ldpfl inspect reads files: no stage imports
INSPECT_ALLOWED = {FLOOR, APP, "contract", "mechanisms"}


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
    if len(parts) > 1 and parts[1] == FLOOR:
        return FLOOR
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
    assert len(modules) > 40 and {layer_of(m) for m, _ in modules} == {FLOOR, *SUBPACKAGES, APP}
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
    ("ldpfl.contract.schema", "import ldpfl.stage1_features.models.cnn"),
    ("ldpfl.stage2_federate.data", "from ldpfl.stage1_features import cnn"),
    ("ldpfl.stage2_federate.data", "from ldpfl import stage1_features"),
    ("ldpfl.stage2_federate.cli", "def f():\n    from ldpfl.cli import cli"),
    ("ldpfl.stage1_features.cli", "from ldpfl import __version__"),
    ("ldpfl.inspection.file", "from ldpfl.stage2_federate.data import load_run"),
    ("ldpfl.inspection.report", "from ldpfl.stage1_features.export.run import run_export"),
    ("ldpfl.commands.demo", "from stage1_features.export import run_export"),  # the old top-level name
    ("ldpfl.mechanisms.uer", "import mechanisms.base"),
    ("ldpfl.common.errors", "from ldpfl.mechanisms.base import FLOAT32"),  # the floor imports nothing above it
    ("ldpfl.common.registry", "from ldpfl import cli"),
])
def test_a_violating_import_is_found(module: str, source: str) -> None:
    assert violations(module, source)


def test_relative_imports_are_resolved() -> None:
    source = "from .perturbation import TARGETS\nfrom . import budgets\nfrom ..contract import layout"
    assert imported_modules(source, "ldpfl.stage2_federate.cli") == [
        (1, "ldpfl.stage2_federate.perturbation"), (2, "ldpfl.stage2_federate"),
        (2, "ldpfl.stage2_federate.budgets"), (3, "ldpfl.contract")]
    assert violations("ldpfl.commands.inspect", "from .demo import run_demo") == []  # the app itself
    assert violations("ldpfl.commands.demo", "from ldpfl.stage1_features.export.run import run_export") == []
    assert violations("ldpfl.stage1_features.cli", "from ldpfl import mechanisms") == []
    assert violations("ldpfl.mechanisms.base", "from ldpfl.common.errors import ParameterError") == []
    assert violations("ldpfl.stage1_features.export", "from ..stage2_federate import data") == [
        "ldpfl.stage1_features.export:1 imports ldpfl.stage2_federate (stage1_features may import common, contract, "
        "mechanisms, stage1_features)"]


# ---------------------------------------------------------------------------------------------------
# Rooms: no import cycle, no module over 500 lines, project imports inside functions only for heavy frameworks

MAX_LINES = 500
HEAVY_FRAMEWORKS = {"tensorflow", "keras", "torch", "jax", "jax_privacy", "flwr", "ray", "matplotlib"}


def module_imports(source: str, module: str, known: set[str], is_package: bool = False) -> list[tuple[str, bool]]:
    """(imported module, inside a function) for every import that runs: ``if TYPE_CHECKING:`` blocks are left out.

    ``from package import name`` imports the submodule ``package.name`` where ``known`` has one, else ``package``.
    """
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((alias.name, inside) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = package.split(".")[:len(package.split(".")) - (child.level - 1)] if child.level else []
                name = ".".join(part for part in [*base, child.module or ""] if part)
                submodules = [f"{name}.{alias.name}" for alias in child.names if f"{name}.{alias.name}" in known]
                found.extend((sub, inside) for sub in submodules)
                if len(submodules) < len(child.names):
                    found.append((name, inside))
            visit(child, inside)

    visit(ast.parse(source), False)
    return found


def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, list[tuple[str, bool]]]:
    """Each project module's imports of project modules: {module: [(imported, inside a function)]}."""
    known = set(sources)
    return {module: [(name, inside) for name, inside in module_imports(source, module, known, is_package)
                     if name in known and name != "ldpfl" and name != module]
            for module, (source, is_package) in sources.items()}


def import_cycles(graph: dict[str, list[tuple[str, bool]]]) -> set[frozenset[str]]:
    """The groups of modules that import each other, directly or around a loop (imports in functions included)."""
    import networkx as nx

    digraph = nx.DiGraph([(module, name) for module, imports in graph.items() for name, _ in imports])
    return {frozenset(group) for group in nx.strongly_connected_components(digraph) if len(group) > 1}


def heavy_modules(sources: dict[str, tuple[str, bool]]) -> set[str]:
    """The project modules that load a heavy framework when imported (their own top-level imports, transitively)."""
    known = set(sources)
    top = {module: [name for name, inside in module_imports(source, module, known, is_package) if not inside]
           for module, (source, is_package) in sources.items()}
    heavy = {module for module, names in top.items() if {name.split(".")[0] for name in names} & HEAVY_FRAMEWORKS}
    grown = True
    while grown:
        more = {module for module, names in top.items() if module not in heavy and heavy.intersection(names)}
        heavy |= more
        grown = bool(more)
    return heavy


def project_sources() -> dict[str, tuple[str, bool]]:
    return {module: (path.read_text(), path.name == "__init__.py") for module, path in project_modules()}


def test_no_import_cycle_among_project_modules() -> None:
    cycles = import_cycles(import_graph(project_sources()))
    assert [sorted(group) for group in cycles] == []


def test_no_module_is_over_500_lines() -> None:
    long = {module: n for module, path in project_modules() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_project_imports_inside_functions_are_for_heavy_frameworks_only() -> None:
    sources = project_sources()
    heavy = heavy_modules(sources)
    assert {"ldpfl.stage1_features.models.cnn", "ldpfl.inspection.report"}.isdisjoint(heavy)  # Keras loads lazily
    assert "ldpfl.stage2_federate.model" in heavy  # torch at the top
    light = [f"{module} imports {name} inside a function" for module, imports in import_graph(sources).items()
             for name, inside in imports if inside and name not in heavy]
    assert light == []


def test_a_cycle_and_a_light_import_in_a_function_are_found() -> None:
    sources = {"ldpfl.a": ("from ldpfl import b\n", False), "ldpfl.b": ("def f():\n    import ldpfl.c\n", False),
               "ldpfl.c": ("from ldpfl.a import x\nimport torch\n", False),
               "ldpfl.d": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ldpfl.a import x\n", False)}
    graph = import_graph(sources)
    assert graph["ldpfl.a"] == [("ldpfl.b", False)] and graph["ldpfl.b"] == [("ldpfl.c", True)]
    assert graph["ldpfl.d"] == []  # imports for the type checker only never run
    assert import_cycles(graph) == {frozenset({"ldpfl.a", "ldpfl.b", "ldpfl.c"})}
    assert heavy_modules(sources) == {"ldpfl.c"}  # b imports c inside a function only: neither b nor a loads torch
    sources["ldpfl.c"] = ("x = 1\n", False)  # c no longer imports a, nor torch
    assert heavy_modules(sources) == set() and import_cycles(import_graph(sources)) == set()
