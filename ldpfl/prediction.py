"""``ldpfl predict``: a silo applies its pipeline and the federated model to records of its own (issue 16 item 5).

The pipeline is the one its export ran (LDPFL Algorithm 1 lines 4-10): the silo's trained CNN (or the
raw features under the extractor ``none``), cut at the release point (flatten, bottleneck, scores or
label), the fixed-point encoding (eq. 14) for bit mechanisms; then the global model of stage 2. Every
setting is read from the silo's client file (``client_NNN.h5``), never guessed.

What the model is given (``randomized``):

* **clean** (default): the release is encoded but NOT randomized, as ``client_NNN.local.h5`` holds it
  (``ldpfl export --keep-clean-test``). The records never leave the silo, so no privacy is spent; the
  run measured the model on such inputs as ``clean_test_accuracy`` (``ldpfl federate --eval-clean``).
* **randomized**: the mechanism randomizes each record as in the export, with fresh randomness; the
  model was trained, and its ``test_accuracy`` measured, on such inputs. The randomized rows are a new
  release of the records (ε per record as in the file's privacy report) if anything computed from them
  is shared.
* **released**: rows already stored in a client file (its test split by default): the model's inputs
  exactly as ``ldpfl federate`` evaluated them.

The saved model records what it was trained on (``ldpfl.stage2_federate.model_file``); inputs that do not
match it (classes, plan, release, extractor, encoding, width, mechanism) are refused, one line.

Layering: this module composes stage 1 (CNN, release, encoding, mechanism) and stage 2 (model file,
model, bit unpacking); TensorFlow and torch are imported inside the functions that need them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ldpfl.common.errors import ParameterError
from ldpfl.contract.client_reader import open_client_file, read_client_file
from ldpfl.contract.layout import FEDERATION_DIR, MANIFEST_NAME, PARTITION_FILE, client_file_name, client_files
from ldpfl.contract.manifest import read_manifest
from ldpfl.contract.release_point import parse_release
from ldpfl.contract.released_statistics import feature_map
from ldpfl.contract.schema import ClientMetadata, FormatError
from ldpfl.mechanisms.base import PACKED_BITS
from ldpfl.mechanisms.report import json_number
from ldpfl.stage1_features.export.from_models import read_source_run
from ldpfl.stage1_features.export.release import clean_layout, release_values, stored_layout
from ldpfl.stage1_features.export.silo import load_export_data
from ldpfl.stage1_features.export.stored import load_holdouts, model_file_name
from ldpfl.stage1_features.export.write import RELEASE_ROWS
from ldpfl.stage1_features.models import cnn, cnn_release
from ldpfl.stage2_federate.model_file import file_attributes, mismatches, read_model

MODEL_NAME = "model.pt"
SPLIT_CHOICES = ("test", "train", "all")
CLEAN, RANDOMIZED, RELEASED = "clean", "randomized", "released"
BATCH_ROWS = 1024  # records per CNN / model batch (stage 1's prediction batch)

__all__ = ["CLEAN", "RANDOMIZED", "RELEASED", "SPLIT_CHOICES", "PredictError", "Prediction", "Records", "Silo",
           "check_inputs", "check_model", "default_model_path", "load_global_model", "open_silo", "predict_released",
           "predict_silo", "silo_records"]


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


# ---------------------------------------------------------------------------------------------------
# The global model


@dataclass(frozen=True)
class GlobalModel:
    """The federated model, rebuilt for inference, and what it was trained on (None: not recorded)."""

    path: Path
    model: Any  # stage2_federate.model.FederatedMLP, in eval mode
    trained_on: dict[str, Any] | None
    input_width: int
    num_classes: int


def default_model_path(run_dir: str | Path) -> Path:
    """Return ``RUN_DIR/federation/model.pt``."""
    return Path(run_dir) / FEDERATION_DIR / MODEL_NAME


def load_global_model(path: str | Path) -> GlobalModel:
    """Read ``model.pt`` and rebuild its ``FederatedMLP`` from the parameters' shapes.

    Raises
    ------
    FormatError
        Not a model of ``ldpfl federate``, or parameters that do not form its layers.
    """
    import torch

    from ldpfl.stage2_federate.model import FederatedMLP

    saved = read_model(path)
    state = saved.state_dict
    weights = sorted((int(k.split(".")[1]), v) for k, v in state.items()
                     if k.startswith("net.") and k.endswith(".weight") and k.split(".")[1].isdigit())
    if not weights or any(v.ndim != 2 for _, v in weights):
        raise FormatError(path, "the parameters are not those of the federated model (net.N.weight layers)")
    widths = [int(weights[0][1].shape[1])] + [int(v.shape[0]) for _, v in weights]
    dropout = float((saved.trained_on or {}).get("model", {}).get("dropout", 0.0))
    model = FederatedMLP(widths[0], widths[1:-1], widths[-1], dropout)
    try:
        model.load_state_dict({k: v.to(torch.float32) for k, v in state.items()}, strict=True)
    except RuntimeError as error:
        raise FormatError(path, f"the parameters do not form the federated model ({str(error).splitlines()[0]})"
                          ) from None
    model.eval()
    return GlobalModel(Path(path), model, saved.trained_on, widths[0], widths[-1])


def check_model(model: GlobalModel, meta: ClientMetadata, what: str) -> list[str]:
    """Refuse a model that was not trained on inputs like ``meta``'s; return warnings.

    Parameters
    ----------
    model : GlobalModel
        The global model.
    meta : ClientMetadata
        The client file that describes the inputs (a local-only clean file: its mechanism is not compared).
    what : str
        Names the inputs in the error.

    Raises
    ------
    PredictError
        One line listing every difference.
    """
    found: dict[str, Any] = file_attributes(meta)
    if not meta.local_only:
        found["mechanism_parameters"] = dict(meta.mechanism_parameters)
    else:  # the clean version of a release (mechanism none, the same encoding, format and width)
        found.pop("mechanism")
    problems = [] if model.trained_on is None else mismatches(model.trained_on, found)
    if model.input_width != meta.feature_width:
        problems.insert(0, f"feature_width is {meta.feature_width} here, the model takes {model.input_width}")
    if model.num_classes != meta.num_classes:
        problems.insert(0, f"num_classes is {meta.num_classes} here, the model predicts {model.num_classes}")
    if problems:
        raise PredictError(f"{model.path} was not trained on {what}: {'; '.join(dict.fromkeys(problems))}")
    if model.trained_on is None:
        return [f"{model.path} records nothing of what it was trained on (written before ldpfl recorded it): "
                "only its input width and classes were checked"]
    return []


def check_inputs(silo: Silo, model: GlobalModel, cnn_path: Path | None = None) -> list[str]:
    """Refuse a model not trained on the silo's release, or a missing CNN, before any work; return warnings."""
    warnings = check_model(model, silo.metadata, f"the release of {silo.file.name}")
    path = cnn_path if cnn_path is not None else silo.cnn_path()
    if cnn.is_cnn(silo.metadata.extractor) and not path.is_file():
        raise PredictError(f"no saved CNN {path} of client {silo.index}: export with `save_models`, or pass `cnn`")
    return warnings


# ---------------------------------------------------------------------------------------------------
# Records


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


# ---------------------------------------------------------------------------------------------------
# Prediction


@dataclass
class Prediction:
    """Predicted classes of records, their labels when known, and a JSON-ready summary."""

    index: np.ndarray  # the record's row in its source (dataset row, or the file split's row)
    predicted: np.ndarray
    labels: np.ndarray | None
    class_names: tuple[str, ...] | None
    summary: dict[str, Any]
    warnings: list[str] = field(default_factory=list)

    @property
    def accuracy(self) -> float | None:
        """Return the share of records predicted as labelled (None without labels or records)."""
        if self.labels is None or not len(self.labels):
            return None
        return float(np.mean(self.predicted == self.labels))


def _logits_argmax(model: Any, stored: np.ndarray, width: int, packed: bool) -> np.ndarray:
    """Predict one batch of stored rows as ``ldpfl federate`` feeds them (bits unpacked in torch)."""
    import torch

    from ldpfl.stage2_federate.packed_bits import unpack_bits

    with torch.no_grad():
        tensor = torch.from_numpy(np.ascontiguousarray(stored))
        inputs = unpack_bits(tensor, width) if packed else tensor.to(torch.float32)
        return model(inputs).argmax(dim=1).numpy().astype(np.int64)


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


def predict_silo(silo: Silo, records: Records, model: GlobalModel, *, randomized: bool = False,
                 rng: np.random.Generator | None = None, cnn_path: Path | None = None,
                 batch_rows: int = BATCH_ROWS, progress: Progress | None = None) -> Prediction:
    """Run the silo's pipeline over ``records`` and predict them with the global model.

    Parameters
    ----------
    silo, records, model
        From :func:`open_silo`, :func:`silo_records`, :func:`load_global_model`.
    randomized : bool
        Randomize the release with the silo's mechanism as in the export (needs ``rng``); default: clean.
    rng : np.random.Generator, optional
        The randomization stream (``randomized`` only).
    cnn_path : path, optional
        The silo's CNN; default the one its export saved.
    batch_rows : int
        Records per batch.
    progress : tqdm, optional
        Updated with the records predicted.
    """
    meta = silo.metadata
    warnings = check_inputs(silo, model, cnn_path)
    point, spec = parse_release(meta.release), meta.mechanism_spec()
    if randomized and (rng is None or feature_map(meta) is not None):
        raise PredictError("randomized prediction needs a generator and a per-record release (not stats:K)")
    layout = stored_layout(point, spec) if randomized else clean_layout(point, spec)
    stream = rng if rng is not None and randomized else np.random.default_rng(0)  # clean: `none` draws nothing
    packed = layout.feature_format == PACKED_BITS
    predicted = []
    for values in _release_values(silo, records, cnn_path, batch_rows):
        for offset in range(0, len(values), RELEASE_ROWS):  # as stage 1 releases: bounded temporaries
            stored, _bits = layout.pipeline.release(values[offset:offset + RELEASE_ROWS], stream)
            if stored.dtype.kind == "f" and not np.all(np.isfinite(stored)):
                raise PredictError(f"mechanism {spec.name!r} gave values that are not finite")
            predicted.append(_logits_argmax(model.model, stored, meta.feature_width, packed))
        if progress is not None:
            progress.update(len(values))
    labels = records.labels
    result = Prediction(records.rows, _concat(predicted), labels, meta.class_names, {}, warnings)
    privacy = PredictionPrivacy(False, bool(randomized and spec.randomizes), spec.name,
                                meta.privacy_report.exact_epsilon_per_record if randomized else None)
    result.summary = _summary(result, model, RANDOMIZED if randomized else CLEAN, records.description, privacy)
    result.summary |= {"client_index": silo.index, "split": records.split, "feature_format": layout.feature_format}
    return result


def predict_released(path: str | Path, model: GlobalModel, *, split: str = "test",
                     batch_rows: int = BATCH_ROWS, progress: Progress | None = None) -> Prediction:
    """Predict rows already stored in a client file (``client_NNN.h5`` or the clean ``client_NNN.local.h5``).

    These are the model's inputs exactly as ``ldpfl federate`` evaluated them (``test_accuracy`` on the
    client files' test splits, ``clean_test_accuracy`` on the local files').
    """
    if split not in ("train", "test"):
        raise PredictError(f"`split` of a client file is train or test, got {split!r}")
    data = read_client_file(path, splits=(split,))
    meta = data.metadata
    warnings = check_model(model, meta, str(path))
    features, labels = data.features[split], np.asarray(data.labels[split], dtype=np.int64)
    packed = meta.feature_format == PACKED_BITS
    predicted = []
    for start in range(0, len(labels), batch_rows):
        predicted.append(_logits_argmax(model.model, features[start:start + batch_rows], meta.feature_width, packed))
        if progress is not None:
            progress.update(min(batch_rows, len(labels) - start))
    result = Prediction(np.arange(len(labels), dtype=np.int64), _concat(predicted), labels, meta.class_names, {},
                        warnings)
    result.summary = _summary(result, model, RELEASED, f"{split} split of {path} ({len(labels)} rows)",
                              PredictionPrivacy(True, bool(meta.private), meta.mechanism, None))
    result.summary |= {"client_index": meta.client_index, "split": split, "feature_format": meta.feature_format,
                       "local_only": meta.local_only}
    return result


def _concat(parts: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


@dataclass(frozen=True)
class PredictionPrivacy:
    """The summary's ``privacy``: whether the inputs were released ones, randomized here, by what, at what ε."""

    released: bool
    randomized: bool
    mechanism: str
    exact_epsilon_per_record: float | None

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form (an infinite ε as ``"inf"``)."""
        return {"released": self.released, "randomized": self.randomized, "mechanism": self.mechanism,
                "exact_epsilon_per_record": json_number(self.exact_epsilon_per_record)}


class Progress(Protocol):
    """What a progress bar needs to offer (``tqdm``)."""

    def update(self, n: int) -> object:
        """Advance by ``n``."""


def _summary(result: Prediction, model: GlobalModel, inputs: str, source: str,
             privacy: PredictionPrivacy) -> dict[str, Any]:
    trained = model.trained_on or {}
    correct = None if result.labels is None else int(np.sum(result.predicted == result.labels))
    return {"records": int(len(result.predicted)), "source": source, "inputs": inputs,
            "accuracy": result.accuracy, "correct": correct, "model": str(model.path),
            "model_evaluated_on": trained.get("evaluated_on"), "model_last_round": trained.get("last_round"),
            "privacy": privacy.to_dict(),
            "predicted_counts": np.bincount(result.predicted, minlength=model.num_classes).tolist()}

