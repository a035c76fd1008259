"""The ``label_release`` attribute of a client file: how its labels were released, and what that implies.

A file's labels are either the true classes (``{"mechanism": "clear"}``, ε = ∞ per record for the label) or
k-ary randomized response of each true label (``ldpfl export --label-epsilon E``, issue 22 item 2)::

    {"mechanism": "krr", "epsilon": exact ε, "nominal_epsilon": E, "num_classes": k,
     "p_keep": P(released = true), "p_other_each": P(released = one given other class)}

A ``stats:K`` release (issue 40) holds synthetic records drawn from per-class statistics: its labels are the
synthetic records' own, post-processing of the noisy per-class statistics (``{"mechanism": "statistics"}``), so
the label part adds nothing (the statistics part covers the true labels) and there is no label noise to correct.

``p_keep`` and ``p_other_each`` are the probabilities the sampler uses (``mechanisms.krr.KRR``), so the
exact ε is ln(p_keep / p_other_each) and the transition matrix of the label noise is
T[i, j] = P(released j | true i) = p_keep if i = j, else p_other_each (:func:`transition_matrix`).

The attribute is read once, at the file boundary, into a frozen :class:`LabelRelease` (:meth:`LabelRelease.from_json`)
and written from one (:meth:`LabelRelease.to_json`); in between, the package passes the record. Stage 1 makes it
(:meth:`LabelRelease.krr`), stage 2 reads T from it. Imports mechanisms only (no TensorFlow, no torch).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ldpfl.common.errors import LdpflError
from ldpfl.mechanisms import accounting
from ldpfl.mechanisms.krr import KRR
from ldpfl.mechanisms.privacy_events import PartEvent, PureEvent, RandomizedResponseEvent
from ldpfl.mechanisms.validation import MAX_EPSILON

CLEAR = "clear"
KRR_LABELS = "krr"
STATISTICS_LABELS = "statistics"
ROW_TOLERANCE = 1e-9
"""A transition matrix's rows must sum to 1 within this."""
KRR_KEYS = ("epsilon", "nominal_epsilon", "num_classes", "p_keep", "p_other_each")


class LabelReleaseError(LdpflError, ValueError):
    """A ``label_release`` attribute that is malformed or inconsistent; the message says which key."""


def label_mechanism(epsilon: float, num_classes: int) -> KRR:
    """Return the k-RR that randomizes the labels at nominal ``epsilon`` over ``num_classes`` classes.

    Raises
    ------
    ValueError
        ``epsilon`` not finite, ≤ 0 or above ``MAX_EPSILON``, or fewer than 2 classes (``KRR``'s validation).
    """
    return KRR(epsilon=float(epsilon), categories=int(num_classes))


@dataclass(frozen=True)
class LabelRelease:
    """How a file's labels were released: in clear, or by k-RR with its exact ε and sampled probabilities.

    Build one with :meth:`krr` (from the sampler), :meth:`for_epsilon` (from ``--label-epsilon``) or
    :meth:`from_json` (the file's attribute, validated); :data:`CLEAR_LABELS` is the clear release. The
    k-RR fields are ``None`` for clear labels.
    """

    mechanism: str = CLEAR
    epsilon: float = math.inf
    """The exact ε per record of the label: ln(p_keep / p_other_each); ∞ for clear labels."""
    nominal_epsilon: float | None = None
    num_classes: int | None = None
    p_keep: float | None = None
    p_other_each: float | None = None

    @property
    def clear(self) -> bool:
        """True for the true labels (ε = ∞)."""
        return self.mechanism == CLEAR

    @property
    def synthetic(self) -> bool:
        """True for the labels of synthetic records drawn from released per-class statistics (no label noise)."""
        return self.mechanism == STATISTICS_LABELS

    @classmethod
    def krr(cls, mechanism: KRR) -> LabelRelease:
        """Return the release of labels randomized by ``mechanism``: its exact ε and sampled probabilities."""
        exact = mechanism.report().exact_epsilon_per_record
        assert exact is not None  # k-RR always has an exact ε per record
        return cls(KRR_LABELS, float(exact), float(mechanism.epsilon), int(mechanism.categories),
                   float(mechanism.p_keep), float(mechanism.p_other))

    @classmethod
    def for_epsilon(cls, epsilon: float | None, num_classes: int) -> LabelRelease:
        """Return the release of ``--label-epsilon epsilon`` over ``num_classes`` classes (``None``: clear)."""
        return CLEAR_LABELS if epsilon is None else cls.krr(label_mechanism(epsilon, num_classes))

    def sampler(self) -> KRR:
        """Return the k-RR that draws the released labels (``ValueError`` for clear labels)."""
        if self.clear or self.nominal_epsilon is None or self.num_classes is None:
            raise ValueError("clear labels have no sampler")
        return label_mechanism(self.nominal_epsilon, self.num_classes)

    def transition_matrix(self) -> np.ndarray | None:
        """Return T (k × k, float64), T[i, j] = P(released j | true i); ``None`` for clear or synthetic labels."""
        if self.clear or self.synthetic:
            return None
        assert self.num_classes is not None and self.p_keep is not None and self.p_other_each is not None
        k = self.num_classes
        matrix = np.full((k, k), self.p_other_each)
        np.fill_diagonal(matrix, self.p_keep)
        return matrix

    def event(self) -> PartEvent:
        """Return what the labels release, as the accountant's event.

        k-RR at its exact ε over k classes; a pure ε of 0 for synthetic labels (post-processing of the statistics);
        None for clear labels (ε = ∞, which no accountant composes).
        """
        if self.clear:
            return None
        if self.synthetic:
            return PureEvent(0.0)
        assert self.num_classes is not None
        return RandomizedResponseEvent(self.epsilon, self.num_classes)

    def to_json(self) -> dict[str, Any]:
        """Return the ``label_release`` attribute (the one writer of the record's JSON form)."""
        if self.clear or self.synthetic:
            return {"mechanism": self.mechanism}
        return {"mechanism": KRR_LABELS, "epsilon": self.epsilon, "nominal_epsilon": self.nominal_epsilon,
                "num_classes": self.num_classes, "p_keep": self.p_keep, "p_other_each": self.p_other_each}

    @classmethod
    def from_json(cls, value: object) -> LabelRelease:
        """Read and validate a ``label_release`` attribute (``None``, from older files, reads as clear).

        Raises
        ------
        LabelReleaseError
            An unknown mechanism, a missing key, or probabilities that are not a k-RR's (rows of T summing to
            1, p_keep > p_other_each > 0) or that disagree with the stated ε.
        """
        if value is None or isinstance(value, LabelRelease):
            return CLEAR_LABELS if value is None else value
        if not isinstance(value, Mapping):
            raise LabelReleaseError(f"label_release must be a JSON object, got {value!r}")
        mechanism = value.get("mechanism")
        if mechanism == CLEAR:
            return CLEAR_LABELS
        if mechanism == STATISTICS_LABELS:
            return SYNTHETIC_LABELS
        if mechanism != KRR_LABELS:
            raise LabelReleaseError(f"label_release mechanism must be {CLEAR!r}, {KRR_LABELS!r} or "
                                    f"{STATISTICS_LABELS!r}, got {mechanism!r}")
        for key in KRR_KEYS:
            if key not in value:
                raise LabelReleaseError(f"label_release of mechanism krr lacks the key {key!r}")
        k, p, q = value["num_classes"], value["p_keep"], value["p_other_each"]
        if isinstance(k, bool) or not isinstance(k, int) or k < 2:
            raise LabelReleaseError(f"label_release num_classes must be an integer >= 2, got {k!r}")
        if not all(isinstance(v, int | float) and math.isfinite(v) for v in (p, q)) or not 0 < q < p <= 1:
            raise LabelReleaseError(f"label_release needs 0 < p_other_each < p_keep <= 1, got {q!r} and {p!r}")
        if abs(p + (k - 1) * q - 1.0) > ROW_TOLERANCE:
            raise LabelReleaseError(f"label_release p_keep + (k - 1)·p_other_each = {p + (k - 1) * q!r}, not 1")
        epsilon = value["epsilon"]
        if not isinstance(epsilon, int | float) or not 0 < epsilon <= MAX_EPSILON \
                or not math.isclose(epsilon, math.log(p / q), rel_tol=1e-6, abs_tol=1e-9):
            raise LabelReleaseError(f"label_release epsilon {epsilon!r} is not ln(p_keep / p_other_each) = "
                                    f"{math.log(p / q)!r}")
        nominal = value["nominal_epsilon"]
        if isinstance(nominal, bool) or not isinstance(nominal, int | float):
            raise LabelReleaseError(f"label_release nominal_epsilon must be a number, got {nominal!r}")
        return cls(KRR_LABELS, float(epsilon), float(nominal), int(k), float(p), float(q))

    def composed_epsilon(self, feature_epsilon: float) -> dict[str, Any]:
        """Return the per-record ε of one record's released features and its label: basic composition, ε add.

        Both are pure ε-LDP releases of the same record from independent streams, so ε = ε_features + ε_label
        (Dwork & Roth 2014, Theorem 3.14). With ``--release label`` the features are the predicted class, and
        the two k-RRs compose the same way (docs/privacy.md compares them with one k²-ary RR over the pair).
        """
        total, _ = accounting.basic_composition([(float(feature_epsilon), 0.0), (self.epsilon, 0.0)])
        return {"rule": "basic composition (ε add)", "epsilon": total,
                "parts": [{"covers": "features", "epsilon": float(feature_epsilon)},
                          {"covers": "labels", "mechanism": self.mechanism, "epsilon": self.epsilon}]}


CLEAR_LABELS = LabelRelease()
"""The release of a file whose labels are the true classes."""
SYNTHETIC_LABELS = LabelRelease(STATISTICS_LABELS, 0.0)
"""The labels of a ``stats:K`` file's synthetic records: post-processing of its statistics (ε 0 of their own)."""


__all__ = ["CLEAR", "CLEAR_LABELS", "KRR_LABELS", "STATISTICS_LABELS", "SYNTHETIC_LABELS", "LabelRelease",
           "LabelReleaseError", "label_mechanism"]
