"""The silo's own held-out accuracy of a model, overall and per class: computed and kept on the silo.

These figures are computed from the silo's clear test records. They are not released: nothing here adds noise or
is accounted, so they must stay on the silo (the federation's evaluation replies are its noised, accounted ones).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ldpfl.stage2_federate.data import ClientSplit
from ldpfl.stage2_federate.model import FederatedMLP, evaluation_rows

KEPT_ON_SILO = ("computed on the silo's own held-out records in clear and kept on the silo: NOT released (no noise, "
                "not accounted); do not share")

__all__ = ["KEPT_ON_SILO", "OwnAccuracy", "class_accuracy", "own_accuracy", "predict"]


@dataclass(frozen=True)
class OwnAccuracy:
    """Accuracy on the silo's records: overall, and per class (None for a class without records)."""

    records: int
    correct: int
    per_class: tuple[float | None, ...]
    per_class_records: tuple[int, ...]

    @property
    def accuracy(self) -> float | None:
        """Return the share predicted right (None without records)."""
        return self.correct / self.records if self.records else None

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form."""
        return {"accuracy": self.accuracy, "correct": self.correct, "records": self.records,
                "per_class_accuracy": list(self.per_class), "per_class_records": list(self.per_class_records)}


def class_accuracy(predicted: np.ndarray, labels: np.ndarray, num_classes: int) -> OwnAccuracy:
    """Return the accuracy of ``predicted`` against ``labels``, overall and for each of ``num_classes`` classes."""
    predicted, labels = np.asarray(predicted, np.int64), np.asarray(labels, np.int64)
    if predicted.shape != labels.shape:
        raise ValueError(f"predicted {predicted.shape} and labels {labels.shape} differ in shape")
    right = predicted == labels
    counts = np.bincount(labels, minlength=num_classes)[:num_classes]
    hits = np.bincount(labels[right], minlength=num_classes)[:num_classes]
    per_class = tuple(float(h / c) if c else None for h, c in zip(hits.tolist(), counts.tolist(), strict=True))
    return OwnAccuracy(int(labels.size), int(right.sum()), per_class, tuple(int(c) for c in counts))


@torch.no_grad()
def predict(model: FederatedMLP, split: ClientSplit) -> np.ndarray:
    """Return the model's predicted class of every row of ``split`` (eval mode, in file order)."""
    model.eval()
    out = [model(inputs).argmax(dim=1).cpu().numpy() for inputs, _labels in
           split.batches(evaluation_rows(1024, model.input_width))]
    return np.concatenate(out).astype(np.int64) if out else np.empty(0, np.int64)


def own_accuracy(model: FederatedMLP, split: ClientSplit) -> OwnAccuracy:
    """Return ``model``'s accuracy on the silo's ``split``, overall and per class."""
    return class_accuracy(predict(model, split), split.labels.cpu().numpy(), model.num_classes)
