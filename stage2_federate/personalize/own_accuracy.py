"""A silo's own held-out accuracy, overall and per class, and how it reads: computed and kept on the silo. Torch-free.

These figures come from the silo's records in clear (its held-out test split). Nothing here adds noise or is
accounted, so they are not released: they stay on the silo (what a federation reports is its silos' noised,
accounted evaluation replies). ``ldpfl personalize`` and ``ldpfl predict`` both report them through this module:
the JSON block (:func:`own_heldout`) and its text (:func:`own_heldout_lines`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

KEPT_ON_SILO = ("computed on the silo's own held-out records in clear and kept on the silo: NOT released (no noise, "
                "not accounted); do not share")
OWN_HELDOUT = "own-heldout"
"""``evaluated_on`` of a figure on the silo's own held-out records (the front's pooled figures: ``pooled-test``)."""

__all__ = ["KEPT_ON_SILO", "OWN_HELDOUT", "OwnAccuracy", "class_accuracy", "own_heldout", "own_heldout_lines"]


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
    """Return the accuracy of ``predicted`` against ``labels``, overall and for each of ``num_classes`` classes.

    Raises
    ------
    ValueError
        The two arrays differ in shape, or a label lies outside [0, ``num_classes``).
    """
    predicted, labels = np.asarray(predicted, np.int64), np.asarray(labels, np.int64)
    if predicted.shape != labels.shape:
        raise ValueError(f"predicted {predicted.shape} and labels {labels.shape} differ in shape")
    if labels.size and not (0 <= int(labels.min()) and int(labels.max()) < num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), got {int(labels.min())}..{int(labels.max())}")
    right = predicted == labels
    counts = np.bincount(labels, minlength=num_classes)
    hits = np.bincount(labels[right], minlength=num_classes)
    per_class = tuple(float(h / c) if c else None for h, c in zip(hits.tolist(), counts.tolist(), strict=True))
    return OwnAccuracy(int(labels.size), int(right.sum()), per_class, tuple(int(c) for c in counts))


def own_heldout(figures: Mapping[str, Mapping[str, Any]], **about: Any) -> dict[str, Any]:
    """Return the ``own_heldout`` block of a summary: each model's figures (by role), marked not released.

    ``figures`` maps a role (``global``, ``personalized``, ``alone``) to :meth:`OwnAccuracy.to_json` (plus what
    names the model); ``about`` adds fields (``client_index``, ``inputs``, ...).
    """
    return {"released": False, "evaluated_on": OWN_HELDOUT, "note": KEPT_ON_SILO, **about,
            **{role: dict(values) for role, values in figures.items()}}


ROLES = ("global", "personalized", "alone")


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def own_heldout_lines(block: Mapping[str, Any], names: Mapping[str, str] | None = None) -> list[str]:
    """Return the text of an ``own_heldout`` block: each model's accuracy, then its accuracy per class.

    ``names`` relabels roles in the text (e.g. ``personalized`` as ``personalized (clear, LOCAL ONLY)``).
    """
    roles = [r for r in ROLES if isinstance(block.get(r), Mapping)]
    if not roles:
        return []
    labels = {r: (names or {}).get(r, r) for r in roles}
    first: Mapping[str, Any] = block[roles[0]]
    shown = ", ".join(f"{labels[r]} {_number(block[r].get('accuracy'))}" for r in roles)
    lines = [f"own held-out accuracy ({first.get('records')} records): {shown} -- kept on the silo, NOT released"]
    counts: Sequence[int] = first.get("per_class_records") or ()
    cells = []
    for klass, count in enumerate(counts):
        if count:
            values = "/".join(_number(block[r]["per_class_accuracy"][klass]) for r in roles)
            cells.append(f"{klass}: {values} ({count})")
    if cells:
        lines.append(f"  per class ({' / '.join(labels[r] for r in roles)}; records): {', '.join(cells)}")
    return lines
