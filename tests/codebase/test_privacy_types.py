"""One typed currency (issue 33): no untyped mapping carries a privacy value between the file boundaries.

Privacy reports, label releases, release guarantees, ledger entries and accounting events are frozen
dataclasses from the moment they are made until the one module that writes or reads their JSON. This test
parses every module of the package with ``ast`` and refuses an annotation of ``dict[str, Any]``,
``Mapping[str, Any]`` (alone or inside another type, e.g. ``Sequence[Mapping[str, Any]]``) or a bare ``Any``
on a name that says it holds a privacy value: a parameter, a class or module attribute, a variable, or the
return of a function so named. The JSON converters themselves (``to_json``/``from_json``/``to_dict``/
``from_dict`` and ``*_json`` names) are the boundary and may hand out plain mappings.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from repository import ROOT

PACKAGE_FOLDERS = ("mechanisms", "contract", "stage1_features", "stage2_federate", "ldpfl")
PRIVACY_NAME = re.compile(r"privacy|report|guarantee|release|ledger|label_noise|accounted|event",
                          re.IGNORECASE)
BOUNDARY_NAME = re.compile(r"(^|_)(to|from)_(json|dict)$|_json$|^json_")
UNTYPED = re.compile(r"\b(dict|Dict|Mapping|MutableMapping)\[str, Any\]")


def untyped(annotation: ast.expr | None) -> bool:
    """True for ``dict[str, Any]``/``Mapping[str, Any]`` anywhere in the annotation, or a bare ``Any``."""
    if annotation is None:
        return False
    text = ast.unparse(annotation).replace("'", "").replace('"', "")
    return bool(UNTYPED.search(text)) or text.strip() in ("Any", "Any | None")


def package_sources() -> Iterator[Path]:
    for folder in PACKAGE_FOLDERS:
        yield from sorted((ROOT / folder).rglob("*.py"))


def offences(source: str) -> Iterator[tuple[int, str]]:
    """(line, what) of every privacy-named thing with an untyped annotation in ``source``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if BOUNDARY_NAME.search(node.name):
                continue
            if PRIVACY_NAME.search(node.name) and untyped(node.returns):
                yield node.lineno, f"{node.name}() returns {ast.unparse(node.returns)}"  # type: ignore[arg-type]
            arguments = node.args
            for arg in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs):
                if PRIVACY_NAME.search(arg.arg) and untyped(arg.annotation):
                    yield arg.lineno, f"{node.name}({arg.arg}: {ast.unparse(arg.annotation)})"  # type: ignore[arg-type]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, (ast.Name, ast.Attribute)):
            name = node.target.id if isinstance(node.target, ast.Name) else node.target.attr
            if PRIVACY_NAME.search(name) and untyped(node.annotation):
                yield node.lineno, f"{name}: {ast.unparse(node.annotation)}"


def test_the_detector_finds_what_it_should() -> None:
    """The scan itself: untyped privacy names are caught, typed ones and the JSON boundary are not."""
    source = (
        "def f(report: dict[str, Any], n: dict[str, Any]) -> None: ...\n"
        "def release_guarantee(x: int) -> Mapping[str, Any] | None: ...\n"
        "def g(prior_releases: Sequence[Mapping[str, Any]]) -> None: ...\n"
        "class C:\n    label_release: 'dict[str, Any] | None' = None\n    ledger: Ledger\n"
        "def to_json(guarantee: ReleaseGuarantee) -> dict[str, Any]: ...\n"
        "def h(privacy: Any) -> None: ...\n"
    )
    found = sorted(line for line, _ in offences(source))
    assert found == [1, 2, 3, 5, 8], found


def test_no_untyped_mapping_carries_a_privacy_value() -> None:
    found = [f"{path.relative_to(ROOT)}:{line}: {what}"
             for path in package_sources() for line, what in offences(path.read_text(encoding="utf-8"))]
    assert not found, "privacy values carried untyped:\n" + "\n".join(found)
