"""One client file under ``ldpfl inspect``: its manifest entry, its identity, its privacy, and every data chunk.

The schema and structure are checked through ``ldpfl.contract.client_reader.open_client_file`` (declared
shapes, dtypes, links, external storage, virtual datasets and filters, before any data is read); then
every chunk is read in row blocks through HDF5's Fletcher-32 filter (a flipped data byte fails), the
labels are compared with the stored histograms, and the bit or float statistics are made.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ldpfl import mechanisms as mech
from ldpfl.contract import inventory
from ldpfl.contract.clamped import MAX_CLAMPED_SHARE
from ldpfl.contract.client_reader import iter_feature_chunks, open_client_file, short_error
from ldpfl.contract.duplicates import (
    DuplicateCount,
    beyond_chance,
    chance_pairs,
    count_and_keep,
    expected,
    file_digests,
    log_equal_bits,
    log_equal_values,
)
from ldpfl.contract.file_checks import checksum_problems, unprotected_datasets
from ldpfl.contract.guarantee_check import GuaranteeCheck, check_stored
from ldpfl.contract.jsonout import json_ready
from ldpfl.contract.layout import MANIFEST_NAME
from ldpfl.contract.manifest import read_manifest
from ldpfl.contract.release_guarantee import ReleaseGuarantee, stored_or_computed
from ldpfl.contract.run_dir import FileCheck, check_client_file, listed_index_problem, name_index_problem
from ldpfl.contract.schema import SPLITS, ClientMetadata, FormatError
from ldpfl.inspection.bits import BitStatistics, bit_statistics, count_ones_per_position
from ldpfl.inspection.floats import FloatStatistics, MomentAccumulator
from ldpfl.inspection.privacy import PrivacySummary, file_mechanism, privacy_summary
from ldpfl.inspection.released import StatisticsSummary, statistics_summary
from ldpfl.mechanisms import PACKED_BITS

OK, FLAGGED, ERROR = "ok", "flagged", "error"
BLOCK_BYTES = 4 << 20  # bytes of stored feature data read per block

@dataclass(frozen=True)
class ManifestCheck:
    """What the manifest says about a file: ``ok``, ``mismatch``, ``not listed``, ``no manifest`` or ``error``."""

    status: str
    message: str
    rows: Mapping[str, int] | None = None  # rows per split that the manifest lists
    client_index: int | None = None  # the client that the manifest says this file is

    @property
    def failed(self) -> bool:
        """Return whether the manifest contradicts the file (or lists it but it is missing)."""
        return self.status in ("mismatch", "error")


@dataclass
class FileReport:
    """Everything inspect found about one client file. ``error`` is set when it could not be validated."""

    path: Path
    size_bytes: int | None = None
    manifest: ManifestCheck = ManifestCheck("no manifest", "no manifest")
    metadata: ClientMetadata | None = None
    rows: dict[str, int] = field(default_factory=dict)
    label_histograms: dict[str, list[int]] = field(default_factory=dict)
    checksums: str = "not read"
    privacy: PrivacySummary | None = None
    guarantee: ReleaseGuarantee | None = None  # everything the file releases about one record (issue 22)
    guarantee_check: GuaranteeCheck | None = None  # how the stored guarantee was checked (bracket or recomputed)
    bits: BitStatistics | None = None
    floats: FloatStatistics | None = None
    released_statistics: StatisticsSummary | None = None  # a stats:K file's release and its checks (issue 40)
    duplicates: DuplicateCount | None = None  # repeated records (issue 42 item 3; ldpfl.contract.duplicates)
    chance_pairs: float = 0.0  # the equal pairs distinct records would hold by chance (the file's value shares)
    flags: list[str] = field(default_factory=list)
    error: str | None = None  # "PATH: problem", one line
    error_problem: str | None = None  # the problem alone

    @property
    def name(self) -> str:
        """Return the file name."""
        return self.path.name

    @property
    def status(self) -> str:
        """Return ``error`` (not validated), ``flagged`` (something contradicts it) or ``ok``."""
        if self.error:
            return ERROR
        return FLAGGED if self.flags or self.manifest.failed else OK

    def to_dict(self) -> dict[str, Any]:
        """Return everything found about the file, JSON-ready."""
        meta = None
        if self.metadata is not None:
            m = self.metadata
            meta = dataclasses.asdict(m) | {
                "bits_per_value": m.bits_per_value, "feature_width": m.feature_width,
                "stored_width": m.stored_width, "private": m.private,
                # the typed attributes as the file stores them (their records' JSON writers), not their fields
                "privacy_report": json.loads(m.privacy_report.to_json()),
                "label_release": None if m.label_release is None else m.label_release.to_json(),
                "release_guarantee": None if m.release_guarantee is None else m.release_guarantee.to_dict()}
        return json_ready({
            "file": self.name, "path": str(self.path), "bytes": self.size_bytes, "status": self.status,
            "error": self.error, "flags": list(self.flags),
            "manifest": dataclasses.asdict(self.manifest), "checksums": self.checksums, "metadata": meta,
            "rows": dict(self.rows), "label_histograms": dict(self.label_histograms),
            "privacy": None if self.privacy is None else self.privacy.to_dict(),
            "release_guarantee": None if self.guarantee is None else self.guarantee.to_dict(),
            "release_guarantee_check": None if self.guarantee_check is None else self.guarantee_check.to_dict(),
            "bit_statistics": None if self.bits is None else self.bits.to_dict(),
            "float_statistics": None if self.floats is None else self.floats.to_dict(),
            "released_statistics": None if self.released_statistics is None else self.released_statistics.to_dict(),
            "duplicates": None if self.duplicates is None else self.duplicates.to_dict() | {
                "chance_pairs": self.chance_pairs},
        })


def _block_rows(dset: h5py.Dataset, block_rows: int | None) -> int:
    """Rows per read: a whole number of HDF5 chunks, about BLOCK_BYTES (or ``block_rows`` if given)."""
    if block_rows:
        return int(block_rows)
    chunk_rows = dset.chunks[0] if dset.chunks else 1
    row_bytes = max(1, int(np.prod(dset.shape[1:], dtype=np.int64)) * dset.dtype.itemsize)
    return int(chunk_rows * max(1, BLOCK_BYTES // max(1, chunk_rows * row_bytes)))


def _checked_blocks(path: Path, name: str, blocks: Iterator[np.ndarray], step: int,
                    total: int) -> Iterator[np.ndarray]:
    """Turn a read failure (Fletcher-32 mismatch, truncation) into a ``FormatError`` naming the rows."""
    start = 0
    while True:
        try:
            block = next(blocks)
        except StopIteration:
            return
        except (OSError, RuntimeError) as error:
            stop = min(start + step, total)
            raise FormatError(path, f"dataset {name!r} rows {start}:{stop} failed its Fletcher-32 "
                                    f"checksum or could not be read ({short_error(error, 160)})") from None
        start += len(block)
        yield block


def _iter_rows(handle: h5py.File, split: str, name: str, block_rows: int | None) -> tuple[Iterator[np.ndarray], int]:
    dset = handle[split][name]
    step = _block_rows(dset, block_rows)
    if name == "features":
        return iter_feature_chunks(handle, split, step), step
    return (dset[i:i + step] for i in range(0, dset.shape[0], step)), step


def _read_labels(path: Path, handle: h5py.File, split: str, num_classes: int, block_rows: int | None) -> list[int]:
    """Label histogram of ``split``, read in blocks through the checksum filter."""
    dset = handle[split]["labels"]
    blocks, step = _iter_rows(handle, split, "labels", block_rows)
    hist = np.zeros(num_classes, dtype=np.int64)
    for block in _checked_blocks(path, f"{split}/labels", blocks, step, dset.shape[0]):
        if block.size and (block.min() < 0 or block.max() >= num_classes):
            raise FormatError(path, f"labels of split {split!r} fall outside [0, {num_classes})")
        hist += np.bincount(block.astype(np.int64), minlength=num_classes)
    return hist.tolist()


def _count_packed(path: Path, handle: h5py.File, split: str, stored_width: int,
                  block_rows: int | None) -> np.ndarray:
    """1s per bit position of ``split`` (including the padding bits of the last byte)."""
    dset = handle[split]["features"]
    blocks, step = _iter_rows(handle, split, "features", block_rows)
    ones = np.zeros(stored_width * 8, dtype=np.int64)
    for block in _checked_blocks(path, f"{split}/features", blocks, step, dset.shape[0]):
        ones += count_ones_per_position(block, stored_width * 8)
    return ones


def _float_statistics(path: Path, handle: h5py.File, features: int, mechanism: Any | None,
                      block_rows: int | None) -> tuple[FloatStatistics, float]:
    """Per-feature moments over every split and, for PDPM, the share of each of its outputs.

    Also returns log P(two distinct rows are equal) from each coordinate's shares of the mechanism's few outputs
    (``ldpfl.contract.duplicates.log_equal_values``); -inf for a mechanism of continuous outputs.
    """
    moments = MomentAccumulator(features)
    lo, hi, non_finite = math.inf, -math.inf, 0
    outputs = None
    values = None if mechanism is None else mechanism.output_values()
    if values is not None:
        names = ("high", "low", "centre") if len(values) == 3 else tuple(f"v{i}" for i in range(len(values)))
        outputs = dict(zip(names, (float(v) for v in values), strict=True))  # PDPM's three, duchi's ±B, ...
    hits = np.zeros(len(outputs or ()) + 1, dtype=np.int64)  # each output, then "other"
    per_column = np.zeros((features, len(outputs or ())), dtype=np.int64)
    points = np.array([np.float32(v) for v in (outputs or {}).values()], dtype=np.float32)
    for split in SPLITS:
        dset = handle[split]["features"]
        blocks, step = _iter_rows(handle, split, "features", block_rows)
        for block in _checked_blocks(path, f"{split}/features", blocks, step, dset.shape[0]):
            if not block.size:
                continue
            non_finite += int(block.size - np.count_nonzero(np.isfinite(block)))
            moments.add(block)
            lo, hi = min(lo, float(np.nanmin(block))), max(hi, float(np.nanmax(block)))
            if outputs is not None:
                per_column += np.count_nonzero(block[:, :, None] == points, axis=0)
                counts = [int(np.count_nonzero(block == v)) for v in points]
                hits += np.array([*counts, block.size - sum(counts)])
    fractions = None
    if outputs is not None and hits.sum():
        fractions = dict(zip([*outputs, "other"], (hits / hits.sum()).tolist(), strict=True))
    log_equal = log_equal_values(per_column / moments.n) if outputs is not None and moments.n else -math.inf
    return FloatStatistics(moments.n, moments.mean.copy(), moments.std, lo if moments.n else None,
                           hi if moments.n else None, non_finite, outputs, fractions), log_equal


def _read_input_density(path: Path, handle: h5py.File) -> np.ndarray | None:
    if "stats" not in handle or "input_bit_density" not in handle["stats"]:
        return None
    try:
        return handle["stats"]["input_bit_density"][()].astype(np.float64)
    except (OSError, RuntimeError) as error:
        raise FormatError(path, f"dataset 'stats/input_bit_density' failed its Fletcher-32 checksum or could not "
                                f"be read ({short_error(error, 160)})") from None


def _read_data(path: Path, handle: h5py.File, metadata: ClientMetadata, mechanism: Any | None,
               report: FileReport, block_rows: int | None) -> None:
    """Read every dataset once, in row blocks, through the checksum filter; fill the report's statistics."""
    unprotected = unprotected_datasets(handle)
    report.flags.extend(checksum_problems(handle))  # the validator behind federate refuses the same
    for split in SPLITS:
        report.label_histograms[split] = _read_labels(path, handle, split, metadata.num_classes, block_rows)
        stated = metadata.label_histograms.get(split)
        if stated is not None and list(stated) != report.label_histograms[split]:
            report.flags.append(f"labels of split {split!r}: histogram {report.label_histograms[split]} differs "
                                f"from attribute 'label_histograms' {list(stated)}")
    if metadata.feature_format == PACKED_BITS:
        width = metadata.feature_width
        ones = {split: _count_packed(path, handle, split, metadata.stored_width, block_rows) for split in SPLITS}
        density = _read_input_density(path, handle)
        if density is not None and not np.all((density >= 0.0) & (density <= 1.0)):
            report.flags.append("dataset 'stats/input_bit_density' holds values outside [0, 1]")
            density = None
        if any(counts[width:].any() for counts in ones.values()):
            report.flags.append(f"padding bits after position {width} are set: rows are not np.packbits output")
        labels = mech.FixedPointEncoding(metadata.integer_bits, metadata.fraction_bits).position_labels()
        report.bits = bit_statistics(
            {s: counts[:width] for s, counts in ones.items()}, report.rows, features=metadata.features,
            bits_per_value=metadata.bits_per_value, position_labels=labels, mechanism=mechanism,
            input_density=density)
        for cls in report.bits.classes:
            report.flags.extend(cls.problems())
        total = sum(report.rows.values())
        if total:
            report.chance_pairs = chance_pairs(total, log_equal_bits((ones["train"] + ones["test"])[:width] / total))
    else:
        report.floats, log_equal = _float_statistics(path, handle, metadata.features, mechanism, block_rows)
        report.chance_pairs = chance_pairs(sum(report.rows.values()), log_equal)
        if report.floats.non_finite:
            report.flags.append(f"{report.floats.non_finite} feature values are NaN or infinite")
        other = (report.floats.output_fractions or {}).get("other")
        if other:
            report.flags.append(f"a share {other:.4g} of the values is none of the mechanism's outputs "
                                f"{list((report.floats.outputs or {}).values())}")
    report.checksums = "ok" if not unprotected else "unprotected"


def inspect_file(path: str | os.PathLike, *, manifest: ManifestCheck | None = None,
                 block_rows: int | None = None, recompute: bool = False) -> FileReport:
    """Inspect one client file; never raises for a bad file (the report carries the error).

    Parameters
    ----------
    path
        The client file.
    manifest
        The manifest check already made by the caller; by default the ``manifest.json`` next to the
        file is looked up and the file's entry, if any, checked.
    block_rows
        Rows per read (default: about 4 MiB of stored data, whole HDF5 chunks).
    recompute
        Recompute a DP-SGD part's guarantee with the exact accountant (dp-accounting's PLD) instead of checking
        the stored figure against a valid bracket (``ldpfl.contract.release_guarantee.check_stored``).
    """
    path = Path(path)
    report = FileReport(path)
    try:
        report.size_bytes = path.stat().st_size if path.is_file() else None
        report.manifest = manifest if manifest is not None else manifest_check_for_file(path)
        with open_client_file(path) as (handle, metadata, rows):
            report.metadata, report.rows = metadata, dict(rows)
            report.flags.extend(p for p in (name_index_problem(path.name, metadata),
                                            listed_index_problem(metadata, report.manifest.client_index)) if p)
            mechanism, problems = file_mechanism(metadata)
            report.flags.extend(problems)
            report.privacy, problems = privacy_summary(metadata, mechanism)
            report.flags.extend(problems)
            report.guarantee, report.guarantee_check, problems = guarantee_summary(handle, metadata, rows,
                                                                                    recompute=recompute)
            report.flags.extend(problems)
            _read_data(path, handle, metadata, mechanism, report, block_rows)
            report.released_statistics, problems = statistics_summary(handle, metadata)  # after the checksums
            report.flags.extend(problems)
            report.duplicates, problems = duplicate_summary(path, handle, metadata, report.chance_pairs)
            report.flags.extend(problems)
            report.flags.extend(clamped_problems(metadata, sum(rows.values())))
            if report.manifest.rows is not None and dict(report.manifest.rows) != report.rows:
                report.flags.append(f"rows {report.rows} differ from the manifest's {dict(report.manifest.rows)}")
    except FormatError as error:
        report.error, report.error_problem = str(error), error.problem
    except Exception as error:  # noqa: BLE001 - untrusted input must end in one line, never a traceback
        problem = f"unexpected {type(error).__name__} while reading ({short_error(error)})"
        report.error, report.error_problem = f"{path}: {problem}", problem
    return report


def clamped_problems(metadata: ClientMetadata, rows: int) -> list[str]:
    """Return what contradicts the attribute ``clamped_values`` (``ldpfl.contract.clamped``), if the file has one.

    A count past ``MAX_CLAMPED_SHARE`` (an export refuses it), one over other rows than the file's, and one in a
    shareable private file (an exact count of the clear records, which its guarantee does not cover).
    """
    clamped = metadata.clamped_values
    if clamped is None:
        return []
    problems = []
    if clamped.past_bound:
        problems.append(f"attribute 'clamped_values': column {clamped.worst_column} has {clamped.worst_count} of "
                        f"{clamped.rows} values clamped ({clamped.worst_share:.1%}), past the bound "
                        f"{MAX_CLAMPED_SHARE:.0%} (MAX_CLAMPED_SHARE) at which ldpfl export refuses a column")
    if clamped.rows != rows:
        problems.append(f"attribute 'clamped_values' counts {clamped.rows} rows, the file holds {rows}")
    if metadata.private and not metadata.local_only:
        problems.append("attribute 'clamped_values' is an exact count of the clear records, which the file's release "
                        "guarantee does not cover (ldpfl export writes it only where the values are not randomized)")
    return problems


def duplicate_summary(path: Path, handle: h5py.File, metadata: ClientMetadata,
                      pairs: float = 0.0) -> tuple[DuplicateCount, list[str]]:
    """Return the file's duplicated records (``ldpfl.contract.duplicates``) and the flag they raise, if any.

    Repeated records weigh more in training and in the pooled test figure, and test rows that repeat training
    rows score as seen. The count is flagged only beyond what ``pairs`` equal pairs of distinct records give by
    chance (``beyond_chance``); a ``label`` release repeats its one-hot rows by construction and is not flagged.
    """
    counts, _ = count_and_keep(file_digests(path, handle))
    if expected(metadata) or not beyond_chance(counts.total, pairs):
        return counts, []
    return counts, [f"{counts.describe()}, beyond the {pairs:.3g} equal pairs distinct records give by chance: "
                    "repeated records weigh more in training and in the pooled test figure (ldpfl gather --dedupe "
                    "drops them)"]


def guarantee_summary(handle: h5py.File, metadata: ClientMetadata, rows: Mapping[str, int], *,
                      recompute: bool = False) -> tuple[ReleaseGuarantee | None, GuaranteeCheck | None, list[str]]:
    """Return the file's release guarantee (stored, or computed for older files), its check, and what contradicts it.

    A stored guarantee may not claim less than the file's own parts give (the earlier releases of the same
    records, which only the manifest knows, can only add): ``check_stored`` checks it, against a valid bracket
    of the accountant's figure unless ``recompute``; every dataset and attribute of a shareable file must be in
    the inventory (``ldpfl.contract.inventory``).
    """
    problems = []
    if not metadata.local_only:
        problems += [f"{item} is not in the inventory of what a client file may release"
                     for item in inventory.unclassified(handle)]
    try:
        records = sum(rows.values())
        guarantee = stored_or_computed(metadata, records=records)
        diagnostic = "stats" in handle and "input_bit_density" in handle["stats"]
        check = check_stored(guarantee, metadata, records=records, diagnostic=diagnostic, recompute=recompute)
    except (KeyError, TypeError, ValueError) as error:
        return None, None, [f"attribute 'release_guarantee' or its inputs are malformed ({short_error(error)})"]
    return guarantee, check, problems + list(check.problems)


def manifest_check(file: FileCheck, *, has_manifest: bool = True) -> ManifestCheck:
    """Say what the manifest says about a checked file (its sha256 against the entry, if listed)."""
    if not has_manifest:
        return ManifestCheck("no manifest", f"no {MANIFEST_NAME} in {file.path.parent}")
    record = file.record
    if record is None:
        return ManifestCheck("not listed", f"not listed in {MANIFEST_NAME}")
    if not file.exists or file.sha256 is None:
        return ManifestCheck("error", "listed in the manifest but missing")
    if not file.sha256_matches:
        return ManifestCheck("mismatch", f"sha256 {file.sha256[:12]}... does not match the manifest's "
                                         f"{record.sha256[:12]}...")
    return ManifestCheck("ok", "sha256 matches the manifest", dict(record.rows), record.client_index)


def manifest_check_for_file(path: Path) -> ManifestCheck:
    """Look for ``manifest.json`` next to ``path`` and check the file's entry, if any."""
    if not (path.parent / MANIFEST_NAME).is_file():
        return ManifestCheck("no manifest", f"no {MANIFEST_NAME} in {path.parent}")
    try:
        manifest = read_manifest(path.parent)
    except FormatError as error:
        return ManifestCheck("error", str(error))
    record = next((r for r in manifest.files if r.path == path.name), None)
    if record is None:
        return ManifestCheck("not listed", f"not listed in {MANIFEST_NAME}")
    return manifest_check(check_client_file(path, record))
