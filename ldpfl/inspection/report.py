"""What a randomized HDF5 file (or a run directory of them) holds, and whether it is what it says.

``inspect_path(path)`` validates a client file or a run directory and returns an :class:`Inspection`:

* the schema and structure, through ``ldpfl.contract.client_reader.open_client_file`` (declared shapes,
  dtypes, links, external storage, virtual datasets and filters are checked before any data is read);
* the file's sha256 against ``manifest.json`` when one lists it (``ldpfl.contract.run_dir``, the validator
  that export and federate use too);
* every data chunk, read through HDF5's Fletcher-32 filter in row blocks (a flipped data byte fails);
* the privacy report stored in the attributes against the report of the mechanism its parameters
  resolve to (nominal and exact ε side by side, ``ldpfl.inspection.privacy``);
* the labels against the stored label histograms;
* for packed-bit files, the density of 1s per class of bit positions (all, even, odd, and each digit
  of the fixed-point encoding), next to the range the mechanism can produce and, where
  ``/stats/input_bit_density`` is stored, the density it predicts (``ldpfl.inspection.bits``);
* for float files, per-feature mean/std and, for PDPM, the share of each of its three outputs
  (``ldpfl.inspection.floats``).

One file is inspected by ``ldpfl.inspection.file``; the text is ``ldpfl.inspection.text``. These modules
import neither TensorFlow, torch nor matplotlib.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ldpfl.contract.federation_privacy import DpSgdLedgerRow, FederationGuarantee, LedgerSection
from ldpfl.contract.file_checks import as_float
from ldpfl.contract.jsonout import json_ready
from ldpfl.contract.layout import MANIFEST_NAME, METRICS_PATH
from ldpfl.contract.manifest import Manifest
from ldpfl.contract.release_history import ReleaseEntry, history_from_manifest, total_epsilon
from ldpfl.contract.run_dir import check_run_dir
from ldpfl.contract.schema import FormatError
from ldpfl.inspection.file import OK, FileReport, inspect_file, manifest_check
from ldpfl.inspection.silo_findings import SiloFindings, read_silo_findings
from ldpfl.mechanisms.report import json_number

MAX_METRICS_BYTES = 64 << 20

@dataclass(frozen=True)
class FederationSummary:
    """What ``federation/metrics.json`` says, if it is present and readable."""

    rounds: tuple[int, ...]
    test_accuracy: tuple[float | None, ...]
    problem: str | None = None
    ledger: LedgerSection | None = None  # metrics.json's privacy_ledger (stage 2), when well formed
    ledger_problem: str | None = None
    guarantee: FederationGuarantee | None = None  # metrics.json's release_guarantee: per silo and the weakest's
    clean_test_accuracy: tuple[float | None, ...] = ()  # --eval-clean: on the silos' local clean test records
    # metrics.json's named_outliers (issue 42): (silo, action, rounds named, rounds aggregated), when well formed
    named_outliers: tuple[tuple[int, str, int, int], ...] = ()
    # metrics.json's silos left out, label-claim cap and pooled-figure flags (issue 42)
    silos: SiloFindings = field(default_factory=SiloFindings)

    @property
    def final_accuracy(self) -> float | None:
        """Return the test accuracy of the last round (``None`` without rounds)."""
        return self.test_accuracy[-1] if self.test_accuracy else None

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready summary: rounds, those with a test figure (``eval_every``), final and best accuracy."""
        acc = [a for a in self.test_accuracy if a is not None]
        return {"rounds": len(self.rounds), "evaluated_rounds": len(acc),
                "final_test_accuracy": self.final_accuracy,
                "best_test_accuracy": max(acc) if acc else None, "problem": self.problem,
                "final_clean_test_accuracy": self.clean_test_accuracy[-1] if self.clean_test_accuracy else None,
                "release_guarantee": None if self.guarantee is None else guarantee_summary(self.guarantee),
                "named_outliers": [{"client": c, "action": a, "named_rounds": n, "rounds": r}
                                   for c, a, n, r in self.named_outliers],
                **self.silos.to_dict(),
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
        clean = tuple(as_float(r.get("clean_test_accuracy")) for r in rounds)
    except (OSError, ValueError, TypeError, KeyError, UnicodeDecodeError, RecursionError) as error:
        return FederationSummary((), (), f"{path}: unreadable ({' '.join(str(error).split())[:160]})")
    ledger, problem = _read_ledger(data.get("privacy_ledger"))
    return FederationSummary(tuple(r for r, _ in numbers), tuple(a for _, a in numbers), None, ledger,
                             None if problem is None else f"{path}: {problem}",
                             _read_guarantee(data.get("release_guarantee")),
                             clean if any(a is not None for a in clean) else (),
                             _read_outliers(data.get("named_outliers")), read_silo_findings(data))


def _read_outliers(section: object) -> tuple[tuple[int, str, int, int], ...]:
    """Return metrics.json's ``named_outliers`` as (silo, action, rounds named, rounds); () when absent or malformed."""
    try:
        return tuple((int(e["client"]), str(e["action"])[:20], int(e["named_rounds"]), int(e["rounds"]))
                     for e in section) if isinstance(section, list) else ()
    except (TypeError, ValueError, KeyError):
        return ()


def _read_guarantee(section: object) -> FederationGuarantee | None:
    """Return the federation's ``release_guarantee`` (the weakest silo's figure, each silo's); None when malformed."""
    if not isinstance(section, Mapping):
        return None
    try:
        return FederationGuarantee.from_dict(section)
    except ValueError:
        return None


def guarantee_summary(guarantee: FederationGuarantee) -> dict[str, object]:
    """Return what ``inspect --json`` shows of the federation's guarantee: the figures, the scope, each silo's."""
    out: dict[str, object] = {"epsilon": json_number(guarantee.epsilon), "delta": guarantee.delta}
    if guarantee.neighbours is not None:
        out.update(epsilon_replace_one=json_number(guarantee.epsilon),
                   epsilon_add_remove=json_number(guarantee.epsilon_add_remove), neighbours=guarantee.neighbours)
    clients = []
    for c in guarantee.clients:
        row: dict[str, object] = {"client": c.client, "epsilon": json_number(c.epsilon)}
        if c.epsilon_add_remove is not None:
            row["epsilon_add_remove"] = json_number(c.epsilon_add_remove)
        row["delta"] = c.delta
        if c.dp_sgd:
            row["local_only_files"] = c.local_only_files
        clients.append(row)
    return out | {"scope": guarantee.scope, "clients": clients}


def _read_ledger(section: object) -> tuple[LedgerSection | None, str | None]:
    """Return the stage-2 ledger of ``metrics.json`` (rows of client, rounds, ε, δ, method), or a problem.

    An older metrics.json without the section gives ``(None, None)``; a malformed one ``(None, problem)``.
    """
    if section is None:
        return None, None
    try:
        return LedgerSection.from_dict(section), None
    except ValueError as error:
        return None, str(error)


def ledger_summary(ledger: LedgerSection) -> dict[str, object]:
    """Return what ``inspect --json`` shows of the stage-2 ledger: each client's client, rounds, ε, δ and method."""
    rows = []
    for r in ledger.clients:
        row: dict[str, object] = {"client": r.client, "rounds": r.rounds, "epsilon": json_number(r.epsilon),
                                  "delta": r.delta, "method": r.method}
        if r.mechanism is not None:
            row["mechanism"] = r.mechanism
        if isinstance(r, DpSgdLedgerRow):
            row.update(steps=r.steps, epsilon_replace_one=json_number(r.epsilon_replace_one),
                       epsilon_add_remove=json_number(r.epsilon_add_remove))
        rows.append(row)
    return {"rounds": ledger.rounds, "accountant": ledger.accountant, "adds_privacy_loss": ledger.adds_privacy_loss,
            "counted": ledger.counted, "clients": rows, "notes": list(ledger.notes)}


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
    # each client's releases of its records (manifest's release_history), in order
    release_history: dict[int, tuple[ReleaseEntry, ...]] | None = None

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
            "privacy_ledger": self.privacy_ledger(),
            "release_history": None if self.release_history is None else {
                str(k): {"releases": [e.to_dict() for e in entries],
                         "total_exact_epsilon_per_record": total_epsilon(entries)}
                for k, entries in sorted(self.release_history.items())},
        })

    def privacy_ledger(self) -> dict[str, object]:
        """Return one privacy ledger of the run, JSON-ready (``--json``): stage 1 per file, stage 2 per client.

        Stage 1 is the release of each file's features (ε per record and δ, from its attributes); stage 2
        the totals per client from ``federation/metrics.json`` (None when there is no federation).
        """
        stage1 = []
        for f in self.files:
            m = f.metadata
            if m is None:
                continue
            report = m.privacy()
            stage1.append({"client": m.client_index, "file": f.name, "mechanism": m.mechanism,
                           "nominal_epsilon": report.nominal_epsilon,
                           "epsilon_per_record": report.exact_epsilon_per_record,
                           "delta": report.exact_delta, "private": m.private})
        stage2 = None if self.federation is None else self.federation.ledger
        return {"stage1": stage1, "stage2": None if stage2 is None else ledger_summary(stage2),
                "notes": ["stage 1: one release of each client's features (train and test rows), per record",
                          "stage 2: each client's total over the rounds in which its upload reached the "
                          "server (federation/metrics.json)"]}


def release_history(manifest: Manifest) -> tuple[dict[int, tuple[ReleaseEntry, ...]] | None, str | None]:
    """Return each listed client's releases (``ldpfl.contract.release_history``), or a problem.

    Their total is the sum of the per-record ε of the releases (``total_epsilon``: basic composition, Dwork &
    Roth Thm. 3.16).
    """
    try:
        history = history_from_manifest(manifest.info, manifest.files, str(manifest.run_dir))
    except ValueError as error:
        return None, f"{manifest.run_dir / MANIFEST_NAME}: {error}"
    return {i: tuple(entries) for i, entries in history.items()}, None


def inspect_path(path: str | os.PathLike, *, block_rows: int | None = None, recompute: bool = False) -> Inspection:
    """Inspect a client file or a run directory (see the module docstring; ``recompute``: see ``inspect_file``)."""
    path = Path(path)
    if path.is_dir():
        return inspect_run(path, block_rows=block_rows, recompute=recompute)
    return Inspection(path, "file", [inspect_file(path, block_rows=block_rows, recompute=recompute)])


def inspect_run(run_dir: str | os.PathLike[str], *, block_rows: int | None = None,
                recompute: bool = False) -> Inspection:
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
                              block_rows=block_rows, recompute=recompute)
        if has_manifest and file.record is None:
            report.flags.append(f"not listed in {MANIFEST_NAME}")
        result.files.append(report)
    result.problems.extend(check.problems())
    valid = [f.metadata for f in check.files if f.metadata is not None]
    if valid:
        present, expected = len({m.client_index for m in valid}), valid[0].client_count
        if present < expected:
            result.notes.append(f"{present} of {expected} clients present")
    if check.manifest is not None:
        result.release_history, problem = release_history(check.manifest)
        if problem:
            result.problems.append(problem)
    result.federation = read_federation_metrics(run_dir)
    if result.federation is not None and result.federation.problem:
        result.notes.append(result.federation.problem)
    if result.federation is not None and result.federation.ledger_problem:
        result.notes.append(result.federation.ledger_problem)
    return result
