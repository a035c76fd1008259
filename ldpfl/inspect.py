"""What a randomized HDF5 file (or a run directory of them) holds, and whether it is what it says.

``inspect_path(path)`` validates a client file or a run directory and returns an :class:`Inspection`:

* the schema and structure, through ``stage1_features.h5format.open_client_file`` (declared shapes,
  dtypes, links, external storage, virtual datasets and filters are checked before any data is read);
* the file's sha256 against ``manifest.json`` when one lists it;
* every data chunk, read through HDF5's Fletcher-32 filter in row blocks (a flipped data byte fails);
* the privacy report stored in the attributes against the report rebuilt from the mechanism's
  parameters (nominal and exact ε side by side);
* the labels against the stored label histograms;
* for packed-bit files, the density of 1s per class of bit positions (all, even, odd, and each digit
  of the fixed-point encoding), next to the range the mechanism can produce and, where
  ``/stats/input_bit_density`` is stored, the density it predicts;
* for float files, per-feature mean/std and, for PDPM, the share of each of its three outputs.

A density outside the mechanism's range by more than ``K_SE`` binomial standard errors means that the
bits are not what the attributes say. This module imports neither TensorFlow, torch nor matplotlib.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

import mechanisms as mech
from ldpfl.jsonsafe import json_ready
from mechanisms.randomness import RANDOMNESS_DESCRIPTIONS
from stage1_features.h5format import (
    FLOAT32,
    MANIFEST_NAME,
    PACKED_BITS,
    SPLITS,
    ClientMetadata,
    FileRecord,
    FormatError,
    compare_metadata,
    iter_feature_chunks,
    open_client_file,
    read_manifest,
    sha256_file,
)

K_SE = 5.0  # tolerance of every density check, in binomial standard errors
DENSITY_ATOL = 1e-6  # float32 rounding of a stored density
BLOCK_BYTES = 4 << 20  # bytes of stored feature data read per block
METRICS_PATH = Path("federation") / "metrics.json"
MAX_METRICS_BYTES = 64 << 20
INPUT_DENSITY_HINT = (
    "no unrandomized density stored: export with --store-input-density (stores a per-position aggregate "
    "of the unrandomized bits that the LDP guarantee does NOT cover), or compare against a "
    "--mechanism none export of the same client"
)

OK, FLAGGED, ERROR = "ok", "flagged", "error"
ENCODING_KEYS = ("integer_bits", "fraction_bits")
CLIENT_FILE_PATTERN = re.compile(r"client_(\d+)\.h5")


# ----------------------------------------------------------------------------------------------------
# Bit statistics: pure functions over arrays.

_LANE_MASK = np.uint64(0x0101010101010101)
_LANE_ROWS = 255  # a byte lane counts at most 255 ones before it would carry into its neighbour


def count_ones_per_position(packed: np.ndarray, width: int) -> np.ndarray:
    """Number of 1s at each of the first ``width`` bit positions, summed over the rows of ``packed``.

    ``packed`` is uint8 of shape (rows, bytes) as written by ``np.packbits`` (big-endian bit order).
    The rows are summed eight bytes at a time in uint64 lanes: for each bit k, ``(x >> k) & 0x01…01``
    leaves bit k of every byte in that byte's lowest bit, and up to 255 rows add without carries.

    Returns
    -------
    numpy.ndarray
        int64 counts of shape (width,).
    """
    packed = np.asarray(packed, dtype=np.uint8)
    rows, nbytes = packed.shape
    if width > nbytes * 8:
        raise ValueError(f"width {width} exceeds the {nbytes * 8} bits of a packed row")
    padded = -(-nbytes // 8) * 8
    if padded != nbytes:
        packed = np.concatenate([packed, np.zeros((rows, padded - nbytes), np.uint8)], axis=1)
    lanes = np.ascontiguousarray(packed).view(np.uint64)
    counts = np.zeros((8, padded), dtype=np.int64)  # counts[k, byte]: ones of bit k (0 = least significant)
    scratch = np.empty((min(rows, _LANE_ROWS), lanes.shape[1]), dtype=np.uint64)
    for start in range(0, rows, _LANE_ROWS):
        block = lanes[start:start + _LANE_ROWS]
        tmp = scratch[:len(block)]
        for k in range(8):
            np.right_shift(block, np.uint64(k), out=tmp)
            np.bitwise_and(tmp, _LANE_MASK, out=tmp)
            counts[k] += np.add.reduce(tmp, axis=0).view(np.uint8)
    # np.packbits puts position 8*b + j in bit 7 - j of byte b.
    return counts[::-1].T.reshape(-1)[:width]


def position_class_names(encoding_labels: Sequence[str]) -> list[str]:
    """The classes of bit positions reported: ``all``, ``even``, ``odd``, then each digit position."""
    return ["all", "even", "odd", *encoding_labels]


def reduce_per_class(values: np.ndarray, bits_per_value: int, *, how: str = "sum") -> np.ndarray:
    """Sum (or mean) a per-position array of shape (r*l,) over each class of :func:`position_class_names`.

    Positions are counted from 0 over the merged r*l bits; digit j of every value is position f*l + j.
    """
    values = np.asarray(values, dtype=np.float64)
    reduce = np.sum if how == "sum" else np.mean
    digits = values.reshape(-1, bits_per_value)
    return np.array([reduce(values), reduce(values[0::2]), reduce(values[1::2]), *reduce(digits, axis=0)])


def class_position_counts(features: int, bits_per_value: int) -> np.ndarray:
    """Positions per class of :func:`position_class_names`."""
    width = features * bits_per_value
    return np.array([width, (width + 1) // 2, width // 2, *([features] * bits_per_value)], dtype=np.int64)


def binomial_se(p: float, n: int) -> float:
    """Standard error of a density estimated from ``n`` bits of mean ``p`` (conservative for mixed p)."""
    return math.sqrt(max(p * (1.0 - p), 0.0) / n) if n else math.inf


@dataclass(frozen=True)
class ClassDensity:
    """Density of 1s of one class of bit positions per split, with what the mechanism allows and predicts.

    ``low``/``high`` average the per-position bounds min/max(P(1|0), P(1|1)); ``predicted`` averages
    ``mechanism.expected_density(input_density)`` and describes the train split, the rows that
    ``/stats/input_bit_density`` is computed over. Each is ``None`` when unknown, as is the density of
    a split without rows.
    """

    name: str
    positions: int
    rows: Mapping[str, int]
    observed: Mapping[str, float | None]
    low: float | None = None
    high: float | None = None
    predicted: float | None = None
    deterministic: bool = False  # mechanism none: the train density must equal the prediction

    def bits(self, split: str) -> int:
        """Bits behind the density of ``split``: positions x rows."""
        return self.positions * self.rows.get(split, 0)

    @property
    def deviation_se(self) -> float | None:
        """(observed - predicted) on the train split, in binomial standard errors of the prediction."""
        observed = self.observed.get("train")
        if observed is None or self.predicted is None:
            return None
        se = binomial_se(self.predicted, self.bits("train"))
        diff = observed - self.predicted
        if self.deterministic or se == 0.0:  # only the float32 rounding of the stored density is allowed
            return 0.0 if abs(diff) <= DENSITY_ATOL else math.copysign(math.inf, diff)
        return diff / se

    def problems(self) -> list[str]:
        """Why this class contradicts the attributes (empty when it does not)."""
        out = []
        for split, observed in self.observed.items():
            if observed is None or self.low is None or self.high is None:
                continue
            bound = self.low if observed < self.low else self.high if observed > self.high else None
            n = self.bits(split)
            if bound is not None and abs(observed - bound) > K_SE * binomial_se(bound, n) + DENSITY_ATOL:
                out.append(f"class {self.name!r} ({split}): observed density {observed:.4g} lies outside the range "
                           f"[{self.low:.4g}, {self.high:.4g}] the mechanism can produce (by more than {K_SE:g} SE "
                           f"over {n} bits): the bits are not what the attributes say")
        z = self.deviation_se
        if z is not None and abs(z) > K_SE:
            out.append(f"class {self.name!r} (train): observed density {self.observed['train']:.4g} differs from "
                       f"the {self.predicted:.4g} predicted from /stats/input_bit_density by {z:+.1f} SE")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "positions": self.positions, "rows": dict(self.rows),
                "observed": dict(self.observed), "low": self.low, "high": self.high, "predicted": self.predicted,
                "deterministic": self.deterministic, "deviation_se": self.deviation_se,
                "flagged": bool(self.problems())}


@dataclass(frozen=True)
class BitStatistics:
    """Density of 1s of a packed-bit file, per split and per class of bit positions."""

    rows: Mapping[str, int]
    features: int
    bits_per_value: int
    position_labels: tuple[str, ...]
    ones: Mapping[str, np.ndarray]  # split -> int64 (r*l,): 1s per position
    classes: tuple[ClassDensity, ...]
    input_density_stored: bool
    notes: tuple[str, ...] = ()

    @property
    def total_rows(self) -> int:
        return int(sum(self.rows.values()))

    @property
    def total_ones(self) -> np.ndarray:
        """1s per position over every split, shape (r*l,)."""
        return np.sum(list(self.ones.values()), axis=0, dtype=np.int64)

    @property
    def position_density(self) -> np.ndarray:
        """Observed density per position over every split, shape (r, l) (NaN without rows)."""
        rows = self.total_rows
        density = self.total_ones / rows if rows else np.full(self.features * self.bits_per_value, np.nan)
        return density.reshape(self.features, self.bits_per_value)

    def to_dict(self) -> dict[str, Any]:
        return {"rows": dict(self.rows), "features": self.features, "bits_per_value": self.bits_per_value,
                "position_labels": list(self.position_labels), "input_density_stored": self.input_density_stored,
                "classes": [c.to_dict() for c in self.classes], "notes": list(self.notes)}


def bit_statistics(ones: Mapping[str, np.ndarray], rows: Mapping[str, int], *, features: int, bits_per_value: int,
                   position_labels: Sequence[str], mechanism: Any | None, mechanism_name: str,
                   input_density: np.ndarray | None) -> BitStatistics:
    """Per-class densities from per-position counts of 1s (one count array per split).

    The range and the prediction come from ``mechanism.expected_density`` (for ``none``, the identity);
    ``mechanism`` is ``None`` when the attributes do not describe a usable bit mechanism.
    """
    width = features * bits_per_value
    n_pos = class_position_counts(features, bits_per_value)
    names = position_class_names(position_labels)
    observed = {split: reduce_per_class(ones[split], bits_per_value) / (n_pos * rows[split]) if rows[split] else None
                for split in ones}
    low = high = predicted = None
    notes: list[str] = []
    if mechanism_name == "none":
        low, high = np.zeros(len(names)), np.ones(len(names))
        if input_density is not None:
            predicted = reduce_per_class(input_density, bits_per_value, how="mean")
    elif mechanism is not None and hasattr(mechanism, "expected_density"):
        p10 = mechanism.expected_density(np.zeros(width))
        p11 = mechanism.expected_density(np.ones(width))
        low = reduce_per_class(np.minimum(p10, p11), bits_per_value, how="mean")
        high = reduce_per_class(np.maximum(p10, p11), bits_per_value, how="mean")
        if input_density is not None:
            predicted = reduce_per_class(mechanism.expected_density(input_density), bits_per_value, how="mean")
    else:
        notes.append("no range or prediction: the attributes do not describe a usable bit mechanism")
    if input_density is None:
        notes.append(INPUT_DENSITY_HINT)

    def pick(values: np.ndarray | None, i: int) -> float | None:
        return None if values is None else float(values[i])

    classes = tuple(
        ClassDensity(name, int(n_pos[i]), dict(rows), {s: pick(d, i) for s, d in observed.items()},
                     pick(low, i), pick(high, i), pick(predicted, i), deterministic=mechanism_name == "none")
        for i, name in enumerate(names)
    )
    return BitStatistics(dict(rows), features, bits_per_value, tuple(position_labels),
                         {s: np.asarray(a, np.int64) for s, a in ones.items()}, classes, input_density is not None,
                         tuple(notes))


# ----------------------------------------------------------------------------------------------------
# Float statistics.


@dataclass(frozen=True)
class FloatStatistics:
    """Per-feature mean and std of a float32 file over all its rows (train and test)."""

    rows: int
    mean: np.ndarray  # (r,)
    std: np.ndarray  # (r,)
    minimum: float | None
    maximum: float | None
    non_finite: int
    outputs: Mapping[str, float] | None = None  # PDPM: its three output values (high, low, centre)
    output_fractions: Mapping[str, float] | None = None  # share of each output, plus "other"

    def to_dict(self) -> dict[str, Any]:
        def summary(a: np.ndarray) -> dict[str, float | None]:
            if not a.size or not np.isfinite(a).any():
                return {"min": None, "median": None, "max": None}
            return {"min": float(np.nanmin(a)), "median": float(np.nanmedian(a)), "max": float(np.nanmax(a))}

        return {"rows": self.rows, "features": int(self.mean.size), "mean_per_feature": summary(self.mean),
                "std_per_feature": summary(self.std), "minimum": self.minimum, "maximum": self.maximum,
                "non_finite_values": self.non_finite, "outputs": None if self.outputs is None else dict(self.outputs),
                "output_fractions": None if self.output_fractions is None else dict(self.output_fractions)}


class _MomentAccumulator:
    """Streaming per-column count, mean and M2 (Chan et al. pairwise update), in float64."""

    def __init__(self, width: int):
        self.n = 0
        self.mean = np.zeros(width)
        self.m2 = np.zeros(width)

    def add(self, block: np.ndarray) -> None:
        block = block.astype(np.float64)
        n_b = block.shape[0]
        if not n_b:
            return
        mean_b = block.mean(axis=0)
        m2_b = ((block - mean_b) ** 2).sum(axis=0)
        total = self.n + n_b
        delta = mean_b - self.mean
        self.mean += delta * (n_b / total)
        self.m2 += m2_b + delta**2 * (self.n * n_b / total)
        self.n = total

    @property
    def std(self) -> np.ndarray:
        return np.sqrt(self.m2 / self.n) if self.n else np.full(self.mean.shape, np.nan)


# ----------------------------------------------------------------------------------------------------
# Privacy report: stored vs rebuilt.


@dataclass(frozen=True)
class PrivacySummary:
    """The stored privacy report, condensed, and whether the mechanism's parameters reproduce it."""

    mechanism: str
    private: bool
    nominal_epsilon: float | None
    exact_epsilon_per_coordinate: float | None
    exact_epsilon_per_record: float | None
    coordinate: str
    record: str
    probabilities: Mapping[str, Any]
    randomness: str
    recomputed: Mapping[str, float | None] | None  # None: the mechanism could not be rebuilt
    agrees: bool | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {
            "randomness_description": RANDOMNESS_DESCRIPTIONS.get(self.randomness, "unspecified")}


_EPS_KEYS = ("nominal_epsilon", "exact_epsilon_per_coordinate", "exact_epsilon_per_record")


def _as_float(value: Any) -> float | None:
    if value is None:
        return None
    if value == "inf":
        return math.inf
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def rebuild_mechanism(metadata: ClientMetadata) -> tuple[Any | None, list[str]]:
    """Build the mechanism the attributes name; return it with the contradictions found (if any).

    ``mechanism_parameters`` holds the mechanism's own parameters, plus the encoding's ``integer_bits``
    and ``fraction_bits`` when the mechanism does not take them (``none`` over packed bits); those two
    must then equal the file's m and n.
    """
    params = dict(metadata.mechanism_parameters)
    problems = []
    try:
        accepted = {f.name for f in dataclasses.fields(mech.mechanism_class(metadata.mechanism))}
        for key in ENCODING_KEYS:
            if key in params and key not in accepted and params.pop(key) != getattr(metadata, key):
                problems.append(f"mechanism parameter {key} = {metadata.mechanism_parameters[key]!r} differs from "
                                f"the file's {key} = {getattr(metadata, key)}")
        mechanism = mech.create_mechanism(metadata.mechanism, **params)
    except (ValueError, TypeError) as error:
        return None, [f"attributes 'mechanism'/'mechanism_parameters' do not build a mechanism ({error})"]
    domain = mechanism.DOMAIN
    if domain == "bits" and metadata.feature_format != PACKED_BITS:
        problems.append(f"bit mechanism {metadata.mechanism!r} with feature_format {metadata.feature_format!r}")
    elif domain == "real" and metadata.feature_format != FLOAT32:
        problems.append(f"real mechanism {metadata.mechanism!r} with feature_format {metadata.feature_format!r}")
    if domain == "bits":
        stated = (metadata.integer_bits, metadata.fraction_bits, metadata.features)
        built = (mechanism.integer_bits, mechanism.fraction_bits, mechanism.features)
        if stated != built:
            problems.append(f"mechanism parameters (m, n, r) = {built} differ from the file's {stated}")
            mechanism = None
    elif getattr(mechanism, "dim", None) not in (None, metadata.features):
        problems.append(f"mechanism parameter dim = {mechanism.dim} differs from features = {metadata.features}")
    return mechanism, problems


def privacy_summary(metadata: ClientMetadata, mechanism: Any | None) -> tuple[PrivacySummary, list[str]]:
    """Condense the stored report and compare its ε values with the report rebuilt from the parameters."""
    stored = metadata.privacy_report
    values = {k: _as_float(stored.get(k)) for k in _EPS_KEYS}
    recomputed = None
    problems = []
    if mechanism is not None:
        fresh = mechanism.report()
        recomputed = {k: _as_float(getattr(fresh, k)) for k in _EPS_KEYS}
        for key in _EPS_KEYS:
            if not _same(values[key], recomputed[key]):
                problems.append(f"privacy report: stored {key} = {values[key]} but the mechanism's parameters give "
                                f"{recomputed[key]}")
    summary = PrivacySummary(
        mechanism=metadata.mechanism, private=metadata.private, **values,
        coordinate=str(stored.get("coordinate", "coordinate")), record=str(stored.get("record", "record")),
        probabilities=stored.get("probabilities") if isinstance(stored.get("probabilities"), Mapping) else {},
        randomness=metadata.randomness, recomputed=recomputed,
        agrees=None if recomputed is None else not problems,
    )
    return summary, problems


# ----------------------------------------------------------------------------------------------------
# One file.


@dataclass(frozen=True)
class ManifestCheck:
    """What the manifest says about a file: ``ok``, ``mismatch``, ``not listed``, ``no manifest`` or ``error``."""

    status: str
    message: str
    rows: Mapping[str, int] | None = None  # rows per split that the manifest lists
    client_index: int | None = None  # the client that the manifest says this file is

    @property
    def failed(self) -> bool:
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
    bits: BitStatistics | None = None
    floats: FloatStatistics | None = None
    flags: list[str] = field(default_factory=list)
    error: str | None = None  # "PATH: problem", one line
    error_problem: str | None = None  # the problem alone

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def status(self) -> str:
        if self.error:
            return ERROR
        return FLAGGED if self.flags or self.manifest.failed else OK

    def to_dict(self) -> dict[str, Any]:
        meta = None
        if self.metadata is not None:
            meta = dataclasses.asdict(self.metadata) | {
                "bits_per_value": self.metadata.bits_per_value, "feature_width": self.metadata.feature_width,
                "stored_width": self.metadata.stored_width, "private": self.metadata.private}
        return json_ready({
            "file": self.name, "path": str(self.path), "bytes": self.size_bytes, "status": self.status,
            "error": self.error, "flags": list(self.flags),
            "manifest": dataclasses.asdict(self.manifest), "checksums": self.checksums, "metadata": meta,
            "rows": dict(self.rows), "label_histograms": dict(self.label_histograms),
            "privacy": None if self.privacy is None else self.privacy.to_dict(),
            "bit_statistics": None if self.bits is None else self.bits.to_dict(),
            "float_statistics": None if self.floats is None else self.floats.to_dict(),
        })

    def format_text(self) -> str:
        """The detail section of this file."""
        return "\n".join(_file_lines(self))


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
                                    f"checksum or could not be read ({' '.join(str(error).split())[:160]})") from None
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
                      block_rows: int | None) -> FloatStatistics:
    """Per-feature moments over every split and, for PDPM, the share of each of its outputs."""
    moments = _MomentAccumulator(features)
    lo, hi, non_finite = math.inf, -math.inf, 0
    outputs = None
    if hasattr(mechanism, "output_values"):
        outputs = dict(zip(("high", "low", "centre"), (float(v) for v in mechanism.output_values()), strict=True))
    hits = np.zeros(len(outputs or ()) + 1, dtype=np.int64)  # each output, then "other"
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
                counts = [int(np.count_nonzero(block == np.float32(v))) for v in outputs.values()]
                hits += np.array([*counts, block.size - sum(counts)])
    fractions = None
    if outputs is not None and hits.sum():
        fractions = dict(zip([*outputs, "other"], (hits / hits.sum()).tolist(), strict=True))
    return FloatStatistics(moments.n, moments.mean.copy(), moments.std, lo if moments.n else None,
                           hi if moments.n else None, non_finite, outputs, fractions)


def _read_input_density(path: Path, handle: h5py.File) -> np.ndarray | None:
    if "stats" not in handle or "input_bit_density" not in handle["stats"]:
        return None
    try:
        return handle["stats"]["input_bit_density"][()].astype(np.float64)
    except (OSError, RuntimeError) as error:
        raise FormatError(path, f"dataset 'stats/input_bit_density' failed its Fletcher-32 checksum or could not "
                                f"be read ({' '.join(str(error).split())[:160]})") from None


def _read_data(path: Path, handle: h5py.File, metadata: ClientMetadata, mechanism: Any | None,
               report: FileReport, block_rows: int | None) -> None:
    """Read every dataset once, in row blocks, through the checksum filter; fill the report's statistics."""
    datasets = [f"{s}/{n}" for s in SPLITS for n in ("labels", "features")]
    if "stats" in handle:
        datasets += [f"stats/{n}" for n in handle["stats"]]
    unprotected = [name for name in datasets if not handle[name].fletcher32]
    if unprotected:
        report.flags.append(f"datasets {unprotected} carry no Fletcher-32 checksum: their data cannot be verified")
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
            mechanism_name=metadata.mechanism, input_density=density)
        for cls in report.bits.classes:
            report.flags.extend(cls.problems())
    else:
        report.floats = _float_statistics(path, handle, metadata.features, mechanism, block_rows)
        if report.floats.non_finite:
            report.flags.append(f"{report.floats.non_finite} feature values are NaN or infinite")
        other = (report.floats.output_fractions or {}).get("other")
        if other:
            report.flags.append(f"a share {other:.4g} of the values is none of the mechanism's outputs "
                                f"{list(report.floats.outputs.values())}")
    report.checksums = "ok" if not unprotected else "unprotected"


def inspect_file(path: str | os.PathLike, *, manifest: ManifestCheck | None = None,
                 block_rows: int | None = None) -> FileReport:
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
    """
    path = Path(path)
    report = FileReport(path)
    try:
        report.size_bytes = path.stat().st_size if path.is_file() else None
        report.manifest = manifest if manifest is not None else manifest_check_for_file(path)
        with open_client_file(path) as (handle, metadata, rows):
            report.metadata, report.rows = metadata, dict(rows)
            report.flags.extend(_identity_problems(path, metadata, report.manifest))
            mechanism, problems = rebuild_mechanism(metadata)
            report.flags.extend(problems)
            report.privacy, problems = privacy_summary(metadata, mechanism)
            report.flags.extend(problems)
            _read_data(path, handle, metadata, mechanism, report, block_rows)
            if report.manifest.rows is not None and dict(report.manifest.rows) != report.rows:
                report.flags.append(f"rows {report.rows} differ from the manifest's {dict(report.manifest.rows)}")
    except FormatError as error:
        report.error, report.error_problem = str(error), error.problem
    except Exception as error:  # noqa: BLE001 - untrusted input must end in one line, never a traceback
        problem = f"unexpected {type(error).__name__} while reading ({' '.join(str(error).split())[:200]})"
        report.error, report.error_problem = f"{path}: {problem}", problem
    return report


def _identity_problems(path: Path, metadata: ClientMetadata, manifest: ManifestCheck) -> list[str]:
    """JSON attributes that are not objects (an error); a client index that the name or manifest contradicts."""
    for name in ("partition", "mechanism_parameters", "privacy_report", "label_histograms"):
        if not isinstance(getattr(metadata, name), Mapping):
            raise FormatError(path, f"attribute {name!r} is not a JSON object")
    problems = []
    match = CLIENT_FILE_PATTERN.fullmatch(path.name)
    if match and int(match.group(1)) != metadata.client_index:
        problems.append(f"attribute 'client_index' is {metadata.client_index} but the file is named {path.name}")
    if manifest.client_index is not None and manifest.client_index != metadata.client_index:
        problems.append(f"attribute 'client_index' is {metadata.client_index} but the manifest lists this file as "
                        f"client {manifest.client_index}")
    return problems


def manifest_check(path: Path, record: FileRecord | None, *, has_manifest: bool = True) -> ManifestCheck:
    """Compare a file with its manifest entry (sha256 and size); ``record`` None means not listed."""
    if not has_manifest:
        return ManifestCheck("no manifest", f"no {MANIFEST_NAME} in {path.parent}")
    if record is None:
        return ManifestCheck("not listed", f"not listed in {MANIFEST_NAME}")
    if not path.is_file():
        return ManifestCheck("error", "listed in the manifest but missing")
    digest = sha256_file(path)
    if digest != record.sha256:
        return ManifestCheck("mismatch", f"sha256 {digest[:12]}... does not match the manifest's "
                                         f"{record.sha256[:12]}...")
    return ManifestCheck("ok", "sha256 matches the manifest", dict(record.rows), record.client_index)


def manifest_check_for_file(path: Path) -> ManifestCheck:
    """Look for ``manifest.json`` next to ``path`` and check the file's entry, if any."""
    if not (path.parent / MANIFEST_NAME).is_file():
        return manifest_check(path, None, has_manifest=False)
    try:
        manifest = read_manifest(path.parent)
    except FormatError as error:
        return ManifestCheck("error", str(error))
    record = next((r for r in manifest.files if r.path == path.name), None)
    return manifest_check(path, record)


# ----------------------------------------------------------------------------------------------------
# A run directory, and the result type.


@dataclass(frozen=True)
class FederationSummary:
    """What ``federation/metrics.json`` says, if it is present and readable."""

    rounds: tuple[int, ...]
    test_accuracy: tuple[float | None, ...]
    problem: str | None = None

    @property
    def final_accuracy(self) -> float | None:
        return self.test_accuracy[-1] if self.test_accuracy else None

    def to_dict(self) -> dict[str, Any]:
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
        numbers = [(int(r.get("round", i + 1)), _as_float(r.get("test_accuracy"))) for i, r in enumerate(rounds)]
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
        return not self.problems and all(f.status == OK for f in self.files)

    @property
    def exit_code(self) -> int:
        """0 when everything checked out, 1 when a file failed or something was flagged."""
        return 0 if self.ok else 1

    def error_lines(self) -> list[str]:
        """One line per file that could not be validated ("PATH: problem")."""
        return [f.error for f in self.files if f.error]

    def to_dict(self) -> dict[str, Any]:
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
        lines = _run_lines(self)
        if details:
            for report in self.files:
                lines += ["", *_file_lines(report)]
        return "\n".join(lines)


def inspect_path(path: str | os.PathLike, *, block_rows: int | None = None) -> Inspection:
    """Inspect a client file or a run directory (see the module docstring for every check)."""
    path = Path(path)
    if path.is_dir():
        return inspect_run(path, block_rows=block_rows)
    return Inspection(path, "file", [inspect_file(path, block_rows=block_rows)])


def inspect_run(run_dir: str | os.PathLike, *, block_rows: int | None = None) -> Inspection:
    """Inspect every client file of a run directory (those the manifest lists and any other ``*.h5``)."""
    run_dir = Path(run_dir)
    result = Inspection(run_dir, "run", [])
    records: dict[str, FileRecord] = {}
    has_manifest = (run_dir / MANIFEST_NAME).is_file()
    if has_manifest:
        try:
            manifest = read_manifest(run_dir)
            result.manifest = dict(manifest.info) | {"files_listed": len(manifest.files)}
            records = {r.path: r for r in manifest.files}
        except FormatError as error:
            result.problems.append(str(error))
            has_manifest = False
    else:
        result.notes.append(f"no {MANIFEST_NAME}: file hashes cannot be checked")
    names = list(records) + sorted(p.name for p in run_dir.glob("*.h5")
                                   if not p.name.startswith(".") and p.name not in records)
    if not names:
        raise FormatError(run_dir, "no client files (*.h5) and no manifest listing any: not an ldpfl run directory")
    for name in names:
        record = records.get(name)
        check = manifest_check(run_dir / name, record, has_manifest=has_manifest)
        report = inspect_file(run_dir / name, manifest=check, block_rows=block_rows)
        if has_manifest and record is None:
            report.flags.append(f"not listed in {MANIFEST_NAME}")
        result.files.append(report)
    valid = [(f.name, f.metadata) for f in result.files if f.metadata is not None]
    result.problems.extend(compare_metadata(valid))
    indices = [m.client_index for _, m in valid]
    duplicates = sorted({i for i in indices if indices.count(i) > 1})
    if duplicates:
        result.problems.append(f"client indices {duplicates} appear in more than one file")
    if valid:
        expected = valid[0][1].client_count
        if len(set(indices)) < expected:
            result.notes.append(f"{len(set(indices))} of {expected} clients present")
    result.federation = read_federation_metrics(run_dir)
    if result.federation is not None and result.federation.problem:
        result.notes.append(result.federation.problem)
    return result


# ----------------------------------------------------------------------------------------------------
# Text.


def _fmt(x: float | None, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if math.isinf(x):
        return "inf"
    return f"{x:.{digits}g}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    out = []
    for row in [header, *rows]:
        cells = [str(c).ljust(w) for c, w in zip(row, widths, strict=True)]
        out.append(indent + "  ".join(cells).rstrip())
    return out


def _compact_histogram(hist: Sequence[int] | None) -> str:
    if not hist:
        return "-"
    if len(hist) <= 12:
        return "/".join(str(h) for h in hist)
    nonzero = sum(1 for h in hist if h)
    return f"{nonzero}/{len(hist)} classes, {min(hist)}..{max(hist)} per class"


def _file_lines(report: FileReport) -> list[str]:
    size = f"{report.size_bytes / 1024:.1f} KiB" if report.size_bytes is not None else "missing"
    lines = [f"{report.name}  ({report.path}, {size})"]
    if report.error:
        return [*lines, f"  status      ERROR: {report.error_problem}"]
    meta = report.metadata
    assert meta is not None
    lines.append(f"  status      {report.status}" + ("" if report.status == OK else f" ({len(report.flags)} flags)"))
    checks = ["schema ok", f"manifest: {report.manifest.message}",
              "HDF5 checksums ok (every chunk read)" if report.checksums == "ok" else f"checksums {report.checksums}"]
    lines.append("  checks      " + "; ".join(checks))
    params = ", ".join(f"{k}={v}" for k, v in meta.mechanism_parameters.items()) or "-"
    unit = f"{meta.stored_width} bytes per row" if meta.feature_format == PACKED_BITS else f"{meta.features} per row"
    encoding = f"  encoding    none: r={meta.features} float32 values per row"
    if meta.feature_format == PACKED_BITS:
        encoding = (f"  encoding    m={meta.integer_bits}, n={meta.fraction_bits}, l={meta.bits_per_value} bits per "
                    f"value, r={meta.features} features, r*l={meta.features * meta.bits_per_value} bits")
    lines += [
        "metadata",
        f"  dataset     {meta.dataset} ({meta.num_classes} classes)",
        f"  client      {meta.client_index} of {meta.client_count}",
        f"  partition   {json.dumps(meta.partition, sort_keys=True, default=str)}",
        f"  extractor   {meta.extractor}, input shape {'x'.join(str(s) for s in meta.input_shape)}",
        encoding,
        f"  features    {meta.feature_format} ({unit})",
        f"  mechanism   {meta.mechanism} ({params})",
        f"  randomness  {meta.randomness}: {RANDOMNESS_DESCRIPTIONS.get(meta.randomness, 'unspecified')}",
        f"  local acc   {_fmt(meta.local_accuracy)}",
        f"  written     {meta.created_utc} by ldpfl {meta.package_version}, schema v{meta.schema_version}",
    ]
    p = report.privacy
    if p is not None:
        lines.append("privacy" + ("" if p.private else "   NOT PRIVATE"))
        lines.append(f"  nominal eps {_fmt(p.nominal_epsilon)}   |   exact eps {_fmt(p.exact_epsilon_per_record, 6)} "
                     f"per {p.record}   |   exact eps {_fmt(p.exact_epsilon_per_coordinate, 6)} per {p.coordinate}")
        if p.recomputed is None:
            lines.append("  rebuilt     the mechanism could not be rebuilt from its parameters")
        else:
            lines.append("  rebuilt     " + ("the mechanism's parameters reproduce these values" if p.agrees
                                             else "MISMATCH with the report rebuilt from the parameters"))
        for name, probs in p.probabilities.items():
            if isinstance(probs, Mapping) and "p_one_given_one" in probs:
                lines.append(f"  {name:<11} {probs.get('positions', '?')} positions, P(1|1) "
                             f"{_fmt(_as_float(probs.get('p_one_given_one')), 6)}, P(1|0) "
                             f"{_fmt(_as_float(probs.get('p_one_given_zero')), 6)}, exact eps per bit "
                             f"{_fmt(_as_float(probs.get('exact_epsilon_per_bit')), 6)}")
            else:
                lines.append(f"  {name:<11} {json.dumps(probs, default=str)}")
    lines.append("rows and labels")
    lines += _table(["split", "rows", "label histogram"],
                    [[s, str(report.rows.get(s, 0)), " ".join(str(h) for h in report.label_histograms.get(s, []))]
                     for s in SPLITS])
    if report.bits is not None:
        b = report.bits
        lines.append(f"bit statistics  (density of 1s per class of positions; train {b.rows.get('train', 0)} rows, "
                     f"test {b.rows.get('test', 0)} rows; the prediction describes train)")
        rows = []
        for c in b.classes:
            z = c.deviation_se
            rng = "-" if c.low is None else f"[{_fmt(c.low)}, {_fmt(c.high)}]"
            rows.append([c.name, str(c.positions), _fmt(c.observed.get("train")), _fmt(c.predicted),
                         "-" if z is None else f"{z:+.1f}".replace("-0.0", "+0.0"), _fmt(c.observed.get("test")), rng,
                         "!" if c.problems() else ""])
        lines += _table(["class", "positions", "train", "predicted", "dev/SE", "test", "mechanism range", ""], rows)
        lines += [f"  note: {n}" for n in b.notes]
    if report.floats is not None:
        f = report.floats.to_dict()
        lines.append(f"float statistics  (over all {f['rows']} rows, train and test)")
        for key in ("mean_per_feature", "std_per_feature"):
            s = f[key]
            lines.append(f"  {key.replace('_', ' '):<17} min {_fmt(s['min'])}, median {_fmt(s['median'])}, "
                         f"max {_fmt(s['max'])}")
        lines.append(f"  values            min {_fmt(f['minimum'])}, max {_fmt(f['maximum'])}, "
                     f"non-finite {f['non_finite_values']}")
        if f["output_fractions"]:
            shares = ", ".join(f"{k} ({_fmt(f['outputs'][k], 6)}) {v:.4f}" if k in f["outputs"] else f"{k} {v:.4f}"
                               for k, v in f["output_fractions"].items())
            lines.append(f"  output shares     {shares}")
    if report.flags:
        lines.append("flags")
        lines += [f"  ! {flag}" for flag in report.flags]
    return lines


def _run_lines(result: Inspection) -> list[str]:
    n_bad = sum(f.status != OK for f in result.files)
    lines = [f"run {result.path}  ({len(result.files)} client files, {n_bad} not ok)"]
    if result.manifest is not None:
        lines.append(f"  manifest  {result.manifest.get('files_listed')} files listed, updated "
                     f"{result.manifest.get('updated_utc', '?')}")
    rows = []
    for f in result.files:
        m, p = f.metadata, f.privacy
        sha = {"ok": "ok", "mismatch": "BAD", "error": "BAD"}.get(f.manifest.status, "-")
        if f.error:
            status = f"ERROR: {f.error_problem}"
        else:
            status = f.status if f.status == OK else f"FLAGGED: {f.flags[0] if f.flags else f.manifest.message}"
        rows.append([
            "?" if m is None else str(m.client_index), f.name, str(f.rows.get("train", "-")),
            str(f.rows.get("test", "-")), _compact_histogram(f.label_histograms.get("train")),
            "-" if m is None else m.mechanism, _fmt(None if p is None else p.nominal_epsilon),
            _fmt(None if p is None else p.exact_epsilon_per_record, 6),
            _fmt(None if m is None else m.local_accuracy, 3), sha, status])
    lines += _table(["client", "file", "train", "test", "train labels", "mechanism", "nominal eps",
                     "exact eps/record", "local acc", "sha", "status"], rows)
    flagged = [(f.name, flag) for f in result.files if not f.error for flag in f.flags[1:]]
    if flagged:
        lines.append("more flags")
        lines += [f"  ! {name}: {flag}" for name, flag in flagged]
    if result.problems:
        lines.append("run problems")
        lines += [f"  ! {p}" for p in result.problems]
    elif len([f for f in result.files if f.metadata]) > 1:
        lines.append("  consistency  all readable clients agree on dataset, extractor, encoding, format and mechanism")
    if result.federation is not None and not result.federation.problem:
        fed = result.federation.to_dict()
        lines.append(f"  federation  {fed['rounds']} rounds, final test accuracy {_fmt(fed['final_test_accuracy'])}, "
                     f"best {_fmt(fed['best_test_accuracy'])}")
    lines += [f"  note: {n}" for n in result.notes]
    return lines
