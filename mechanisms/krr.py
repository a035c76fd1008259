"""krr: k-ary (generalized) randomized response for one categorical value (KOV14; WBLJ17 4.1 "GRR")."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import numpy as np

from .base import require_generator
from .calibration_ldp import (
    THRESHOLD_SCALE,
    frequency_estimate,
    grr_change_probability,
    grr_epsilon,
    grr_probabilities,
    log_ratio,
    quantize64,
)
from .ldp_common import CategoricalMechanism, bernoulli64, require_labels
from .registry import register
from .report import PrivacyReport


@register
@dataclass(frozen=True)
class KRR(CategoricalMechanism):
    """Keep the value with p = e^ε/(e^ε + k - 1), else report one of the k - 1 others uniformly.

    Sampling: the value changes iff u < T for a uniform 64-bit word u, with T = round((1 - p)·2^64); the new
    value is an exact uniform integer over the k - 1 others. So P(keep) = 1 - T/2^64 and each other value
    has probability T/(2^64 (k - 1)); the exact ε is ln((2^64 - T)(k - 1)/T) (``report``).

    Estimator (WBLJ17 Section 3): ĉ(v) = (C(v) - n q)/(p - q) with the quantized p and q
    (``estimate_counts``); ``debias`` maps each one-hot report y to (y - q)/(p - q), unbiased for the
    one-hot input.
    """

    NAME: ClassVar[str] = "krr"
    SOURCE: ClassVar[str] = "Kairouz, Oh & Viswanath 2014 (k-RR); Wang et al. USENIX Security 2017 Sec. 4.1 (GRR)"
    SUMMARY: ClassVar[str] = "k-ary randomized response of one categorical value (one-hot rows or labels)"

    @cached_property
    def change_threshold(self) -> int:
        """T with P(change) = T/2^64, the quantized (k - 1)/(e^ε + k - 1)."""
        return quantize64(grr_change_probability(self.epsilon, self.categories))

    @property
    def p_keep(self) -> float:
        """P(report = input), as sampled."""
        return (THRESHOLD_SCALE - self.change_threshold) / THRESHOLD_SCALE

    @property
    def p_other(self) -> float:
        """P(report = one given other value), as sampled."""
        return self.change_threshold / THRESHOLD_SCALE / (self.categories - 1)

    def randomize_labels(self, labels: np.ndarray, *, rng: np.random.Generator) -> np.ndarray:
        """Randomize integer labels in [0, k) of any shape; returns labels of the same shape.

        The dtype is the input's, widened when it cannot hold k - 1 (int8 labels with k = 200 come back as
        int16): a report may be any of the k values, not only those of the input's dtype.
        """
        rng = require_generator(rng)
        labels = require_labels(labels, self.categories)
        dtype = np.promote_types(labels.dtype, np.min_scalar_type(self.categories - 1))
        return self._randomize(labels.reshape(-1).astype(np.int64), rng).reshape(labels.shape).astype(dtype)

    def _randomize(self, flat: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        change = np.flatnonzero(bernoulli64(self.change_threshold, flat.size, rng))
        other = rng.integers(0, self.categories - 1, size=change.size, dtype=np.int64)
        other += other >= flat[change]  # skip the true value: uniform over the k - 1 others
        out = flat.copy()
        out[change] = other
        return out

    def _randomize_one_hot(self, labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        out = self._randomize(labels.reshape(-1), rng)
        rows = np.zeros((out.size, self.categories), dtype=np.uint8)  # the output itself, no k x k matrix
        rows[np.arange(out.size), out] = 1
        return rows.reshape(*labels.shape, self.categories)

    def estimate_counts(self, reported_labels: np.ndarray) -> np.ndarray:
        """Unbiased count of each of the k values among the inputs, from n reported labels (WBLJ17 Sec. 3)."""
        labels = require_labels(reported_labels, self.categories).reshape(-1)
        counts = np.bincount(labels, minlength=self.categories)
        return frequency_estimate(counts, labels.size, self.p_keep, self.p_other)

    def debias(self, reports: np.ndarray) -> np.ndarray:
        """(y - q)/(p - q) for one-hot reports y: E[debias(y)] = the one-hot input (float64)."""
        y = np.asarray(reports, dtype=np.float64)
        return (y - self.p_other) / (self.p_keep - self.p_other)

    def report(self) -> PrivacyReport:
        """Return the report: exact ε = ln((2^64 - T)(k - 1)/T) of the sampled probabilities."""
        k, t = self.categories, self.change_threshold
        exact = log_ratio((THRESHOLD_SCALE - t) * (k - 1), t)
        p, q = grr_probabilities(self.epsilon, k)
        return self._report(
            exact, exact, coordinate="categorical value", record="record (one value of k categories)",
            probabilities={
                "p_keep": self.p_keep, "p_other_each": self.p_other,
                "p_keep_formula": p, "p_other_each_formula": q,
                "change_threshold": str(t), "formula_epsilon": grr_epsilon(p, q),
            },
            notes=(f"k = {k}; exact epsilon = ln(p_keep / p_other) with the sampled probabilities",),
        )
