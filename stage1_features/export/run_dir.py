"""The export's run directory: one export at a time, stale temporaries, the stored partition, and resuming.

**Resuming never randomizes a finished client again**: releasing a second randomization of the same
records spends their privacy budget a second time. Listed files must verify (sha256, structure); a
client file present under its final name but missing from the manifest (a crash between the rename and
the manifest write) is validated, every chunk read, and adopted; one that fails is an error that asks
for ``overwrite``. The files are examined by ``ldpfl.contract.run_dir.check_run_dir``, the validator
that ``ldpfl federate`` and ``ldpfl inspect`` use too.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from filelock import FileLock, Timeout

from ldpfl.contract.atomic import TMP_MARK
from ldpfl.contract.layout import (
    CLIENT_FILE_SUFFIX,
    MANIFEST_NAME,
    PARTITION_FILE,
    client_files,
    client_index_from_name,
    is_local_file,
)
from ldpfl.contract.manifest import FileRecord, record_for
from ldpfl.contract.plan import PLAN_FILE
from ldpfl.contract.run_dir import FileCheck, check_run_dir
from ldpfl.contract.schema import ClientMetadata
from ldpfl.stage1_features.export.errors import ExportError
from ldpfl.stage1_features.export.plan import ExportPlan
from ldpfl.stage1_features.export.results import ClientSummary
from ldpfl.stage1_features.export.stored import (
    MODEL_FILE_RE,
    MODEL_SUFFIX,
    START_OVER,
    load_partition,
    model_file_name,
)
from ldpfl.stage1_features.export.worker_guard import wait_for_stale_workers

TOOL = "ldpfl export"
LOCK_FILE = ".export.lock"
STALE_PATTERNS = (f".client_*{CLIENT_FILE_SUFFIX}.*{TMP_MARK}", f".client_*.*{TMP_MARK}{MODEL_SUFFIX}",
                  f".{MANIFEST_NAME}.*{TMP_MARK}", f".{PARTITION_FILE}.*{TMP_MARK}")


@contextlib.contextmanager
def locked(run_dir: Path) -> Iterator[None]:
    """Hold the run directory for one export at a time (``filelock``: a lock the system drops when a process dies).

    Then wait until no worker of an earlier, killed export is alive (``worker_guard``).
    """
    lock = FileLock(run_dir / LOCK_FILE, blocking=False)
    try:
        lock.acquire()
    except Timeout:
        raise ExportError(f"another ldpfl export is running in {run_dir}; wait for it to finish") from None
    try:
        try:
            wait_for_stale_workers(run_dir)  # the workers of a killed export, before anything is examined
        except TimeoutError as error:
            raise ExportError(str(error)) from None
        yield
    finally:
        lock.release()


def prepare_run_dir(out_dir: str | os.PathLike[str]) -> Path:
    """Create ``out_dir`` if needed and check that it is a writable directory (``ExportError`` if not)."""
    if not os.fspath(out_dir).strip():
        raise ExportError("the output directory is empty (\"\"); give a directory (use '.' for the current one)")
    run_dir = Path(out_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ExportError(f"cannot create output directory {run_dir} ({error.strerror or error})") from None
    if not run_dir.is_dir():
        raise ExportError(f"output path {run_dir} is not a directory")
    probe = run_dir / f".write-test.{os.getpid()}{TMP_MARK}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise ExportError(f"output directory {run_dir} is not writable ({error.strerror or error})") from None
    return run_dir


def remove_stale(run_dir: Path) -> list[str]:
    """Remove the temporary files an interrupted export left; return their names."""
    removed = []
    for pattern in STALE_PATTERNS:
        for path in run_dir.glob(pattern):
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed


def clear_outputs(run_dir: Path) -> None:
    """With ``overwrite``: remove what an export wrote (client files, models, manifest, partition, plan), only that."""
    models = [p for p in run_dir.iterdir() if MODEL_FILE_RE.match(p.name) or is_local_file(p.name)]
    for path in [*client_files(run_dir).values(), *models, run_dir / MANIFEST_NAME, run_dir / PARTITION_FILE,
                 run_dir / PLAN_FILE]:
        path.unlink(missing_ok=True)


def _mismatches(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    return [f"{key} was {old.get(key)!r}, now {new.get(key)!r}" for key in sorted(set(old) | set(new))
            if old.get(key) != new.get(key)]


def _check_metadata(path: Path, meta: ClientMetadata, plan: ExportPlan, index: int) -> None:
    layout = plan.layout
    assert layout is not None  # filled in by ExportPlan
    expected = {"dataset": plan.dataset.name, "client_index": index, "client_count": plan.config.clients,
                "extractor": plan.extractor, "features": plan.features, "mechanism": plan.spec.name,
                "feature_format": layout.feature_format, "integer_bits": layout.integer_bits,
                "fraction_bits": layout.fraction_bits, "randomness": plan.randomness.mode,
                "release": str(plan.release)}
    found = {key: getattr(meta, key) for key in expected}
    problems = _mismatches(found, expected)
    if problems:
        raise ExportError(f"{path} belongs to a different export ({'; '.join(problems)}); redo the run with "
                          "`overwrite`")


def _summary(record: FileRecord, meta: ClientMetadata, status: str, run_dir: Path) -> ClientSummary:
    model = model_file_name(record.client_index)
    return ClientSummary(record.client_index, dict(record.rows), meta.local_accuracy, record.path, record.sha256,
                         status, model if (run_dir / model).is_file() else None)


Kept = dict[int, tuple[FileRecord, ClientSummary]]


def existing_clients(run_dir: Path, plan: ExportPlan) -> tuple[Kept, list[np.ndarray] | None,
                                                               dict[str, Any] | None]:
    """Return the finished clients to keep, the stored partition and its description, of a run being resumed.

    Raises
    ------
    ExportError
        The directory holds an export that this one cannot continue: other settings, another tool, a
        file that fails verification (the message says to start over with ``overwrite``).
    """
    check = check_run_dir(run_dir, unlisted=True, read_unlisted=True)
    unlisted: dict[int, FileCheck] = {}
    for file in check.unlisted:
        index = client_index_from_name(file.name)
        if index is not None:
            unlisted[index] = file
    if not check.has_manifest_file:
        if unlisted:
            raise ExportError(f"{run_dir} holds client files but no {MANIFEST_NAME}; they cannot be checked "
                              f"against this run: {START_OVER}")
        return {}, None, None
    manifest = check.manifest
    if manifest is None:
        raise ExportError(f"{check.manifest_error}; {START_OVER}")
    if manifest.info.get("tool") != TOOL:
        raise ExportError(f"{run_dir / MANIFEST_NAME} was not written by {TOOL}; {START_OVER}")
    problems = _mismatches(manifest.info.get("fingerprint", {}), plan.fingerprint())
    if problems:
        raise ExportError(f"{run_dir} holds an export with other settings ({'; '.join(problems)}); replace it "
                          "with `overwrite`, or choose another output directory")
    partition_info = manifest.info.get("partition_file", {})
    clients = load_partition(run_dir, plan.config.clients, len(plan.dataset), partition_info.get("sha256"))
    kept: Kept = {}
    for file in check.listed:
        error = file.error
        if error is not None:
            raise ExportError(f"finished client file fails verification: {error}. It was already randomized and "
                              "is never randomized again (that would spend its privacy budget twice): redo the "
                              "whole run with `overwrite`")
        assert file.record is not None and file.metadata is not None
        _check_metadata(file.path, file.metadata, plan, file.record.client_index)
        kept[file.record.client_index] = (file.record, _summary(file.record, file.metadata, "reused", run_dir))
    for index, file in sorted(unlisted.items()):
        if index in kept:
            continue
        if index >= plan.config.clients:
            raise ExportError(f"{file.path} is beyond the {plan.config.clients} clients of this run; {START_OVER}")
        if file.error is not None or file.metadata is None or file.sha256 is None or file.rows is None:
            raise ExportError(f"client file not in the manifest fails validation: {file.error}; redo the run "
                              "with `overwrite`")
        _check_metadata(file.path, file.metadata, plan, index)
        record = record_for(file.path, index, file.sha256, file.rows)
        kept[index] = (record, _summary(record, file.metadata, "adopted", run_dir))
    return kept, clients, manifest.info.get("partition")
