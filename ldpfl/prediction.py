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

Layering: this module composes the silo's pipeline (``ldpfl.silo``: its records through stage 1's CNN, release,
encoding and mechanism) and stage 2 (model file, model, bit unpacking); TensorFlow and torch are imported inside the
functions that need them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ldpfl.contract.client_reader import read_client_file
from ldpfl.contract.layout import FEDERATION_DIR
from ldpfl.contract.schema import ClientMetadata, FormatError
from ldpfl.mechanisms.base import PACKED_BITS
from ldpfl.mechanisms.report import json_number
from ldpfl.silo import (
    BATCH_ROWS,
    SPLIT_CHOICES,
    PredictError,
    Records,
    Silo,
    open_silo,
    release_layout,
    release_rows,
    silo_records,
)
from ldpfl.stage1_features.models import cnn
from ldpfl.stage2_federate.model_file import file_attributes, mismatches, read_model

MODEL_NAME = "model.pt"
CLEAN, RANDOMIZED, RELEASED = "clean", "randomized", "released"

__all__ = ["BATCH_ROWS", "CLEAN", "RANDOMIZED", "RELEASED", "SPLIT_CHOICES", "GlobalModel", "PredictError",
           "Prediction", "Records", "Silo", "check_inputs", "check_model", "default_model_path", "load_global_model",
           "open_silo", "predict_released", "predict_silo", "silo_records"]


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
    others: list[np.ndarray] = field(default_factory=list)  # the predictions of ``others``, in their order

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


def predict_silo(silo: Silo, records: Records, model: GlobalModel, *, randomized: bool = False,
                 rng: np.random.Generator | None = None, cnn_path: Path | None = None,
                 batch_rows: int = BATCH_ROWS, progress: Progress | None = None,
                 others: Sequence[GlobalModel] = ()) -> Prediction:
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
    others : sequence of GlobalModel
        More models (checked as ``model`` is) that predict the same rows, in one pass through the pipeline
        (``Prediction.others``).
    """
    meta = silo.metadata
    warnings = check_inputs(silo, model, cnn_path)
    for other in others:
        check_model(other, meta, f"the release of {silo.file.name}")
    spec = meta.mechanism_spec()
    feature_format = release_layout(meta, randomized).feature_format
    predicted: list[list[np.ndarray]] = [[] for _ in range(1 + len(others))]
    for stored in release_rows(silo, records, randomized=randomized, rng=rng, cnn_path=cnn_path,
                               batch_rows=batch_rows):
        for parts, each in zip(predicted, (model, *others), strict=True):
            parts.append(_logits_argmax(each.model, stored, meta.feature_width, feature_format == PACKED_BITS))
        if progress is not None:
            progress.update(len(stored))
    result = Prediction(records.rows, _concat(predicted[0]), records.labels, meta.class_names, {}, warnings,
                        [_concat(parts) for parts in predicted[1:]])
    privacy = PredictionPrivacy(False, bool(randomized and spec.randomizes), spec.name,
                                meta.privacy_report.exact_epsilon_per_record if randomized else None)
    result.summary = _summary(result, model, RANDOMIZED if randomized else CLEAN, records.description, privacy)
    result.summary |= {"client_index": silo.index, "split": records.split, "feature_format": feature_format}
    return result


def predict_released(path: str | Path, model: GlobalModel, *, split: str = "test",
                     batch_rows: int = BATCH_ROWS, progress: Progress | None = None,
                     others: Sequence[GlobalModel] = ()) -> Prediction:
    """Predict rows already stored in a client file (``client_NNN.h5`` or the clean ``client_NNN.local.h5``).

    These are the model's inputs exactly as ``ldpfl federate`` evaluated them (``test_accuracy`` on the
    client files' test splits, ``clean_test_accuracy`` on the local files'). ``others``: more models that predict
    the same rows (``Prediction.others``).
    """
    if split not in ("train", "test"):
        raise PredictError(f"`split` of a client file is train or test, got {split!r}")
    data = read_client_file(path, splits=(split,))
    meta = data.metadata
    warnings = check_model(model, meta, str(path))
    for other in others:
        check_model(other, meta, str(path))
    features, labels = data.features[split], np.asarray(data.labels[split], dtype=np.int64)
    packed = meta.feature_format == PACKED_BITS
    predicted: list[list[np.ndarray]] = [[] for _ in range(1 + len(others))]
    for start in range(0, len(labels), batch_rows):
        for parts, each in zip(predicted, (model, *others), strict=True):
            parts.append(_logits_argmax(each.model, features[start:start + batch_rows], meta.feature_width, packed))
        if progress is not None:
            progress.update(min(batch_rows, len(labels) - start))
    result = Prediction(np.arange(len(labels), dtype=np.int64), _concat(predicted[0]), labels, meta.class_names, {},
                        warnings, [_concat(parts) for parts in predicted[1:]])
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

