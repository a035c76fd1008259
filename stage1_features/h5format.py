"""The one owner of the randomized-feature file format: writing, reading and validating it.

A run directory holds one HDF5 file per client (``client_000.h5`` …) and ``manifest.json``. Each file:

    /train/features   uint8 (rows, ceil(r*l/8)) packed bits  — or float32 (rows, r) for real mechanisms
    /train/labels     int32 (rows,)
    /test/features    same layout as train
    /test/labels
    /stats/input_bit_density   optional float32 (r*l,): density of 1s of the *unrandomized* encoding
                               (only with --store-input-density; an aggregate NOT covered by the LDP report)

Datasets are chunked by rows (about 1 MiB) with the Fletcher-32 checksum filter, and the file uses the
latest HDF5 format so its metadata carries checksums too. The attributes on ``/`` make a file
self-describing (see ``ClientMetadata``); no seed is ever stored. Files are written to a temporary name
in the same directory and renamed when complete, so a half-written file never carries a final name.

Readers check the structure against limits *before* reading any data: expected objects only, hard
links only, no external storage or virtual datasets, no filter but Fletcher-32, declared shapes within
limits. Any failure raises ``FormatError`` naming the file and the problem. This module imports neither
TensorFlow nor torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import h5py
import numpy as np

SCHEMA = "ldpfl-features"
SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"
MANIFEST_SCHEMA = "ldpfl-manifest"
SPLITS = ("train", "test")
PACKED_BITS = "packed-bits"
FLOAT32 = "float32"
FEATURE_FORMATS = (PACKED_BITS, FLOAT32)

MAX_ROWS = 50_000_000
MAX_FEATURE_WIDTH = 10_000_000
MAX_SPLIT_BYTES = 64 * 2**30
CHUNK_BYTES = 1 << 20
KNOWN_FILTERS = {h5py.h5z.FILTER_FLETCHER32: "fletcher32"}
ALLOWED_GROUPS = {"train", "test", "stats"}


class FormatError(ValueError):
    """A file or run directory that does not match the schema; the message names the file."""

    def __init__(self, path: str | os.PathLike, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{path}: {problem}")


def client_file_name(index: int) -> str:
    return f"client_{index:03d}.h5"


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class ClientMetadata:
    """Everything the root attributes of a client file say. ``None`` stands for "not recorded"."""

    dataset: str
    num_classes: int
    client_index: int
    client_count: int
    partition: Mapping[str, Any]
    extractor: str
    input_shape: tuple[int, ...]
    integer_bits: int
    fraction_bits: int
    features: int
    feature_format: str
    mechanism: str
    mechanism_parameters: Mapping[str, Any]
    privacy_report: Mapping[str, Any]
    randomness: str
    label_histograms: Mapping[str, list[int]]
    local_accuracy: float | None = None
    package_version: str = "unknown"
    created_utc: str = field(default_factory=utc_now)
    schema_version: int = SCHEMA_VERSION

    @property
    def bits_per_value(self) -> int:
        """l = m + n + 1."""
        return self.integer_bits + self.fraction_bits + 1

    @property
    def feature_width(self) -> int:
        """Model input width: r*l bits for packed files, r for float files."""
        return self.features * self.bits_per_value if self.feature_format == PACKED_BITS else self.features

    @property
    def stored_width(self) -> int:
        """Columns actually stored: ceil(r*l/8) bytes for packed files, r for float files."""
        return math.ceil(self.feature_width / 8) if self.feature_format == PACKED_BITS else self.features

    @property
    def private(self) -> bool:
        exact = self.privacy_report.get("exact_epsilon_per_record")
        return self.mechanism != "none" and exact not in ("inf", math.inf)

    def to_attrs(self) -> dict[str, Any]:
        attrs: dict[str, Any] = {"schema": SCHEMA}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("partition", "mechanism_parameters", "privacy_report", "label_histograms"):
                value = json.dumps(value, sort_keys=True, default=_json_default)
            elif f.name == "input_shape":
                value = np.asarray(value, dtype=np.int64)
            elif f.name == "local_accuracy":
                value = np.nan if value is None else float(value)
            attrs[f.name] = value
        report = self.privacy_report
        attrs["nominal_epsilon"] = _float_or_nan(report.get("nominal_epsilon"))
        attrs["exact_epsilon_per_record"] = _float_or_nan(report.get("exact_epsilon_per_record"))
        attrs["bits_per_value"] = self.bits_per_value
        attrs["feature_width"] = self.feature_width
        attrs["private"] = self.private
        return attrs

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any], path: str | os.PathLike = "<file>") -> ClientMetadata:
        if _text(attrs.get("schema")) != SCHEMA:
            raise FormatError(path, f"attribute 'schema' is {_text(attrs.get('schema'))!r}, expected {SCHEMA!r} "
                                    "(not an ldpfl feature file)")
        version = attrs.get("schema_version")
        if version is None or int(version) != SCHEMA_VERSION:
            raise FormatError(path, f"attribute 'schema_version' is {version!r}, this reader supports {SCHEMA_VERSION}")
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name not in attrs:
                raise FormatError(path, f"missing attribute {f.name!r}")
            value = attrs[f.name]
            try:
                if f.name in ("partition", "mechanism_parameters", "privacy_report", "label_histograms"):
                    value = json.loads(_text(value))
                elif f.name == "input_shape":
                    value = tuple(int(v) for v in np.asarray(value).ravel())
                elif f.name == "local_accuracy":
                    value = None if np.isnan(value) else float(value)
                elif f.name in ("num_classes", "client_index", "client_count", "integer_bits", "fraction_bits",
                                "features", "schema_version"):
                    value = int(value)
                else:
                    value = _text(value)
            except (TypeError, ValueError) as error:
                raise FormatError(path, f"attribute {f.name!r} is malformed ({error})") from None
            kwargs[f.name] = value
        meta = cls(**kwargs)
        meta.check(path)
        return meta

    def check(self, path: str | os.PathLike = "<file>") -> None:
        """Range checks on the attribute values."""
        problems = []
        if self.feature_format not in FEATURE_FORMATS:
            problems.append(f"attribute 'feature_format' is {self.feature_format!r}, expected one of {FEATURE_FORMATS}")
        if not 0 <= self.integer_bits <= 31 or not 0 <= self.fraction_bits <= 31:
            problems.append(f"attributes 'integer_bits'/'fraction_bits' ({self.integer_bits}, {self.fraction_bits}) "
                            "are outside [0, 31]")
        if not 1 <= self.features <= MAX_FEATURE_WIDTH or self.feature_width > MAX_FEATURE_WIDTH:
            problems.append(f"attribute 'features' ({self.features}) is outside [1, {MAX_FEATURE_WIDTH}]")
        if not 1 <= self.num_classes <= 100_000:
            problems.append(f"attribute 'num_classes' ({self.num_classes}) is outside [1, 100000]")
        if not 0 <= self.client_index < max(self.client_count, 1):
            problems.append(f"attribute 'client_index' ({self.client_index}) is outside [0, client_count="
                            f"{self.client_count})")
        if problems:
            raise FormatError(path, "; ".join(problems))


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return str(value)


def _float_or_nan(value: Any) -> float:
    if value is None:
        return math.nan
    if value == "inf":
        return math.inf
    return float(value)


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray) and value.shape == ():
        return _text(value.item())
    return "" if value is None else str(value)


def label_histogram(labels: np.ndarray, num_classes: int) -> list[int]:
    return np.bincount(np.asarray(labels, dtype=np.int64), minlength=num_classes)[:num_classes].tolist()


# ----------------------------------------------------------------------------------------------------
# Writing


def _rows_per_chunk(row_bytes: int, rows: int) -> int:
    return int(max(1, min(rows, CHUNK_BYTES // max(row_bytes, 1))))


class ClientFileWriter:
    """Stream the rows of one client file into a temporary file; ``commit`` renames it into place.

    Use as a context manager: leaving the block with an exception removes the temporary file.
    """

    def __init__(self, path: str | os.PathLike, metadata: ClientMetadata, rows: Mapping[str, int], *,
                 input_bit_density: np.ndarray | None = None, overwrite: bool = False):
        self.path = Path(path)
        if self.path.exists() and not overwrite:
            raise FileExistsError(f"{self.path} exists (pass overwrite=True to replace it)")
        metadata.check(self.path)
        self.metadata = metadata
        self.rows = {split: int(rows.get(split, 0)) for split in SPLITS}
        self.tmp_path = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        self._file = h5py.File(self.tmp_path, "w", libver="latest")
        self._committed = False
        dtype = np.uint8 if metadata.feature_format == PACKED_BITS else np.float32
        width = metadata.stored_width
        for split, count in self.rows.items():
            group = self._file.create_group(split)
            for name, shape, dt in (("features", (count, width), dtype), ("labels", (count,), np.int32)):
                row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * np.dtype(dt).itemsize
                chunks = (_rows_per_chunk(row_bytes, max(count, 1)), *shape[1:])
                group.create_dataset(name, shape=shape, dtype=dt, chunks=chunks, fletcher32=True,
                                     maxshape=(None, *shape[1:]) if count == 0 else None)
        if input_bit_density is not None:
            self.write_input_bit_density(input_bit_density)
        for key, value in metadata.to_attrs().items():
            self._file.attrs[key] = value

    def write_input_bit_density(self, input_bit_density: np.ndarray) -> None:
        """Store /stats/input_bit_density (float32, shape (r*l,)); for densities known only after streaming."""
        density = np.asarray(input_bit_density, dtype=np.float32)
        if density.shape != (self.metadata.feature_width,):
            raise ValueError(f"input_bit_density must have shape ({self.metadata.feature_width},), got {density.shape}")
        self._file.require_group("stats").create_dataset("input_bit_density", data=density, fletcher32=True,
                                                         chunks=density.shape)

    def write_rows(self, split: str, start: int, features: np.ndarray, labels: np.ndarray) -> None:
        """Write ``features`` (packed bits or float32, as the metadata says) and ``labels`` at row ``start``."""
        stop = start + len(features)
        if len(labels) != len(features) or stop > self.rows[split]:
            raise ValueError(f"rows {start}:{stop} of split {split!r} do not fit {self.rows[split]} rows")
        group = self._file[split]
        group["features"][start:stop] = features
        group["labels"][start:stop] = labels

    def commit(self) -> str:
        """Close, fsync and rename into place; return the file's sha256."""
        self._file.close()
        with open(self.tmp_path, "rb+") as handle:
            os.fsync(handle.fileno())
        digest = sha256_file(self.tmp_path)
        os.replace(self.tmp_path, self.path)
        self._committed = True
        return digest

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self._file.close()
        with contextlib.suppress(FileNotFoundError):
            self.tmp_path.unlink()

    def __enter__(self) -> ClientFileWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None or not self._committed:
            self.abort()


def write_client_file(path: str | os.PathLike, metadata: ClientMetadata,
                      splits: Mapping[str, tuple[np.ndarray, np.ndarray]], *,
                      input_bit_density: np.ndarray | None = None, overwrite: bool = False) -> str:
    """Write a whole client file from in-memory (features, labels) per split; return its sha256."""
    rows = {split: len(splits[split][0]) if split in splits else 0 for split in SPLITS}
    with ClientFileWriter(path, metadata, rows, input_bit_density=input_bit_density, overwrite=overwrite) as writer:
        for split, (features, labels) in splits.items():
            writer.write_rows(split, 0, features, labels)
        return writer.commit()


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


# ----------------------------------------------------------------------------------------------------
# Reading and validation


def _check_dataset(path: Path, name: str, dset: h5py.Dataset) -> None:
    if dset.is_virtual:
        raise FormatError(path, f"dataset {name!r} is a virtual dataset (refused)")
    if dset.external:
        raise FormatError(path, f"dataset {name!r} uses external storage (refused)")
    plist = dset.id.get_create_plist()
    for i in range(plist.get_nfilters()):
        code = plist.get_filter(i)[0]
        if code not in KNOWN_FILTERS:
            raise FormatError(path, f"dataset {name!r} uses unknown filter id {code} (only fletcher32 is allowed)")
    if dset.ndim not in (1, 2) or any(s > MAX_ROWS * 100 for s in dset.shape):
        raise FormatError(path, f"dataset {name!r} declares shape {dset.shape}, beyond the limits")


def _walk_links(path: Path, group: h5py.Group, prefix: str = "") -> None:
    for key in group:
        link = group.get(key, getlink=True)
        full = f"{prefix}/{key}"
        if not isinstance(link, h5py.HardLink):
            raise FormatError(path, f"{full!r} is a {type(link).__name__} (only objects inside the file are allowed)")
        obj = group[key]
        if isinstance(obj, h5py.Group):
            _walk_links(path, obj, full)


def check_structure(path: str | os.PathLike, handle: h5py.File, metadata: ClientMetadata) -> dict[str, int]:
    """Validate the objects, links, filters, dtypes and declared shapes; return rows per split."""
    path = Path(path)
    _walk_links(path, handle)
    extra = set(handle) - ALLOWED_GROUPS
    if extra:
        raise FormatError(path, f"unexpected objects {sorted(extra)} at the file root")
    expected_dtype = np.dtype(np.uint8) if metadata.feature_format == PACKED_BITS else np.dtype(np.float32)
    rows: dict[str, int] = {}
    for split in SPLITS:
        if split not in handle or not isinstance(handle[split], h5py.Group):
            raise FormatError(path, f"missing group {split!r}")
        group = handle[split]
        if set(group) != {"features", "labels"}:
            raise FormatError(path, f"group {split!r} holds {sorted(group)}, expected ['features', 'labels']")
        features, labels = group["features"], group["labels"]
        for name, dset in ((f"{split}/features", features), (f"{split}/labels", labels)):
            _check_dataset(path, name, dset)
        if features.dtype != expected_dtype:
            raise FormatError(path, f"dataset '{split}/features' has dtype {features.dtype}, expected "
                                    f"{expected_dtype} for feature_format {metadata.feature_format!r}")
        if labels.dtype.kind not in "iu" or labels.dtype.itemsize > 8:
            raise FormatError(path, f"dataset '{split}/labels' has dtype {labels.dtype}, expected an integer type")
        if features.ndim != 2 or features.shape[1] != metadata.stored_width:
            raise FormatError(path, f"dataset '{split}/features' has shape {features.shape}, expected "
                                    f"(rows, {metadata.stored_width})")
        if labels.shape != (features.shape[0],):
            raise FormatError(path, f"dataset '{split}/labels' has shape {labels.shape}, "
                                    f"expected ({features.shape[0]},)")
        declared_bytes = features.shape[0] * features.shape[1] * features.dtype.itemsize
        if features.shape[0] > MAX_ROWS or declared_bytes > MAX_SPLIT_BYTES:
            raise FormatError(path, f"dataset '{split}/features' declares {features.shape[0]} rows, beyond the limits")
        rows[split] = int(features.shape[0])
    if "stats" in handle:
        stats = handle["stats"]
        if set(stats) - {"input_bit_density"}:
            raise FormatError(path, f"group 'stats' holds unexpected objects {sorted(set(stats))}")
        if "input_bit_density" in stats:
            _check_dataset(path, "stats/input_bit_density", stats["input_bit_density"])
            if stats["input_bit_density"].shape != (metadata.feature_width,):
                raise FormatError(path, "dataset 'stats/input_bit_density' has the wrong shape")
    return rows


@contextlib.contextmanager
def open_client_file(path: str | os.PathLike) -> Iterator[tuple[h5py.File, ClientMetadata, dict[str, int]]]:
    """Open and validate a client file; yield (h5py file, metadata, rows per split).

    Every failure (not HDF5, truncated, corrupted metadata, wrong schema, refused structure) raises
    ``FormatError`` with a one-line message.
    """
    path = Path(path)
    if not path.is_file():
        raise FormatError(path, "no such file")
    try:
        handle = h5py.File(path, "r")
    except OSError as error:
        raise FormatError(path, f"not a readable HDF5 file ({_short(error)})") from None
    try:
        try:
            metadata = ClientMetadata.from_attrs(handle.attrs, path)
            rows = check_structure(path, handle, metadata)
        except (OSError, KeyError, RuntimeError) as error:
            raise FormatError(path, f"corrupted HDF5 structure ({_short(error)})") from None
        yield handle, metadata, rows
    finally:
        handle.close()


def _short(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text[:200]


def read_metadata(path: str | os.PathLike) -> ClientMetadata:
    """Validated metadata of a client file (reads no feature data)."""
    with open_client_file(path) as (_, metadata, _rows):
        return metadata


@dataclass(frozen=True)
class ClientData:
    """One client's features and labels per split, as stored (packed bits stay packed)."""

    path: Path
    metadata: ClientMetadata
    features: Mapping[str, np.ndarray]
    labels: Mapping[str, np.ndarray]
    input_bit_density: np.ndarray | None = None


def read_client_file(path: str | os.PathLike, splits: tuple[str, ...] = SPLITS) -> ClientData:
    """Read whole splits (checksums are verified by HDF5 on every chunk read)."""
    with open_client_file(path) as (handle, metadata, _rows):
        try:
            features = {s: handle[s]["features"][()] for s in splits}
            labels = {s: handle[s]["labels"][()].astype(np.int64) for s in splits}
            density = handle["stats"]["input_bit_density"][()] if "stats" in handle and \
                "input_bit_density" in handle["stats"] else None
        except OSError as error:
            raise FormatError(path, f"data failed its checksum or could not be read ({_short(error)})") from None
        for s in splits:
            if labels[s].size and (labels[s].min() < 0 or labels[s].max() >= metadata.num_classes):
                raise FormatError(path, f"labels of split {s!r} fall outside [0, {metadata.num_classes})")
    return ClientData(Path(path), metadata, features, labels, density)


def iter_feature_chunks(handle: h5py.File, split: str, rows_per_chunk: int = 4096) -> Iterator[np.ndarray]:
    """Yield the stored features of ``split`` in row blocks (bounded memory)."""
    dset = handle[split]["features"]
    for start in range(0, dset.shape[0], rows_per_chunk):
        yield dset[start:start + rows_per_chunk]


# ----------------------------------------------------------------------------------------------------
# Manifest


@dataclass(frozen=True)
class FileRecord:
    """One client file as the manifest lists it."""

    client_index: int
    path: str
    sha256: str
    bytes: int
    rows: Mapping[str, int]


def write_manifest(run_dir: str | os.PathLike, records: list[FileRecord], run_info: Mapping[str, Any]) -> Path:
    """Atomically (re)write ``manifest.json`` listing ``records``; ``run_info`` must hold no seed."""
    if any("seed" in key.lower() for key in _all_keys(run_info)):
        raise ValueError("run_info must not contain a seed: seeds are never written to outputs")
    run_dir = Path(run_dir)
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "updated_utc": utc_now(),
        **dict(run_info),
        "files": [dataclasses.asdict(r) | {"rows": dict(r.rows)}
                  for r in sorted(records, key=lambda r: r.client_index)],
    }
    target = run_dir / MANIFEST_NAME
    tmp = run_dir / f".{MANIFEST_NAME}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True, default=_json_default) + "\n")
    os.replace(tmp, target)
    return target


def _all_keys(mapping: Any) -> Iterator[str]:
    if isinstance(mapping, Mapping):
        for key, value in mapping.items():
            yield str(key)
            yield from _all_keys(value)
    elif isinstance(mapping, list):
        for value in mapping:
            yield from _all_keys(value)


@dataclass(frozen=True)
class Manifest:
    run_dir: Path
    info: Mapping[str, Any]
    files: list[FileRecord]


def read_manifest(run_dir: str | os.PathLike) -> Manifest:
    """Read and validate ``manifest.json`` of a run directory."""
    path = Path(run_dir) / MANIFEST_NAME
    if not path.is_file():
        raise FormatError(path, "no manifest (is this an ldpfl export run directory?)")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise FormatError(path, f"unreadable manifest ({_short(error)})") from None
    if not isinstance(data, dict) or data.get("schema") != MANIFEST_SCHEMA:
        raise FormatError(path, f"attribute 'schema' is not {MANIFEST_SCHEMA!r}")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise FormatError(path, f"'schema_version' is {data.get('schema_version')!r}, expected {SCHEMA_VERSION}")
    try:
        files = [FileRecord(int(f["client_index"]), str(f["path"]), str(f["sha256"]), int(f["bytes"]),
                            {k: int(v) for k, v in f["rows"].items()}) for f in data.get("files", [])]
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise FormatError(path, f"malformed file entry ({_short(error)})") from None
    for record in files:
        if Path(record.path).name != record.path:
            raise FormatError(path, f"file entry {record.path!r} points outside the run directory")
    info = {k: v for k, v in data.items() if k != "files"}
    return Manifest(Path(run_dir), info, files)


def verify_file_record(run_dir: str | os.PathLike, record: FileRecord) -> ClientMetadata:
    """Check that a listed file exists, matches its sha256 and validates; return its metadata."""
    path = Path(run_dir) / record.path
    if not path.is_file():
        raise FormatError(path, "listed in the manifest but missing")
    digest = sha256_file(path)
    if digest != record.sha256:
        raise FormatError(path, f"sha256 {digest[:12]}… does not match the manifest's {record.sha256[:12]}…")
    with open_client_file(path) as (_, metadata, rows):
        if dict(rows) != dict(record.rows):
            raise FormatError(path, f"rows {rows} differ from the manifest's {dict(record.rows)}")
        return metadata


def record_for(path: str | os.PathLike, client_index: int, sha256: str, rows: Mapping[str, int]) -> FileRecord:
    path = Path(path)
    return FileRecord(client_index, path.name, sha256, path.stat().st_size, dict(rows))


# Attributes that must agree across the clients of one run (stage 2 and inspect compare them).
RUN_CONSISTENT_ATTRIBUTES = ("schema_version", "dataset", "num_classes", "client_count", "extractor",
                             "integer_bits", "fraction_bits", "features", "feature_format", "mechanism")


def compare_metadata(items: list[tuple[str, ClientMetadata]]) -> list[str]:
    """Human-readable mismatches among clients of one run (empty when they agree)."""
    problems = []
    if not items:
        return problems
    first_name, first = items[0]
    for name, meta in items[1:]:
        for attr in RUN_CONSISTENT_ATTRIBUTES:
            a, b = getattr(first, attr), getattr(meta, attr)
            if a != b:
                problems.append(f"attribute {attr!r} differs: {first_name} has {a!r}, {name} has {b!r}")
    return problems
