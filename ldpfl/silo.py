"""A silo of an export run, rerun on its own records: its client file, its records, and its export's pipeline.

``ldpfl predict`` and ``ldpfl personalize`` both rerun what a silo's export did (LDPFL Algorithm 1 lines 4-10) on
records the silo holds: the trained CNN (or the weight-free extractor, or the raw features under ``none``), cut at
the release point; for a ``stats:K`` release the projection on its K public directions and the clipping
(``contract.released_statistics.feature_map``); then the fixed-point encoding (eq. 14) for bit mechanisms, and the
mechanism itself when randomized. Every setting comes from the silo's client file (``client_NNN.h5``), never
guessed; the records come from the run's data and its stored hold-out split (``partition.npz``), or new data.

* :func:`open_silo`: the client file, its metadata and the run's manifest information;
* :func:`silo_records`: the records (its held-out test split by default, its training split, or new records);
* :func:`release_rows`: the records through the pipeline, batch by batch, as the model reads them (stored rows);
* :func:`clean_rows`: a split's clean rows and labels at once (what a clean local file of the release holds).

TensorFlow loads inside the functions that need a CNN.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ldpfl.common.errors import ParameterError
from ldpfl.contract.client_reader import open_client_file
from ldpfl.contract.layout import MANIFEST_NAME, PARTITION_FILE, client_file_name, client_files
from ldpfl.contract.manifest import read_manifest
from ldpfl.contract.release_point import parse_release
from ldpfl.contract.released_statistics import feature_map
from ldpfl.contract.schema import ClientMetadata
from ldpfl.mechanisms.base import PACKED_BITS
from ldpfl.stage1_features.export.from_models import read_source_run
from ldpfl.stage1_features.export.release import (
    StoredLayout,
    clean_layout,
    local_layout,
    release_values,
    stored_layout,
)
from ldpfl.stage1_features.export.silo import load_export_data
from ldpfl.stage1_features.export.stored import load_holdouts, model_file_name
from ldpfl.stage1_features.export.write import RELEASE_ROWS
from ldpfl.stage1_features.models import cnn, cnn_release

SPLIT_CHOICES = ("test", "train", "all")
BATCH_ROWS = 1024  # records per CNN / model batch (stage 1's prediction batch)

__all__ = ["BATCH_ROWS", "SPLIT_CHOICES", "PredictError", "Records", "Silo", "clean_rows", "open_silo",
           "release_layout", "release_rows", "silo_records"]


class PredictError(ParameterError):
    """Inputs ``ldpfl predict`` cannot use (a ``ValueError``: exit code 2, one line; options backquoted)."""


# ---------------------------------------------------------------------------------------------------
# The silo: its client file, the run's settings, its saved CNN


@dataclass(frozen=True)
class Silo:
    """One silo of an export run directory: its client file's metadata and the run's manifest information."""

    run_dir: Path
    index: int
    file: Path
    metadata: ClientMetadata
    info: Mapping[str, Any] = field(default_factory=dict)

    @property
    def config(self) -> Mapping[str, Any]:
        """Return the export's settings (``config`` of the manifest; empty without one)."""
        config = self.info.get("config")
        return config if isinstance(config, Mapping) else {}

    def cnn_path(self) -> Path:
        """Return where the export saved this silo's CNN (``--save-models``; a re-release: its source run's)."""
        if isinstance(self.info.get("from_models"), str):
            return read_source_run(self.run_dir).model_path(self.index)
        return self.run_dir / model_file_name(self.index)


def open_silo(run_dir: str | Path, client_index: int | None = None) -> Silo:
    """Open client ``client_index``'s file in ``run_dir`` (the only one when None) and the run's manifest.

    Raises
    ------
    PredictError
        No such directory, no client file of that index (the message lists the indices there).
    FormatError
        The client file does not validate.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise PredictError(f"{run_dir} is not a directory (an ldpfl export run directory)")
    files = client_files(run_dir)
    present = ", ".join(str(i) for i in sorted(files)) or "none"
    if client_index is None:
        if len(files) != 1:
            raise PredictError(f"{run_dir} holds {len(files)} client files (indices {present}): choose one with "
                               "`client_index`")
        client_index = next(iter(files))
    if client_index not in files:
        raise PredictError(f"{run_dir} has no {client_file_name(client_index)} (client files there: {present}); "
                           "check `client_index`")
    with open_client_file(files[client_index]) as (_handle, meta, _rows):
        pass
    info: Mapping[str, Any] = {}
    if (run_dir / MANIFEST_NAME).is_file():
        info = read_manifest(run_dir).info
    return Silo(run_dir, client_index, files[client_index], meta, info)


@dataclass(frozen=True)
class Records:
    """The records to predict: a dataset, its rows, their labels (when known) and a description."""

    dataset: Any  # stage1_features.datasets.Dataset (or OwnDataset)
    rows: np.ndarray
    labels: np.ndarray | None
    description: str
    split: str


def _client_labels(path: Path) -> dict[str, np.ndarray]:
    with open_client_file(path) as (handle, _meta, _rows):
        return {s: np.asarray(handle[s]["labels"][()], dtype=np.int64) for s in ("train", "test")}


def silo_records(silo: Silo, *, dataset: str | None = None, data: str | None = None,
                 data_options: Mapping[str, Any] | None = None, data_dir: str | None = None,
                 split: str | None = None) -> Records:
    """Load the records to predict: the silo's own (its held-out split by default), or new ones.

    Parameters
    ----------
    silo : Silo
        The silo.
    dataset, data, data_options, data_dir
        As ``ldpfl export`` reads them. None: the run's (its manifest). ``data`` other than the run's:
        new records of the silo, all of them (``split`` must be ``all``).
    split : {"test", "train", "all"}, optional
        The silo's held-out test split (IV-C), its training split, or all its records; default ``test``
        for the run's records, ``all`` for new ones.
    """
    config, meta = silo.config, silo.metadata
    run_data = config.get("data")
    if dataset is not None and data is not None:
        raise PredictError("`dataset` and `data` exclude each other")
    own = data is not None and (run_data is None or Path(data).resolve() != Path(str(run_data)).resolve())
    other = own or (dataset is not None and dataset != meta.dataset)
    if other and split not in (None, "all"):
        raise PredictError(f"`split` {split} is a split of the records the run exported; new records are predicted "
                           "all (`split` all)")
    split = split or ("all" if other else "test")
    if split not in SPLIT_CHOICES:
        raise PredictError(f"`split` must be one of {', '.join(SPLIT_CHOICES)}, got {split!r}")
    source = data if data is not None else (None if dataset is not None else run_data)
    options: dict[str, Any] = {}
    if data_options:
        options = dict(data_options)
    elif source is not None:  # read as the export read the run's data
        options = dict(config.get("data_options") or {})
    options.pop("classes", None)
    name = meta.dataset if source is not None else (dataset or meta.dataset)
    if source is not None and not Path(str(source)).exists():
        raise PredictError(f"the run's data {source} is not found (relative to here); pass `data`")
    loaded = load_export_data(name, data_dir if data_dir is not None else config.get("data_dir"),
                              None if source is None else str(source), options, meta.class_names)
    if other:
        rows = np.arange(len(loaded), dtype=np.int64)
        return Records(loaded, rows, loaded.y[rows], f"{len(rows)} records of {source or name}", "all")
    count = int(config.get("clients") or meta.client_count)
    holdouts = load_holdouts(silo.run_dir, count) if (silo.run_dir / PARTITION_FILE).is_file() else None
    if holdouts is None:
        raise PredictError(f"{silo.run_dir} holds no stored hold-out split ({PARTITION_FILE} of this version); "
                           "predict new records with `data`, or the released rows with `released`")
    train, test = holdouts[silo.index]
    labels = _client_labels(silo.file)
    for part, idx in (("train", train), ("test", test))[:0 if feature_map(meta) else 2]:  # stats: rows synthetic
        inside = not idx.size or (int(idx.min()) >= 0 and int(idx.max()) < len(loaded))
        if not inside or not np.array_equal(loaded.y[idx], labels[part]):
            raise PredictError(f"the records of {source or name} are not those {silo.file.name} was exported from "
                               f"(the labels of its {part} split differ); pass the run's `data` or `dataset`")
    rows = {"test": test, "train": train, "all": np.concatenate([train, test])}[split]
    what = {"test": "held-out test split", "train": "training split", "all": "records"}[split]
    return Records(loaded, rows, loaded.y[rows], f"client {silo.index}'s {what} of {meta.dataset} ({len(rows)} "
                                                  "records)", split)


def _release_values(silo: Silo, records: Records, cnn_path: Path | None, batch_rows: int) -> Iterator[np.ndarray]:
    """Yield the release's float32 values of the records, batch by batch (a stats:K release: projected, clipped)."""
    project = feature_map(silo.metadata)
    for values in _extractor_values(silo, records, cnn_path, batch_rows):
        yield values if project is None else project(values)


def _extractor_values(silo: Silo, records: Records, cnn_path: Path | None,
                      batch_rows: int) -> Iterator[np.ndarray]:
    """Yield the extractor's float32 values of the records, batch by batch (CNN or raw features)."""
    meta, dataset = silo.metadata, records.dataset
    point = parse_release(meta.release)
    shape = tuple(int(s) for s in dataset.input_shape)
    if cnn.is_fixed(meta.extractor):  # weight-free (scatter): rebuilt from the options its file records
        fixed = meta.training().fixed or {}
        extractor = cnn.fixed_extractor(meta.extractor, fixed.get("options") or {})
        if shape != tuple(meta.input_shape) or (point.units is None and extractor.width(shape) != meta.features):
            raise PredictError(f"the records have shape {shape}, {silo.file.name}'s {meta.extractor} extractor takes "
                               f"{tuple(meta.input_shape)} ({meta.features} features)")
        for start in range(0, len(records.rows), batch_rows):
            rows = records.rows[start:start + batch_rows]
            yield extractor.transform(dataset.features(rows).reshape(len(rows), *shape))
        return
    if not cnn.is_cnn(meta.extractor):
        width = int(np.prod(shape, dtype=np.int64))
        if width != meta.features and point.units is None:
            raise PredictError(f"the records have {width} values each, {silo.file.name} {meta.features} "
                               f"(extractor {meta.extractor})")
        for start in range(0, len(records.rows), batch_rows):
            rows = records.rows[start:start + batch_rows]
            yield np.asarray(dataset.features(rows), dtype=np.float32).reshape(len(rows), -1)
        return
    if shape != tuple(meta.input_shape):
        raise PredictError(f"the records have shape {shape}, the silo's CNN takes {tuple(meta.input_shape)}")
    path = cnn_path if cnn_path is not None else silo.cnn_path()
    model = cnn_release.load_model(path)
    if cnn_release.bottleneck_units(model) != point.units:
        raise PredictError(f"{path} has bottleneck {cnn_release.bottleneck_units(model)}, release {point} needs "
                           f"{point.units}: not the CNN of {silo.file.name}")
    extractor = cnn.FeatureExtractor(model, cnn.BOTTLENECK_LAYER if point.units else cnn.FLATTEN_LAYER)
    classes = int(model.outputs[0].shape[-1])
    if classes != meta.num_classes or (point.is_flatten and extractor.width != meta.features):
        raise PredictError(f"{path} gives {extractor.width} features and {classes} classes, {silo.file.name} "
                           f"records {meta.features} and {meta.num_classes}: not its CNN")
    for start in range(0, len(records.rows), batch_rows):
        rows = records.rows[start:start + batch_rows]
        yield release_values(point, *extractor.predict(dataset.features(rows).reshape(len(rows), *shape)))


def release_layout(metadata: ClientMetadata, randomized: bool = False) -> StoredLayout:
    """Return the stored layout of the silo's release: clean (mechanism ``none``) or ``randomized``.

    A local-only file (``ldpfl export --local-only``) holds the extractor's float32 values as they are: its clean
    layout is that one, not the encoding mechanism ``none`` has for a flatten release.
    """
    if metadata.local_only and not randomized:
        return local_layout()
    point, spec = parse_release(metadata.release), metadata.mechanism_spec()
    return stored_layout(point, spec) if randomized else clean_layout(point, spec)


def release_rows(silo: Silo, records: Records, *, randomized: bool = False, rng: np.random.Generator | None = None,
                 cnn_path: Path | None = None, batch_rows: int = BATCH_ROWS) -> Iterator[np.ndarray]:
    """Yield the records' stored rows (the model's inputs), batch by batch, in record order.

    Clean by default: the release encoded but NOT randomized (mechanism ``none``: nothing is drawn), as the
    silo's local-only clean file holds it. ``randomized``: the silo's mechanism from ``rng``, as in the export.
    The rows' format is :func:`release_layout`'s.

    Raises
    ------
    PredictError
        ``randomized`` without a generator or for a ``stats:K`` release (it released statistics, not records);
        records that do not fit the extractor; a mechanism that gives values that are not finite.
    """
    meta = silo.metadata
    if randomized and (rng is None or feature_map(meta) is not None):
        raise PredictError("randomized prediction needs a generator and a per-record release (not stats:K)")
    layout = release_layout(meta, randomized)
    stream = rng if rng is not None and randomized else np.random.default_rng(0)  # clean: `none` draws nothing
    for values in _release_values(silo, records, cnn_path, batch_rows):
        for offset in range(0, len(values), RELEASE_ROWS):  # as stage 1 releases: bounded temporaries
            stored, _bits = layout.pipeline.release(values[offset:offset + RELEASE_ROWS], stream)
            if stored.dtype.kind == "f" and not np.all(np.isfinite(stored)):
                raise PredictError(f"mechanism {meta.mechanism!r} gave values that are not finite")
            yield stored


def clean_rows(silo: Silo, split: str, *, cnn_path: Path | None = None,
               batch_rows: int = BATCH_ROWS) -> tuple[np.ndarray, np.ndarray]:
    """Return the silo's clean stored rows and labels of its ``split`` (train or test) of the run's records.

    The rows a clean local file of the release would hold (:func:`release_rows`, clean), for a silo that keeps
    its data but no such file (``ldpfl personalize`` of a randomized or ``stats:K`` file).

    Raises
    ------
    PredictError
        ``split`` other than train or test, or what :func:`silo_records` and :func:`release_rows` refuse.
    """
    if split not in ("train", "test"):
        raise PredictError(f"the silo's clean rows are of its train or test split, not {split!r}")
    records = silo_records(silo, split=split)
    parts = list(release_rows(silo, records, cnn_path=cnn_path, batch_rows=batch_rows))
    layout = release_layout(silo.metadata)
    packed = layout.feature_format == PACKED_BITS
    empty = np.empty((0, (silo.metadata.feature_width + 7) // 8 if packed else silo.metadata.feature_width),
                     dtype=np.uint8 if packed else np.float32)
    labels = np.empty(0, np.int64) if records.labels is None else np.asarray(records.labels, np.int64)
    return (np.concatenate(parts) if parts else empty), labels
