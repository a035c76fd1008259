"""The parameters of a personalization, validated at construction (each error names its parameter). Torch-free.

The hyperparameters are the user's (or these defaults); nothing is tuned on the silo's test records. The one
choice made from data, the interpolation weight, is made on the training records by cross-fitting (each record scored
by an alone model trained without it).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ldpfl.stage2_federate.silo_training.accountant import CONTINUED_LR

from .records import PersonalizeError

CLEAR, DP, INTERPOLATE = "clear", "dp", "interpolate"
METHODS = (CLEAR, DP, INTERPOLATE)
LOCAL_ONLY_METHODS = (CLEAR, INTERPOLATE)
CLEAR_LR = 1e-3
"""Adam's learning rate of the in-house training (``clear`` fine-tuning, the ``interpolate`` alone model)."""

__all__ = ["CLEAR", "CLEAR_LR", "DP", "INTERPOLATE", "LOCAL_ONLY_METHODS", "METHODS", "PersonalizeSettings"]


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PersonalizeError(f"`{name}` must be an integer >= 1, got {value!r}")


@dataclass(frozen=True)
class PersonalizeSettings:
    """How a silo personalizes.

    Attributes
    ----------
    method : {"clear", "dp", "interpolate"}
        Clear fine-tuning (local-only), DP fine-tuning continuing the silo's accountant (releasable), or the
        interpolation of the global and the silo's own model (local-only).
    epochs, batch_size : int
        In-house training (``clear``; the alone model of ``interpolate``): Adam over shuffled batches.
    lr : float, optional
        Learning rate; default Adam's ``CLEAR_LR`` in house, SGD's ``CONTINUED_LR`` (the federation's) for ``dp``.
    steps : int
        ``dp``: noisy steps of the silo's training (Poisson batches at the federation's rate q).
    momentum : float
        ``dp``: SGD momentum over the fine-tuning's steps, in [0, 1).
    proximal : float
        ``dp``: Ditto's λ ≥ 0, the weight of λ/2·‖θ − θ_global‖² that ties the model to the global one (a proximal
        step after each noisy step, ``proximal.ProximalSGD``): it keeps more of what the federation learned from the
        other silos. 0: plain SGD.
    max_epsilon : float, optional
        ``dp``: refuse, before training, a fine-tuning that takes the silo's ε (federation plus fine-tuning, its
        neighbouring relation) past this.
    folds : int
        ``interpolate``: the weight is chosen by ``folds``-fold cross-fitting over the training records (each record
        scored by an alone model trained on the other folds); the alone model that is mixed trains on them all.
    weights : int
        ``interpolate``: the weights tried, evenly from 0 (alone) to 1 (global).
    """

    method: str
    epochs: int = 10
    batch_size: int = 32
    lr: float | None = None
    steps: int = 30
    momentum: float = 0.0
    proximal: float = 0.0
    max_epsilon: float | None = None
    folds: int = 5
    weights: int = 11

    def __post_init__(self) -> None:
        """Refuse a value outside its range, naming the parameter."""
        if self.method not in METHODS:
            raise PersonalizeError(f"`method` must be one of {', '.join(METHODS)}, got {self.method!r}")
        for name in ("epochs", "batch_size", "steps"):
            _positive_int(name, getattr(self, name))
        if self.lr is not None and not (isinstance(self.lr, int | float) and math.isfinite(self.lr) and self.lr > 0):
            raise PersonalizeError(f"`lr` must be a finite number > 0, got {self.lr!r}")
        if not (isinstance(self.momentum, int | float) and 0.0 <= self.momentum < 1.0):
            raise PersonalizeError(f"`momentum` must lie in [0, 1), got {self.momentum!r}")
        if not (isinstance(self.proximal, int | float) and math.isfinite(self.proximal) and self.proximal >= 0):
            raise PersonalizeError(f"`proximal` must be a finite number >= 0, got {self.proximal!r}")
        if self.proximal and self.method != DP:
            raise PersonalizeError(f"`proximal` ties DP fine-tuning to the global model (`method` dp), not "
                                   f"{self.method}")
        if self.max_epsilon is not None:
            if not (isinstance(self.max_epsilon, int | float) and math.isfinite(self.max_epsilon)
                    and self.max_epsilon > 0):
                raise PersonalizeError(f"`max_epsilon` must be a finite number > 0, got {self.max_epsilon!r}")
            if self.method != DP:
                raise PersonalizeError(f"`max_epsilon` bounds DP fine-tuning (`method` dp); {self.method} makes a "
                                       "local-only model (epsilon = inf if shipped)")
        _positive_int("folds", self.folds)
        if self.folds < 2:
            raise PersonalizeError(f"`folds` must be >= 2, got {self.folds}")
        _positive_int("weights", self.weights)
        if self.weights < 2:
            raise PersonalizeError(f"`weights` must be >= 2 (0 and 1 at least), got {self.weights}")

    @property
    def local_only(self) -> bool:
        """Return whether the method's model stays on the silo (ε = ∞ if shipped)."""
        return self.method in LOCAL_ONLY_METHODS

    @property
    def learning_rate(self) -> float:
        """Return ``lr``, or the method's default."""
        if self.lr is not None:
            return float(self.lr)
        return CONTINUED_LR if self.method == DP else CLEAR_LR

    def grid(self) -> list[float]:
        """Return the interpolation weights tried (of the global model), 0 to 1."""
        return [i / (self.weights - 1) for i in range(self.weights)]

    def to_json(self) -> dict[str, Any]:
        """Return the settings that apply to the method, with the learning rate resolved."""
        values = asdict(self) | {"lr": self.learning_rate}
        used = {CLEAR: ("epochs", "batch_size"), DP: ("steps", "momentum", "proximal", "max_epsilon"),
                INTERPOLATE: ("epochs", "batch_size", "folds", "weights")}[self.method]
        return {k: v for k, v in values.items() if k in ("method", "lr", *used)}
