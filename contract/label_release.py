"""The ``label_release`` attribute of a client file: how its labels were released, and what that implies.

A file's labels are either the true classes (``{"mechanism": "clear"}``, ε = ∞ per record for the label) or
k-ary randomized response of each true label (``ldpfl export --label-epsilon E``, issue 22 item 2)::

    {"mechanism": "krr", "epsilon": exact ε, "nominal_epsilon": E, "num_classes": k,
     "p_keep": P(released = true), "p_other_each": P(released = one given other class)}

``p_keep`` and ``p_other_each`` are the probabilities the sampler uses (``mechanisms.krr.KRR``), so the
exact ε is ln(p_keep / p_other_each) and the transition matrix of the label noise is
T[i, j] = P(released j | true i) = p_keep if i = j, else p_other_each (:func:`transition_matrix`).

Stage 1 writes the attribute, stage 2 reads T from it. Imports mechanisms only (no TensorFlow, no torch).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ldpfl.common.errors import LdpflError
from ldpfl.mechanisms.krr import KRR
from ldpfl.mechanisms.validation import MAX_EPSILON

CLEAR = "clear"
KRR_LABELS = "krr"
CLEAR_LABELS: dict[str, Any] = {"mechanism": CLEAR}
"""The attribute of a file whose labels are the true classes."""
ROW_TOLERANCE = 1e-9
"""A transition matrix's rows must sum to 1 within this."""


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


def krr_label_release(mechanism: KRR) -> dict[str, Any]:
    """Return the attribute of labels released by ``mechanism``: its exact ε and sampled probabilities."""
    exact = mechanism.report().exact_epsilon_per_record
    assert exact is not None  # k-RR always has an exact ε per record
    return {"mechanism": KRR_LABELS, "epsilon": float(exact),
            "nominal_epsilon": float(mechanism.epsilon), "num_classes": int(mechanism.categories),
            "p_keep": float(mechanism.p_keep), "p_other_each": float(mechanism.p_other)}


def check_label_release(value: Mapping[str, Any] | None) -> dict[str, Any]:
    """Return a validated copy of a ``label_release`` attribute (``None``, from older files, reads as clear).

    Raises
    ------
    LabelReleaseError
        An unknown mechanism, a missing key, or probabilities that are not a k-RR's (rows of T summing to
        1, p_keep > p_other_each > 0) or that disagree with the stated ε.
    """
    if value is None:
        return dict(CLEAR_LABELS)
    if not isinstance(value, Mapping):
        raise LabelReleaseError(f"label_release must be a JSON object, got {value!r}")
    mechanism = value.get("mechanism")
    if mechanism == CLEAR:
        return dict(value)
    if mechanism != KRR_LABELS:
        raise LabelReleaseError(f"label_release mechanism must be {CLEAR!r} or {KRR_LABELS!r}, got {mechanism!r}")
    for key in ("epsilon", "nominal_epsilon", "num_classes", "p_keep", "p_other_each"):
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
    return dict(value)


def label_epsilon(value: Mapping[str, Any] | None) -> float:
    """Return the exact ε per record of the label release: ∞ for clear labels."""
    release = check_label_release(value)
    return math.inf if release["mechanism"] == CLEAR else float(release["epsilon"])


def transition_matrix(value: Mapping[str, Any] | None) -> np.ndarray | None:
    """Return T (k × k, float64), T[i, j] = P(released j | true i); ``None`` for clear labels (T = I)."""
    release = check_label_release(value)
    if release["mechanism"] == CLEAR:
        return None
    k = int(release["num_classes"])
    matrix = np.full((k, k), float(release["p_other_each"]))
    np.fill_diagonal(matrix, float(release["p_keep"]))
    return matrix


def composed_epsilon(feature_epsilon: float, value: Mapping[str, Any] | None) -> dict[str, Any]:
    """Return the per-record ε of one record's released features and its label: basic composition, ε add.

    Both are pure ε-LDP releases of the same record from independent streams, so ε = ε_features + ε_label
    (Dwork & Roth 2014, Theorem 3.14). With ``--release label`` the features are the predicted class, and
    the two k-RRs compose the same way (docs/privacy.md compares them with one k²-ary RR over the pair).
    """
    label = label_epsilon(value)
    return {"rule": "basic composition (ε add)", "epsilon": float(feature_epsilon) + label,
            "parts": [{"covers": "features", "epsilon": float(feature_epsilon)},
                      {"covers": "labels", "mechanism": check_label_release(value)["mechanism"], "epsilon": label}]}


__all__ = ["CLEAR", "CLEAR_LABELS", "KRR_LABELS", "LabelReleaseError", "check_label_release", "composed_epsilon",
           "krr_label_release", "label_epsilon", "label_mechanism", "transition_matrix"]
