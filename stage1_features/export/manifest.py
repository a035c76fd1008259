"""What an export's manifest adds to the run information: the release history and the local-only files.

* ``release_history`` (``ldpfl.contract.release_history``): for every finished client, each release of its
  records, oldest first: the source run's releases (``from_models``), then this run's file.
* ``local_files`` (``keep_clean_test``): each client's ``client_NNN.local.h5``, with its rows but no
  sha256: those files hold unrandomized records and stay with the client, and a hash of them would let
  anyone holding the manifest confirm a guess of those records.

Each client file's entry lists its per-split label counts (``FileRecord.label_histograms``, read from the file by
``contract.manifest.record_for``), which a coordinator checks a silo's claimed histogram against (issue 42 item 3).
They are the counts the file's own ``label_histograms`` attribute holds (of its released labels): already released
with the file, so the manifest lets nothing new leave the silo. The local-only files' entries list none.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ldpfl.contract.client_reader import open_client_file
from ldpfl.contract.layout import client_stem, local_file_name
from ldpfl.contract.manifest import FileRecord, file_label_histograms, with_label_histograms
from ldpfl.contract.release_guarantee import ReleaseGuarantee, stored_or_computed
from ldpfl.contract.release_history import RELEASE_HISTORY_KEY, ReleaseEntry, history_json
from ldpfl.contract.run_dir import check_client_file
from ldpfl.stage1_features.export.errors import ExportError

if TYPE_CHECKING:
    from ldpfl.stage1_features.export.plan import ExportPlan

RELEASE_GUARANTEE_KEY = "release_guarantee"
LOCAL_FILES_KEY = "local_files"
LOCAL_FILES_NOTE = ("client_NNN.local.h5: UNRANDOMIZED test records for evaluation on the client's own machine "
                    "(ldpfl federate --eval-clean); never share them; not hashed here")


def own_entry(plan: ExportPlan, record: FileRecord) -> ReleaseEntry:
    """Return this run's release of a client's records (``run`` "." is the run directory itself)."""
    report = plan.privacy
    return ReleaseEntry(".", record.path, record.sha256, plan.spec.name, str(plan.release),
                        report.exact_epsilon_per_record, plan.randomness.mode, plan.label_release)


def client_guarantees(run_dir: Path, records: Mapping[int, FileRecord]) -> dict[int, ReleaseGuarantee]:
    """Return each finished client's ``release_guarantee`` as its file states it, by client index."""
    out = {}
    for index, record in sorted(records.items()):
        with open_client_file(run_dir / record.path) as (_, meta, rows):
            out[index] = stored_or_computed(meta, records=sum(rows.values()))
    return out


def guarantees_of(run_dir: Path, records: Mapping[int, FileRecord]) -> dict[str, ReleaseGuarantee]:
    """Return each finished client's ``release_guarantee`` as its file states it, by stem (``client_000``)."""
    return {client_stem(index): guarantee for index, guarantee in client_guarantees(run_dir, records).items()}


def manifest_info(run_info: Mapping[str, Any], plan: ExportPlan, records: Mapping[int, FileRecord],
                  local_records: Mapping[int, FileRecord], run_dir: Path) -> dict[str, Any]:
    """Return ``run_info`` with the release history and guarantee of the finished clients and the local-only files."""
    source = plan.source
    history = {i: [*(source.history.get(i, []) if source is not None else []), own_entry(plan, record)]
               for i, record in records.items()}
    info = dict(run_info) | {RELEASE_HISTORY_KEY: history_json(history),
                             RELEASE_GUARANTEE_KEY: {stem: guarantee.to_dict()
                                                     for stem, guarantee in guarantees_of(run_dir, records).items()}}
    if plan.config.keep_clean_test:
        info[LOCAL_FILES_KEY] = {"note": LOCAL_FILES_NOTE, "files": [
            {"client_index": i, "path": r.path, "rows": dict(r.rows)} for i, r in sorted(local_records.items())]}
    return info


def kept_local_records(run_dir: Path, kept: Mapping[int, Any]) -> dict[int, FileRecord]:
    """Return the local-only files of the clients a resumed run keeps (each must validate and be local-only)."""
    found = {}
    for index in kept:
        path = run_dir / local_file_name(index)
        check = check_client_file(path)
        if check.metadata is None or not check.metadata.local_only or check.sha256 is None or check.rows is None:
            problem = check.open_error or "not a local-only file"
            raise ExportError(f"client {index} is finished but its local-only file {path.name} fails validation "
                              f"({problem}); redo the run with `overwrite`")
        found[index] = FileRecord(index, path.name, check.sha256, path.stat().st_size, dict(check.rows))
    return found


def with_file_histograms(run_dir: Path, record: FileRecord) -> FileRecord:
    """Return a kept file's entry listing the file's label counts (an older manifest's entry lists none).

    The counts are the file's ``label_histograms`` attribute, released with the file: nothing new leaves the silo.
    """
    if record.label_histograms is not None:
        return record
    histograms = file_label_histograms(run_dir / record.path)
    return record if histograms is None else with_label_histograms(record, histograms)
