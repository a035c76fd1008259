"""What a randomized HDF5 file (or a run directory of them) holds, and whether it is what it says.

``inspect_path(path)`` validates a client file or a run directory and returns an :class:`Inspection`:

* the schema and structure, through ``contract.client_reader.open_client_file`` (declared shapes,
  dtypes, links, external storage, virtual datasets and filters are checked before any data is read);
* the file's sha256 against ``manifest.json`` when one lists it (``contract.run_dir``, the validator
  that export and federate use too);
* every data chunk, read through HDF5's Fletcher-32 filter in row blocks (a flipped data byte fails);
* the privacy report stored in the attributes against the report of the mechanism its parameters
  resolve to (nominal and exact ε side by side, ``ldpfl.inspect_privacy``);
* the labels against the stored label histograms;
* for packed-bit files, the density of 1s per class of bit positions (all, even, odd, and each digit
  of the fixed-point encoding), next to the range the mechanism can produce and, where
  ``/stats/input_bit_density`` is stored, the density it predicts (``ldpfl.inspect_bits``);
* for float files, per-feature mean/std and, for PDPM, the share of each of its three outputs
  (``ldpfl.inspect_floats``).

One file is inspected by ``ldpfl.inspect_file``; the text is ``ldpfl.inspect_text``. These modules
import neither TensorFlow, torch nor matplotlib.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract.jsonout import json_ready
from contract.layout import MANIFEST_NAME, METRICS_PATH
from contract.run_dir import check_run_dir
from contract.schema import FormatError
from ldpfl.inspect_file import OK, FileReport, inspect_file, manifest_check
from ldpfl.inspect_privacy import as_float

MAX_METRICS_BYTES = 64 << 20

@dataclass(frozen=True)
class FederationSummary:
    """What ``federation/metrics.json`` says, if it is present and readable."""

    rounds: tuple[int, ...]
    test_accuracy: tuple[float | None, ...]
    problem: str | None = None

    @property
    def final_accuracy(self) -> float | None:
        """Return the test accuracy of the last round (``None`` without rounds)."""
        return self.test_accuracy[-1] if self.test_accuracy else None

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready summary: rounds, final and best accuracy, accuracy per round."""
        acc = [a for a in self.test_accuracy if a is not None]
        return {"rounds": len(self.rounds), "final_test_accuracy": self.final_accuracy,
                "best_test_accuracy": max(acc) if acc else None, "problem": self.problem,
                "test_accuracy_per_round": [[r, a] for r, a in zip(self.rounds, self.test_accuracy, strict=True)]}


def read_federation_metrics(run_dir: str | os.PathLike) -> FederationSummary | None:
    """Accuracy per round from ``RUN_DIR/federation/metrics.json``; ``None`` when absent.

    The file is treated as untrusted: a malformed one gives a summary with ``problem`` set.
    """
    path = Path(run_dir) / METRICS_PATH
    if not path.is_file():
        return None
    try:
        if path.stat().st_size > MAX_METRICS_BYTES:
            raise ValueError(f"larger than {MAX_METRICS_BYTES} bytes")
        data = json.loads(path.read_text())
        rounds = data["rounds"] if isinstance(data, dict) else None
        if not isinstance(rounds, list) or not all(isinstance(r, dict) for r in rounds):
            raise ValueError("'rounds' is not a list of objects")
        numbers = [(int(r.get("round", i + 1)), as_float(r.get("test_accuracy"))) for i, r in enumerate(rounds)]
    except (OSError, ValueError, TypeError, KeyError, UnicodeDecodeError) as error:
        return FederationSummary((), (), f"{path}: unreadable ({' '.join(str(error).split())[:160]})")
    return FederationSummary(tuple(r for r, _ in numbers), tuple(a for _, a in numbers))


@dataclass
class Inspection:
    """The result of :func:`inspect_path`: one file, or every file of a run directory."""

    path: Path
    kind: str  # "file" or "run"
    files: list[FileReport]
    manifest: Mapping[str, Any] | None = None  # the run's manifest info (without the file list)
    problems: list[str] = field(default_factory=list)  # run-level: manifest, mismatches across clients
    notes: list[str] = field(default_factory=list)
    federation: FederationSummary | None = None

    @property
    def ok(self) -> bool:
        """Return whether every file checked out and the run has no problem."""
        return not self.problems and all(f.status == OK for f in self.files)

    @property
    def exit_code(self) -> int:
        """0 when everything checked out, 1 when a file failed or something was flagged."""
        return 0 if self.ok else 1

    def error_lines(self) -> list[str]:
        """One line per file that could not be validated ("PATH: problem")."""
        return [f.error for f in self.files if f.error]

    def to_dict(self) -> dict[str, Any]:
        """Return everything found, JSON-ready (the ``--json`` output)."""
        return json_ready({
            "path": str(self.path), "kind": self.kind, "ok": self.ok, "exit_code": self.exit_code,
            "manifest": None if self.manifest is None else dict(self.manifest), "problems": list(self.problems),
            "notes": list(self.notes), "files": [f.to_dict() for f in self.files],
            "federation": None if self.federation is None else self.federation.to_dict(),
        })

    def format_text(self, *, details: bool = False) -> str:
        """Human-readable report: a file's full section, or a run's summary table (plus sections)."""
        if self.kind == "file":
            return self.files[0].format_text()
        from ldpfl.inspect_text import file_lines, run_lines

        lines = run_lines(self)
        if details:
            for report in self.files:
                lines += ["", *file_lines(report)]
        return "\n".join(lines)


def inspect_path(path: str | os.PathLike, *, block_rows: int | None = None) -> Inspection:
    """Inspect a client file or a run directory (see the module docstring for every check)."""
    path = Path(path)
    if path.is_dir():
        return inspect_run(path, block_rows=block_rows)
    return Inspection(path, "file", [inspect_file(path, block_rows=block_rows)])


def inspect_run(run_dir: str | os.PathLike[str], *, block_rows: int | None = None) -> Inspection:
    """Inspect every client file of a run directory (those the manifest lists and any other ``*.h5``)."""
    run_dir = Path(run_dir)
    result = Inspection(run_dir, "run", [])
    check = check_run_dir(run_dir, unlisted=True)
    has_manifest = check.manifest is not None
    if check.manifest is not None:
        result.manifest = dict(check.manifest.info) | {"files_listed": len(check.manifest.files)}
    elif check.has_manifest_file:
        result.problems.append(str(check.manifest_error))
    else:
        result.notes.append(f"no {MANIFEST_NAME}: file hashes cannot be checked")
    if not check.files:
        raise FormatError(run_dir, "no client files (*.h5) and no manifest listing any: not an ldpfl run directory")
    for file in check.files:
        report = inspect_file(file.path, manifest=manifest_check(file, has_manifest=has_manifest),
                              block_rows=block_rows)
        if has_manifest and file.record is None:
            report.flags.append(f"not listed in {MANIFEST_NAME}")
        result.files.append(report)
    result.problems.extend(check.problems())
    valid = [f.metadata for f in check.files if f.metadata is not None]
    if valid:
        present, expected = len({m.client_index for m in valid}), valid[0].client_count
        if present < expected:
            result.notes.append(f"{present} of {expected} clients present")
    result.federation = read_federation_metrics(run_dir)
    if result.federation is not None and result.federation.problem:
        result.notes.append(result.federation.problem)
    return result
