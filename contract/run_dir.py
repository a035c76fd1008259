"""The one run-directory validator: what the manifest lists, what the files are, whether they form one run.

:func:`check_run_dir` examines a run directory and never raises for a bad file: it returns a
:class:`RunCheck` of facts (the manifest or why it failed, one :class:`FileCheck` per client file, the
run-level problems). Its users decide how strict to be:

* ``ldpfl gather`` calls :func:`validate_run`: everything must verify, and every feature value must be one its
  mechanism outputs (finite, in its declared range or set);
* ``ldpfl federate``'s local engine calls :func:`screen_run`: the same checks, but a file that does not verify is
  refused and its silo left out (issue 42 item 4), while what is wrong with the run itself still raises;
* ``ldpfl export`` (stage 1, resuming) keeps the files that verify and errs on the others;
* ``ldpfl inspect`` reports every fact.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ldpfl.contract.client_reader import open_client_file, verify_client_data
from ldpfl.contract.digest import sha256_file
from ldpfl.contract.file_checks import feature_value_problem, file_problems
from ldpfl.contract.layout import CLIENT_FILE_SUFFIX, MANIFEST_NAME, client_index_from_name, is_hidden, is_local_file
from ldpfl.contract.manifest import FileRecord, Manifest, histograms_of, read_manifest
from ldpfl.contract.plan import PLAN_FILE, read_plan
from ldpfl.contract.schema import ClientMetadata, FormatError, compare_metadata
from ldpfl.contract.small_files import not_regular_reason


@dataclass(frozen=True)
class FileCheck:
    """One client file of a run directory: what the manifest says about it and what it is.

    Attributes
    ----------
    path : Path
        The file.
    record : FileRecord or None
        Its manifest entry; ``None`` when the manifest does not list it (or there is no manifest).
    sha256 : str or None
        Its hex sha256; ``None`` when the file is missing.
    metadata : ClientMetadata or None
        Its validated attributes; ``None`` when it is missing or fails validation.
    rows : mapping or None
        Rows per split, as stored.
    open_error : FormatError or None
        Why the file failed validation (structure, or with ``read_data`` a checksum).
    """

    path: Path
    record: FileRecord | None
    sha256: str | None
    metadata: ClientMetadata | None
    rows: Mapping[str, int] | None
    open_error: FormatError | None

    @property
    def name(self) -> str:
        """Return the file name."""
        return self.path.name

    @property
    def exists(self) -> bool:
        """Return whether the file is present."""
        return self.sha256 is not None

    @property
    def sha256_matches(self) -> bool | None:
        """Return whether the sha256 matches the manifest's; ``None`` when unlisted or missing."""
        if self.record is None or self.sha256 is None:
            return None
        return self.sha256 == self.record.sha256

    @property
    def error(self) -> FormatError | None:
        """Return the first reason the file does not verify (missing, sha256, structure, rows), if any."""
        record = self.record
        if record is not None and not self.exists:
            return FormatError(self.path, "listed in the manifest but missing")
        if record is not None and self.sha256 is not None and not self.sha256_matches:
            return FormatError(self.path, f"sha256 {self.sha256[:12]}… does not match the manifest's "
                                          f"{record.sha256[:12]}…")
        if self.open_error is not None:
            return self.open_error
        if record is not None and self.rows is not None and dict(self.rows) != dict(record.rows):
            return FormatError(self.path, f"rows {dict(self.rows)} differ from the manifest's {dict(record.rows)}")
        if (record is not None and record.label_histograms is not None and self.metadata is not None
                and histograms_of(self.metadata.label_histograms) != histograms_of(record.label_histograms)):
            return FormatError(self.path, f"label histograms {histograms_of(self.metadata.label_histograms)} differ "
                                          f"from the manifest's {histograms_of(record.label_histograms)}")
        return None

    def name_problem(self) -> str | None:
        """Return how the attribute ``client_index`` contradicts the file name, if it does."""
        return None if self.metadata is None else name_index_problem(self.name, self.metadata)

    def manifest_index_problem(self) -> str | None:
        """Return how the attribute ``client_index`` contradicts the manifest entry, if it does."""
        if self.metadata is None or self.record is None:
            return None
        return listed_index_problem(self.metadata, self.record.client_index)


def name_index_problem(name: str, metadata: ClientMetadata) -> str | None:
    """Return how the attribute ``client_index`` contradicts the file name ``client_NNN.h5``, if it does."""
    named = client_index_from_name(name)
    if named is None or named == metadata.client_index:
        return None
    return f"attribute 'client_index' is {metadata.client_index} but the file is named {name}"


def listed_index_problem(metadata: ClientMetadata, listed_as: int | None) -> str | None:
    """Return how the attribute ``client_index`` contradicts the manifest's entry (client ``listed_as``), if it does."""
    if listed_as is None or listed_as == metadata.client_index:
        return None
    return f"attribute 'client_index' is {metadata.client_index} but the manifest lists this file as client {listed_as}"


def plan_problems(run_dir: Path, files: list[tuple[str, ClientMetadata]]) -> list[str]:
    """Return how the files disagree with ``run_dir/plan.json`` (nothing when there is no plan file).

    Parameters
    ----------
    run_dir : Path
        The run directory.
    files : list of (str, ClientMetadata)
        Each file's name and metadata.
    """
    if not (run_dir / PLAN_FILE).is_file():
        return []
    try:
        plan = read_plan(run_dir / PLAN_FILE)
    except FormatError as error:
        return [str(error)]
    return files_off_plan(plan.fingerprint, files, PLAN_FILE)


def files_off_plan(fingerprint: str, files: list[tuple[str, ClientMetadata]], plan_name: str) -> list[str]:
    """Return one problem per file whose ``plan_fingerprint`` is not ``fingerprint`` (the plan ``plan_name``'s)."""
    def short(value: str | None) -> str:
        return "none" if value is None else value[:19] + "…"

    return [f"{name} was not exported with {plan_name} (plan fingerprint {short(meta.plan_fingerprint)}, the plan's "
            f"{short(fingerprint)})" for name, meta in files if meta.plan_fingerprint != fingerprint]


def check_client_file(path: str | os.PathLike[str], record: FileRecord | None = None, *,
                      read_data: bool = False) -> FileCheck:
    """Hash and validate one client file (against its manifest entry, when given).

    Parameters
    ----------
    path : path
        The file.
    record : FileRecord, optional
        Its manifest entry.
    read_data : bool
        Also read every chunk, in row blocks (HDF5 verifies each Fletcher-32 checksum); by default
        only the attributes, the structure and ``ldpfl.contract.file_checks.file_problems`` (mechanism,
        privacy report, checksums present: what ``ldpfl inspect`` flags) are checked.

    Returns
    -------
    FileCheck
    """
    path = Path(path)
    if not path.is_file():
        return FileCheck(path, record, None, None, None, FormatError(path, not_regular_reason(path)))
    digest = sha256_file(path)
    try:
        with open_client_file(path) as (handle, metadata, rows):
            problems = file_problems(handle, metadata)  # the contradictions ldpfl inspect flags
        if problems:
            raise FormatError(path, "; ".join(problems))
        if read_data:
            verify_client_data(path)  # every chunk, in row blocks
    except FormatError as error:
        return FileCheck(path, record, digest, None, None, error)
    return FileCheck(path, record, digest, metadata, dict(rows), None)


def verify_file_record(run_dir: str | os.PathLike[str], record: FileRecord) -> ClientMetadata:
    """Check that a listed file exists, matches its sha256 and rows, and validates; return its metadata.

    Raises
    ------
    FormatError
        The first reason it does not verify (see :attr:`FileCheck.error`).
    """
    file = check_client_file(Path(run_dir) / record.path, record)
    if file.error is not None:
        raise file.error
    assert file.metadata is not None
    return file.metadata


def run_problems(run_dir: Path, valid: list[tuple[str, ClientMetadata]]) -> list[str]:
    """Return run-level problems among ``valid`` files (name and metadata of each that validates).

    Attributes that differ (``compare_metadata``: among them the plan fingerprint, the class names and
    the widths), a local-only file among shareable ones (a run of local-only files, ``ldpfl export
    --local-only``, is one run: it stays on its silo), repeated indices, and, when the run directory holds a
    ``plan.json``, a file that was not exported with that plan or a plan file that cannot be read.
    """
    problems = compare_metadata(valid)
    problems += plan_problems(run_dir, valid)
    local = [name for name, meta in valid if meta.local_only]
    if local and len(local) < len(valid):  # a local-only run (``--local-only``) has nothing else
        problems += [f"{name} is a local-only file (unrandomized records, never shared), not a client file of "
                     "the run" for name in local]
    indices = [meta.client_index for _, meta in valid]
    duplicates = sorted({i for i in indices if indices.count(i) > 1})
    if duplicates:
        problems.append(f"client indices {duplicates} appear in more than one file")
    return problems


@dataclass(frozen=True)
class RefusedFile:
    """A listed client file that does not verify: its manifest entry and why (:meth:`RunCheck.screened`)."""

    record: FileRecord
    error: FormatError


@dataclass(frozen=True)
class ScreenedRun:
    """A run directory's manifest, the listed files that verify (record and metadata), and those refused."""

    manifest: Manifest
    checked: list[tuple[FileRecord, ClientMetadata]]
    refused: list[RefusedFile]


@dataclass(frozen=True)
class RunCheck:
    """What :func:`check_run_dir` found.

    Attributes
    ----------
    run_dir : Path
        The directory.
    manifest : Manifest or None
        The parsed manifest; ``None`` when it is absent or invalid.
    manifest_error : FormatError or None
        Why there is no manifest (absent, unreadable, malformed).
    files : tuple of FileCheck
        The listed files in manifest order, then (when asked for) the unlisted ``*.h5`` files by name.
    """

    run_dir: Path
    manifest: Manifest | None
    manifest_error: FormatError | None
    files: tuple[FileCheck, ...]

    @property
    def manifest_path(self) -> Path:
        """Return the manifest's path."""
        return self.run_dir / MANIFEST_NAME

    @property
    def has_manifest_file(self) -> bool:
        """Return whether a manifest file is present (valid or not)."""
        return self.manifest_path.is_file()

    @property
    def listed(self) -> list[FileCheck]:
        """Return the checks of the files the manifest lists."""
        return [f for f in self.files if f.record is not None]

    @property
    def unlisted(self) -> list[FileCheck]:
        """Return the checks of the ``*.h5`` files the manifest does not list."""
        return [f for f in self.files if f.record is None]

    def duplicate_listed_indices(self) -> list[int]:
        """Return client indices the manifest lists more than once."""
        indices = [f.record.client_index for f in self.listed if f.record is not None]
        return sorted({i for i in indices if indices.count(i) > 1})

    def problems(self) -> list[str]:
        """Return run-level problems among the files that validate (:func:`run_problems`)."""
        return run_problems(self.run_dir, [(f.name, f.metadata) for f in self.files if f.metadata is not None])

    def _listing(self) -> Manifest:
        """Return the manifest, or raise: none valid, no file listed, an index listed twice."""
        if self.manifest is None:
            raise self.manifest_error or FormatError(self.manifest_path, "no manifest")
        if not self.manifest.files:
            raise FormatError(self.manifest_path, "lists no client files")
        if self.duplicate_listed_indices():
            indices = sorted(f.record.client_index for f in self.listed if f.record is not None)
            raise FormatError(self.manifest_path, f"lists a client index twice: {indices}")
        return self.manifest

    def require_valid(self) -> tuple[Manifest, list[tuple[FileRecord, ClientMetadata]]]:
        """Return the manifest and each listed file's record and metadata, or raise the first problem.

        Raises
        ------
        FormatError
            No valid manifest, no file listed, an index listed twice, a file that does not verify
            (missing, sha256, structure, rows), a ``client_index`` that contradicts the manifest.
        ValueError
            Files that do not belong to one run, every differing attribute named with its files.
        """
        manifest = self._listing()
        checked: list[tuple[FileRecord, ClientMetadata]] = []
        for file in self.listed:
            error = file.error
            if error is not None:
                raise error
            assert file.record is not None and file.metadata is not None
            checked.append((file.record, file.metadata))
        problems = self.problems()
        if problems:
            raise ValueError(f"the client files of {self.run_dir} do not belong to one run: {'; '.join(problems)}")
        for file in self.listed:
            problem = file.manifest_index_problem()
            if problem is not None:
                raise FormatError(file.path, problem)
        return manifest, checked

    def screened(self) -> ScreenedRun:
        """Return the manifest, the listed files that verify, and those that do not, each with why.

        As :meth:`require_valid`, but a listed file that does not verify (missing, sha256, structure, rows, label
        counts, a ``client_index`` the manifest contradicts) is refused rather than raised: one silo's file does
        not stop the others'. What is wrong with the run itself (the manifest; files that do not form one run,
        among those that verify) still raises.
        """
        manifest = self._listing()
        checked: list[tuple[FileRecord, ClientMetadata]] = []
        refused: list[RefusedFile] = []
        for file in self.listed:
            assert file.record is not None
            error = file.error
            problem = None if error is not None else file.manifest_index_problem()
            if error is None and problem is None:
                assert file.metadata is not None
                checked.append((file.record, file.metadata))
            else:
                refused.append(RefusedFile(file.record, error or FormatError(file.path, str(problem))))
        return ScreenedRun(manifest, checked, refused)


def check_run_dir(run_dir: str | os.PathLike[str], *, unlisted: bool = True, read_unlisted: bool = False) -> RunCheck:
    """Examine a run directory: its manifest and every client file, never raising for a bad one.

    Parameters
    ----------
    run_dir : path
        The run directory.
    unlisted : bool
        Also check the ``*.h5`` files that the manifest does not list (temporary and local-only files
        ``client_NNN.local.h5`` excluded).
    read_unlisted : bool
        Read every chunk of those (a file found but never listed must prove its data intact).

    Returns
    -------
    RunCheck
    """
    run_dir = Path(run_dir)
    manifest: Manifest | None = None
    manifest_error: FormatError | None = None
    try:
        manifest = read_manifest(run_dir)
    except FormatError as error:
        manifest_error = error
    records = manifest.files if manifest is not None else []
    files = [check_client_file(run_dir / record.path, record) for record in records]
    if unlisted:
        extra = unlisted_client_files(run_dir, {record.path for record in records})
        files += [check_client_file(run_dir / name, read_data=read_unlisted) for name in extra]
    return RunCheck(run_dir, manifest, manifest_error, tuple(files))


def unlisted_client_files(run_dir: str | os.PathLike[str], listed: set[str]) -> list[str]:
    """Return the names of the ``*.h5`` files in ``run_dir`` that are not in ``listed`` (sorted).

    Temporary (hidden) and local-only files (``client_NNN.local.h5``) are not client files.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    return sorted(p.name for p in run_dir.glob(f"*{CLIENT_FILE_SUFFIX}")
                  if not is_hidden(p.name) and not is_local_file(p.name) and p.name not in listed)


def validate_run(run_dir: str | os.PathLike[str]) -> tuple[Manifest, list[tuple[FileRecord, ClientMetadata]]]:
    """Check the manifest, every listed file's sha256 and structure, and that the files form one run.

    Returns
    -------
    tuple
        The manifest, and (record, metadata) of every listed file in manifest order.

    Raises
    ------
    FormatError
        A ``ValueError`` naming the file and the problem (see :meth:`RunCheck.require_valid`).
    ValueError
        Files that do not belong to one run, with every differing attribute and the files named.
    FormatError
        Client files in the directory that the manifest does not list (an interrupted export, or files
        copied in): federating the listed ones alone would silently leave those clients out.
    FormatError
        A file holding a feature value its mechanism cannot output (``file_checks.feature_value_problem``, one read
        of its features): not finite, outside the mechanism's declared output range or set, or a packed row's
        padding bits set. ``gather`` and ``federate`` refuse it, naming the file.
    """
    check = check_run_dir(run_dir, unlisted=False)
    manifest, checked = check.require_valid()
    for record, _metadata in checked:
        problem = feature_value_problem(Path(run_dir) / record.path)
        if problem is not None:
            raise FormatError(Path(run_dir) / record.path, problem)
    _refuse_unlisted(Path(run_dir), manifest)
    return manifest, checked


def screen_run(run_dir: str | os.PathLike[str]) -> ScreenedRun:
    """Check the run as :func:`validate_run` does, refusing each listed file that does not verify instead of raising.

    The local engine's check (issue 42 item 4: one silo never stops a run): a listed file that is missing, whose
    sha256, structure, rows, label counts or ``client_index`` disagree with the manifest, or that holds a feature
    value its mechanism cannot output is returned in ``refused`` with its one-line problem; its silo is left out.

    Raises
    ------
    FormatError
        No valid manifest, no file listed, an index listed twice, client files the manifest does not list.
    ValueError
        Files that verify but do not belong to one run (``run_problems``).
    """
    run_dir = Path(run_dir)
    screened = check_run_dir(run_dir, unlisted=False).screened()
    _refuse_unlisted(run_dir, screened.manifest)
    checked: list[tuple[FileRecord, ClientMetadata]] = []
    refused = list(screened.refused)
    for record, metadata in screened.checked:
        problem = feature_value_problem(run_dir / record.path)
        if problem is None:
            checked.append((record, metadata))
        else:
            refused.append(RefusedFile(record, FormatError(run_dir / record.path, problem)))
    problems = run_problems(run_dir, [(record.path, metadata) for record, metadata in checked])
    if problems:
        raise ValueError(f"the client files of {run_dir} do not belong to one run: {'; '.join(problems)}")
    refused.sort(key=lambda r: (r.record.client_index, r.record.path))
    return ScreenedRun(screened.manifest, checked, refused)


def _refuse_unlisted(run_dir: Path, manifest: Manifest) -> None:
    """Raise ``FormatError`` when ``run_dir`` holds client files the manifest does not list."""
    extra = unlisted_client_files(run_dir, {record.path for record in manifest.files})
    if extra:
        shown = ", ".join(extra[:10]) + (f" and {len(extra) - 10} more" if len(extra) > 10 else "")
        raise FormatError(run_dir / MANIFEST_NAME,
                          f"lists {len(manifest.files)} of the {len(manifest.files) + len(extra)} client files in "
                          f"{run_dir}; not listed: {shown} (finish or resume the export with ldpfl export, or move "
                          "those files away)")
