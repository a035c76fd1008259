"""oue-label: optimized unary encoding of one categorical value into k bits (WBLJ17 Section 4.3).

Named ``oue-label`` because ``oue`` is LDPFL's bit-wise variant over the fixed-point encoding
(mechanisms/oue.py): this one encodes a *categorical value* (the ``label`` release of issue 17) as k bits,
as Wang et al. define OUE.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import numpy as np

from .base import require_generator
from .calibration import bit_epsilon
from .calibration_ldp import (
    THRESHOLD_SCALE,
    frequency_estimate,
    oue_label_probabilities,
    quantize64,
    unary_epsilon,
    unary_epsilon_exact,
)
from .ldp_common import CategoricalMechanism, bernoulli64, require_labels
from .registry import register
from .report import PrivacyReport


@register
@dataclass(frozen=True)
class OUELabel(CategoricalMechanism):
    """One-hot encode the value into k bits, then randomize each bit independently (WBLJ17 4.3).

    The value's own bit is 1 with p = 1/2, every other bit is 1 with q = 1/(e^ε + 1).

    Sampling: a bit is 1 iff u < T for a uniform 64-bit word u, with T_p = 2^63 (p = 1/2 exactly) and
    T_q = round(q·2^64). Exact ε per record: two inputs differ in two positions, and the worst output
    (1 at the first, 0 at the second) has ratio p(1 - q)/((1 - p) q) with the quantized p, q.

    Estimator (WBLJ17 Section 3): ĉ(v) = (C(v) - n q)/(p - q), C(v) = reports with bit v set
    (``estimate_counts``); ``debias`` maps each report y to (y - q)/(p - q), unbiased for the one-hot input.
    """

    NAME: ClassVar[str] = "oue-label"
    SOURCE: ClassVar[str] = "Wang et al. USENIX Security 2017 Sec. 4.3 (OUE of a categorical value)"
    SUMMARY: ClassVar[str] = "optimized unary encoding of one categorical value into k bits"

    @cached_property
    def thresholds(self) -> tuple[int, int]:
        """(T_p, T_q): P(own bit = 1) = T_p/2^64, P(other bit = 1) = T_q/2^64."""
        p, q = oue_label_probabilities(self.epsilon)
        return quantize64(p), quantize64(q)

    @property
    def p(self) -> float:
        """P(own bit = 1) as sampled."""
        return self.thresholds[0] / THRESHOLD_SCALE

    @property
    def q(self) -> float:
        """P(other bit = 1) as sampled."""
        return self.thresholds[1] / THRESHOLD_SCALE

    def randomize_labels(self, labels: np.ndarray, *, rng: np.random.Generator) -> np.ndarray:
        """Encode and randomize integer labels of shape S; returns uint8 bits of shape (*S, k)."""
        rng = require_generator(rng)
        labels = require_labels(labels, self.categories)
        return self._randomize_one_hot(labels.astype(np.int64), rng)

    def _randomize_one_hot(self, labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        flat = labels.reshape(-1)
        k = self.categories
        t_p, t_q = self.thresholds
        bits = bernoulli64(t_q, flat.size * k, rng).reshape(flat.size, k)
        bits[np.arange(flat.size), flat] = bernoulli64(t_p, flat.size, rng)  # the value's own position
        return bits.view(np.uint8).reshape(*labels.shape, k)

    def estimate_counts(self, reports: np.ndarray) -> np.ndarray:
        """Unbiased count of each of the k values among the inputs, from n reports of k bits (WBLJ17 Sec. 3)."""
        y = np.asarray(reports).reshape(-1, self.categories)
        return frequency_estimate(y.sum(axis=0, dtype=np.int64), y.shape[0], self.p, self.q)

    def debias(self, reports: np.ndarray) -> np.ndarray:
        """(y - q)/(p - q) per bit: E[debias(y)] = the one-hot input (float64)."""
        return (np.asarray(reports, dtype=np.float64) - self.q) / (self.p - self.q)

    def report(self) -> PrivacyReport:
        """Return the report: per bit the worst single-bit ratio, per record the two-position ratio."""
        t_p, t_q = self.thresholds
        per_record = unary_epsilon_exact(t_p, t_q)
        per_bit = bit_epsilon(self.p, self.q)
        p, q = oue_label_probabilities(self.epsilon)
        return self._report(
            per_bit, per_record, coordinate="bit",
            record=f"record (one value of k = {self.categories} categories, k bits)",
            probabilities={"p_own_bit": self.p, "q_other_bit": self.q, "p_formula": p, "q_formula": q,
                           "thresholds": [str(t_p), str(t_q)], "formula_epsilon": unary_epsilon(p, q)},
            notes=("per record = ln(p(1-q)/((1-p)q)): two inputs differ in two bit positions; per bit = the "
                   "worst single-bit ratio",),
        )
