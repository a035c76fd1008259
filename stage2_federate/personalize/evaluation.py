"""The silo's own held-out accuracy of a model (torch): its predictions, scored by ``own_accuracy`` (torch-free).

These figures are computed from the silo's clear test records and kept on the silo: not released.
"""

from __future__ import annotations

import numpy as np
import torch

from ldpfl.stage2_federate.data import ClientSplit
from ldpfl.stage2_federate.model import FederatedMLP, evaluation_rows

from .own_accuracy import KEPT_ON_SILO, OwnAccuracy, class_accuracy

__all__ = ["KEPT_ON_SILO", "OwnAccuracy", "class_accuracy", "own_accuracy", "predict"]


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
