"""The three personalizations of a global model on a silo's records (torch).

* :func:`fine_tune_clear`: Adam over shuffled batches of the silo's training records, from the global weights.
* :func:`fine_tune_dp`: the silo's noisy training continued (``silo_training.continuation``) with the
  accountant's σ, q and C, over the same training records the federation's steps covered; plain SGD with
  momentum.
* :func:`train_alone` and :func:`cross_fitted_weight`: the silo's own linear head trained in house from the
  federation's initialization (zero, as Wu et al.'s logistic regression), and the weight w of
  θ = w·θ_global + (1 − w)·θ_alone with the best accuracy over the training records, each scored by an alone model
  trained without its fold (cross-fitting: every record helps choose, none is scored by a model that saw it;
  ties: the lower loss, then the larger w), kept only where it beats the alone model by more than one standard
  error. For a linear head θ_w's logits are w·z_global + (1 − w)·z_alone, so one pass per fold scores every
  weight.

Every draw comes from the generators passed in.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch.nn import functional as F

from ldpfl.stage2_federate.data import ClientSplit
from ldpfl.stage2_federate.model import ADAM, FederatedMLP, initialize, make_optimizer, train_local
from ldpfl.stage2_federate.silo_training.accountant import SiloAccountant
from ldpfl.stage2_federate.silo_training.continuation import continue_training

from .base_model import BaseModel
from .proximal import ProximalSGD
from .records import PersonalizeError
from .settings import PersonalizeSettings

__all__ = ["as_split", "choose_weight", "cross_fitted_weight", "fine_tune_clear", "fine_tune_dp", "interpolate",
           "load_model", "logits", "out_of_fold_logits", "train_alone"]


def load_model(base: BaseModel) -> FederatedMLP:
    """Return the base model's ``FederatedMLP`` with its parameters (on the CPU)."""
    model = FederatedMLP(base.input_width, base.hidden, base.num_classes, base.dropout)
    model.load_state_dict({k: v.to(torch.float32) for k, v in base.state.items()}, strict=True)
    return model


def as_split(features: np.ndarray, labels: np.ndarray, width: int, packed: bool,
             rows: np.ndarray | None = None) -> ClientSplit:
    """Return ``rows`` (default all) of stored features and labels as a ``ClientSplit`` on the CPU."""
    if rows is not None:
        features, labels = features[rows], labels[rows]
    return ClientSplit(torch.from_numpy(np.ascontiguousarray(features)),
                       torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64)), int(width), packed)


def fine_tune_clear(model: FederatedMLP, split: ClientSplit, settings: PersonalizeSettings, *,
                    generator: torch.Generator) -> None:
    """Fine-tune ``model`` in place on ``split`` in clear (Adam, ``epochs`` over shuffled batches)."""
    optimizer = make_optimizer(ADAM, model.parameters(), settings.learning_rate)
    train_local(model, split, epochs=settings.epochs, batch_size=settings.batch_size, optimizer=optimizer,
                generator=generator)


def fine_tune_dp(model: FederatedMLP, split: ClientSplit, accountant: SiloAccountant,
                 settings: PersonalizeSettings, *, generator: torch.Generator,
                 rng: np.random.Generator) -> SiloAccountant:
    """Continue the silo's training for ``settings.steps`` steps on ``model`` in place; return its accountant after.

    ``silo_training.continuation``: the federation's σ, q and C over the same records; SGD with momentum, followed at
    each step by the proximal step of Ditto's λ/2·‖θ − θ_start‖² toward the model it starts from (``proximal``;
    λ = 0: plain SGD). The tie uses no record, so the accountant is the same at every λ.

    Raises
    ------
    AccountantError
        The split does not hold the accountant's records (its count differs).
    """
    optimizer = ProximalSGD(model.parameters(), [p.detach() for p in model.parameters()],
                            proximal=settings.proximal, lr=settings.learning_rate, momentum=settings.momentum)
    return continue_training(model, split, accountant, settings.steps, optimizer=optimizer, generator=generator,
                             rng=rng)


def train_alone(base: BaseModel, split: ClientSplit, settings: PersonalizeSettings, *,
                generator: torch.Generator) -> FederatedMLP:
    """Train the silo's own linear head in house on ``split`` from the federation's initialization (zero)."""
    model = FederatedMLP(base.input_width, base.hidden, base.num_classes, base.dropout)
    initialize(model, generator)
    fine_tune_clear(model, split, settings, generator=generator)
    return model


@torch.no_grad()
def interpolate(first: FederatedMLP, second: FederatedMLP, weight: float) -> FederatedMLP:
    """Return a new model with parameters ``weight``·θ_first + (1 − ``weight``)·θ_second."""
    model = FederatedMLP(first.input_width, first.hidden, first.num_classes, 0.0)
    a, b = first.state_dict(), second.state_dict()
    model.load_state_dict({k: weight * a[k] + (1.0 - weight) * b[k] for k in a}, strict=True)
    return model


@torch.no_grad()
def logits(model: FederatedMLP, split: ClientSplit) -> torch.Tensor:
    """Return the model's logits of every row of ``split`` (evaluation mode)."""
    model.eval()
    return model(split.inputs(slice(None)))


def choose_weight(global_logits: torch.Tensor, alone_logits: torch.Tensor, labels: torch.Tensor,
                  grid: list[float]) -> tuple[float, list[dict[str, float]]]:
    """Return the weight of the global model chosen on ``labels``, and every weight's figures.

    θ_w = w·θ_global + (1 − w)·θ_alone of a linear head has logits w·z_global + (1 − w)·z_alone. The best weight
    (accuracy, ties: the lower loss, then the larger w) is taken only when it beats the alone model (w = 0) by more
    than one standard error of the paired difference, SE = sd(c_w − c_0)/√n over the records' correct indicators
    (the one-standard-error rule, Breiman et al. 1984); otherwise the silo keeps its own model, so a choice on few
    records does not trade the model it has for noise.

    Raises
    ------
    PersonalizeError
        No record to choose on.
    """
    if not len(labels):
        raise PersonalizeError("`method` interpolate needs records to choose the weight on")
    table, correct = [], {}
    for weight in grid:
        mixed = weight * global_logits + (1.0 - weight) * alone_logits
        correct[weight] = (mixed.argmax(dim=1) == labels).double()
        table.append({"weight": weight, "accuracy": float(correct[weight].mean()),
                      "loss": float(F.cross_entropy(mixed, labels))})
    best = max(table, key=lambda row: (row["accuracy"], -row["loss"], row["weight"]))["weight"]
    if 0.0 in correct and best != 0.0:
        gain = correct[best] - correct[0.0]
        standard_error = float(gain.std(correction=0)) / math.sqrt(len(gain))
        if not float(gain.mean()) > standard_error:
            best = 0.0
    return best, table


def out_of_fold_logits(base: BaseModel, features: np.ndarray, labels: np.ndarray, fold: np.ndarray,
                       settings: PersonalizeSettings, *, width: int, packed: bool,
                       generator: torch.Generator) -> torch.Tensor:
    """Return each record's logits under :func:`train_alone` on the other folds (``fold``: each record's fold)."""
    scores = torch.empty(len(labels), base.num_classes)
    for k in np.unique(fold):
        held = np.flatnonzero(fold == k)
        alone = train_alone(base, as_split(features, labels, width, packed, np.flatnonzero(fold != k)), settings,
                            generator=generator)
        scores[torch.from_numpy(held)] = logits(alone, as_split(features, labels, width, packed, held))
    return scores


def cross_fitted_weight(global_model: FederatedMLP, base: BaseModel, features: np.ndarray, labels: np.ndarray,
                        fold: np.ndarray, settings: PersonalizeSettings, *, width: int, packed: bool,
                        generator: torch.Generator) -> tuple[float, list[dict[str, float]]]:
    """Return :func:`choose_weight` over the training records, each scored out of its fold.

    ``fold`` gives each record's fold (``records.fold_assignment``); each fold's alone model is
    :func:`train_alone` on the other folds with ``settings``.

    Raises
    ------
    PersonalizeError
        A model with hidden layers (their units are not aligned between the two models).
    """
    if global_model.hidden:
        raise PersonalizeError(f"`method` interpolate mixes the weights of a linear head; this model has hidden "
                               f"layers {list(global_model.hidden)} (use `method` clear or dp)")
    alone = out_of_fold_logits(base, features, labels, fold, settings, width=width, packed=packed,
                               generator=generator)
    everything = as_split(features, labels, width, packed)
    return choose_weight(logits(global_model, everything), alone, everything.labels, settings.grid())
