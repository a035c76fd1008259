"""Gathering the exports of separate silos into one run directory (issue 16, cross-silo federation).

Each silo exports its own records on its own machine (``ldpfl export --plan plan.json --data ...
--client-index i --clients N``) into its own run directory: one ``client_{i:03d}.h5``, a manifest
listing it with its sha256, and a copy of the plan. :func:`gather_runs` puts those files into one run
directory that ``ldpfl federate`` and ``ldpfl inspect`` read:

1. every source is validated by the one validator (``ldpfl.contract.run_dir.validate_run``: manifest, sha256,
   structure, one run);
2. the sources must not give the same client index twice, must carry the same plan (the fingerprint of
   their ``plan.json``, and of the ``plan`` passed in), their files must have been exported with it, and
   they must form one run (``ldpfl.contract.schema.compare_metadata``, the comparison the validator uses): an
   error names the file that disagrees;
3. each file's duplicated records are counted (``ldpfl.contract.duplicates``: training rows repeated, test rows
   repeated, test rows that repeat a training row) and reported; with ``dedupe`` a file that has any is rewritten
   without them (its manifest entry then gives the new sha256, rows and label counts), the others are copied as
   they are; every entry of the new manifest lists its file's label counts (a source's older manifest may not);
4. the files are copied into a hidden temporary directory next to the target, with the plan and a new
   manifest (``tool: ldpfl gather``), the copy is validated again, and the directory is renamed into
   place. On any error nothing is left under the target name.

Imports contract and mechanisms only.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ldpfl.common.errors import LdpflError
from ldpfl.contract.atomic import TMP_MARK, fsync_directory, fsync_file
from ldpfl.contract.client_reader import open_client_file
from ldpfl.contract.digest import sha256_file
from ldpfl.contract.duplicates import DuplicateCount, count_and_keep, expected, file_digests, write_deduplicated
from ldpfl.contract.manifest import FileRecord, record_for, with_label_histograms, write_manifest
from ldpfl.contract.plan import PLAN_FILE, SharedPlan, read_plan, write_plan
from ldpfl.contract.release_guarantee import ReleaseGuarantee, stored_or_computed, weakest
from ldpfl.contract.run_dir import files_off_plan, validate_run
from ldpfl.contract.schema import ClientMetadata, FormatError, compare_metadata

TOOL = "ldpfl gather"


class GatherError(LdpflError, ValueError):
    """Sources that cannot be gathered into one run; the one-line message names the file or directory."""


@dataclass(frozen=True)
class GatherResult:
    """What :func:`gather_runs` wrote.

    Attributes
    ----------
    run_dir : Path
        The new run directory.
    files : tuple of (int, Path)
        Each client index and the source file it came from.
    plan_fingerprint : str or None
        The shared plan's fingerprint (``None`` when no source carries a plan).
    release_guarantees : mapping of int to ReleaseGuarantee
        Each client file's ``release_guarantee`` (everything it releases about one record), by client index.
    duplicates : mapping of int to DuplicateCount
        Each client file's duplicated records as its silo sent it, by client index.
    deduplicated : bool
        Whether the duplicated records were dropped (``dedupe``).
    expected_duplicates : frozenset of int
        The clients whose release repeats rows by construction (``label``): their counts are not a finding.
    """

    run_dir: Path
    files: tuple[tuple[int, Path], ...]
    plan_fingerprint: str | None
    release_guarantees: Mapping[int, ReleaseGuarantee] = field(default_factory=dict)
    duplicates: Mapping[int, DuplicateCount] = field(default_factory=dict)
    deduplicated: bool = False
    expected_duplicates: frozenset[int] = frozenset()

    @property
    def release_guarantee(self) -> ReleaseGuarantee | None:
        """Return the weakest client file's guarantee (the run's figure)."""
        return weakest(self.release_guarantees.values())

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON summary (``ldpfl gather --json``)."""
        return {"run_dir": str(self.run_dir), "plan_fingerprint": self.plan_fingerprint,
                "deduplicated": self.deduplicated,
                "files": [{"client_index": i, "source": str(p),
                           "duplicates": self.duplicates[i].to_dict() if i in self.duplicates else None,
                           "dropped": self.duplicates[i].total if self.deduplicated and i in self.duplicates else 0}
                          for i, p in self.files]}

    def duplicate_lines(self) -> list[str]:
        """Return one line per client file that holds duplicated records (what was found, and whether dropped)."""
        lines = []
        for index, counts in sorted(self.duplicates.items()):
            if not counts.total:
                continue
            what = ("dropped" if self.deduplicated else "kept (gather --dedupe drops them)")
            why = "; expected: a label release repeats its one-hot rows" if index in self.expected_duplicates else ""
            lines.append(f"  ! client {index:>3}  {counts.describe()}: {what}{why}")
        return lines


def gather_runs(sources: Sequence[str | os.PathLike[str]], out_dir: str | os.PathLike[str], *,
                plan: SharedPlan | None = None, dedupe: bool = False) -> GatherResult:
    """Gather the client files of several run directories (one per silo) into ``out_dir``.

    Parameters
    ----------
    sources : sequence of path
        The silos' run directories (each with its manifest).
    out_dir : path
        The new run directory; it must not exist, or be an empty directory.
    plan : SharedPlan, optional
        The plan every source must carry; by default the sources' ``plan.json`` must agree among
        themselves (sources without one are refused when another has one).
    dedupe : bool
        Drop each file's duplicated records (``ldpfl.contract.duplicates``); by default they are counted only.

    Returns
    -------
    GatherResult

    Raises
    ------
    GatherError
        No sources, the same source twice, a client index given twice, different plans, a target that
        is not empty.
    FormatError
        A source that does not validate, or files that do not form one run (the message names the file).
    """
    out = Path(out_dir)
    if not sources:
        raise GatherError("no run directories to gather")
    resolved = [Path(s).resolve() for s in sources]
    if len(set(resolved)) != len(resolved):
        raise GatherError("the same run directory is given twice")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise GatherError(f"{out} exists and is not an empty directory; choose a new directory")
    if out.resolve() in resolved:
        raise GatherError(f"{out} is one of the sources")

    shared, plan_source = (plan, "the plan given") if plan is not None else (None, "")
    gathered: list[tuple[Path, FileRecord, ClientMetadata]] = []
    owner: dict[int, Path] = {}
    for source in map(Path, sources):
        manifest, listed = validate_run(source)
        del manifest
        source_plan = _source_plan(source)
        if shared is None and source_plan is not None and not gathered:
            shared, plan_source = source_plan, str(source / PLAN_FILE)
        if shared is not None:
            if source_plan is None:
                raise GatherError(f"{source} has no {PLAN_FILE}, but {plan_source} sets the plan; export that "
                                  "silo with the plan")
            if source_plan.fingerprint != shared.fingerprint:
                raise GatherError(f"{source / PLAN_FILE} ({source_plan.fingerprint[:19]}…) is not the plan of "
                                  f"{plan_source} ({shared.fingerprint[:19]}…)")
        elif source_plan is not None:
            raise GatherError(f"{source / PLAN_FILE} sets a plan, but the sources before it have none")
        for record, metadata in listed:
            path = source / record.path
            if record.client_index in owner:
                raise GatherError(f"{path} is client {record.client_index}, and so is "
                                  f"{owner[record.client_index] / record.path}: give each silo its own "
                                  "client index")
            owner[record.client_index] = source
            gathered.append((path, record, metadata))
    named = [(str(path), metadata) for path, _, metadata in gathered]
    problems = compare_metadata(named)
    if shared is not None:
        problems += files_off_plan(shared.fingerprint, named, plan_source)
    if problems:
        raise FormatError(out, f"the silos' files do not form one run: {'; '.join(problems)}")
    duplicates, keep, expected_in = {}, {}, set()
    for path, record, metadata in gathered:
        with open_client_file(path) as (handle, _, _rows):
            duplicates[record.client_index], keep[record.client_index] = count_and_keep(file_digests(path, handle))
        if expected(metadata):
            expected_in.add(record.client_index)

    remove_stale_gathers(out)
    tmp = out.with_name(f".{out.name}.{os.getpid()}{TMP_MARK}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    written: list[FileRecord] = []
    try:
        for path, record, metadata in gathered:
            target = tmp / record.path
            if dedupe and duplicates[record.client_index].total:
                kept = keep[record.client_index]
                digest = write_deduplicated(path, target, kept)
                # the new file's label counts, recounted over the kept rows (record_for reads them from it)
                written.append(record_for(target, record.client_index, digest,
                                          {split: int(mask.sum()) for split, mask in kept.items()}))
                continue
            shutil.copyfile(path, target)
            fsync_file(target)
            if sha256_file(target) != record.sha256:
                raise FormatError(path, "changed while it was copied (sha256 differs from its manifest's)")
            # the file's label counts (its attribute, which validate_run checked against a listing source's)
            written.append(with_label_histograms(record, metadata.label_histograms))
        if shared is not None:
            write_plan(shared, tmp / PLAN_FILE)
        first = gathered[0][2]
        info: dict[str, Any] = {"tool": TOOL, "dataset": first.dataset, "client_count": first.client_count,
                                "sources": [str(s) for s in sources],
                                "plan_fingerprint": None if shared is None else shared.fingerprint}
        dropped = {str(i): c.to_dict() for i, c in sorted(duplicates.items()) if dedupe and c.total}
        if dropped:
            info["deduplicated"] = dropped  # the rows gather --dedupe dropped from each silo's file
        write_manifest(tmp, written, info)
        validate_run(tmp)  # the one validator, on exactly what will be federated
        if out.exists():
            out.rmdir()  # empty, checked above
        os.replace(tmp, out)
        fsync_directory(out.parent if str(out.parent) else ".")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    guarantees = {record.client_index: stored_or_computed(metadata, records=sum(record.rows.values()))
                  for _, record, metadata in gathered}
    return GatherResult(out, tuple((record.client_index, path) for path, record, _ in gathered),
                        None if shared is None else shared.fingerprint, guarantees, duplicates, dedupe,
                        frozenset(expected_in))


def remove_stale_gathers(out: str | os.PathLike[str]) -> list[str]:
    """Remove the temporary directories (``.<out>.<pid>.tmp``) that killed gathers into ``out`` left; return them.

    A temporary whose process is still alive belongs to a gather under way and is kept.
    """
    out = Path(out)
    pattern = re.compile(rf"^\.{re.escape(out.name)}\.(\d+){re.escape(TMP_MARK)}$")
    removed: list[str] = []
    folder = out.parent if str(out.parent) else Path(".")
    try:
        entries = list(folder.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = pattern.match(entry.name)
        if match is None or not entry.is_dir() or entry.is_symlink() or _alive(int(match.group(1))):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry.name)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # this process's own leftover (a pid reused): not a gather under way
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # someone else's process, or unknowable: keep it
    return True


def _source_plan(source: Path) -> SharedPlan | None:
    path = source / PLAN_FILE
    if not path.is_file():
        return None
    return read_plan(path)


__all__ = ["TOOL", "GatherError", "GatherResult", "gather_runs", "remove_stale_gathers"]
