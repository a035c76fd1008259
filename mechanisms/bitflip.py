"""The shared randomizer of every bit mechanism (UER, MOUE, OUE, RR).

Probabilities become integer thresholds on 32-bit uniform draws: out = 1 iff u < T, with
T = round(p · 2^32). The privacy report is computed from T / 2^32, the probabilities the code really
uses, not from the real-valued p.

Speed: one uniform 64-bit word (``randomness.random_words``: full 64 bits from any numpy bit generator,
MT19937 included) yields two 32-bit uniforms; the per-position threshold is
T0 + bit · (T1 - T0) in wrapping uint32 arithmetic (no ``np.where``), and rows are processed in
cache-sized chunks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import numpy as np

from .base import PACKED_BITS, Mechanism, param, require_generator
from .calibration import BitClass, bit_epsilon
from .encoding import FixedPointEncoding
from .randomness import random_words
from .report import PrivacyReport
from .validation import require_bits, require_choice, require_epsilon, require_record_size

THRESHOLD_BITS = 32
THRESHOLD_SCALE = float(1 << THRESHOLD_BITS)
CHUNK_ELEMENTS = 1 << 18
SENSITIVITY_RULES = ("paper", "reference-code")


def quantize_probability(p: float) -> int:
    """Return the integer threshold T (0 <= T < 2^32) for P(out = 1) = p."""
    return int(min(max(round(p * THRESHOLD_SCALE), 0), (1 << THRESHOLD_BITS) - 1))


def randomize_bits(bits: np.ndarray, threshold_if_zero: np.ndarray, threshold_if_one: np.ndarray, *,
                   rng: np.random.Generator) -> np.ndarray:
    """Randomize 0/1 bits of shape (..., W) with per-position uint32 thresholds of shape (W,)."""
    width = bits.shape[-1]
    flat = bits.reshape(-1, width)
    out = np.empty_like(flat)
    step = (threshold_if_one - threshold_if_zero).astype(np.uint32)  # wraps mod 2^32 on purpose
    rows = max(1, CHUNK_ELEMENTS // max(width, 1))
    for start in range(0, flat.shape[0], rows):
        chunk = flat[start:start + rows]
        n = chunk.size
        uniforms = random_words((n + 1) // 2, rng).view(np.uint32)[:n].reshape(chunk.shape)
        thresholds = chunk * step
        thresholds += threshold_if_zero
        np.less(uniforms, thresholds, out=out[start:start + rows].view(np.bool_))
    return out.reshape(bits.shape)


@dataclass(frozen=True)
class BitMechanism(Mechanism):
    """A mechanism over the r·l bits of a fixed-point encoded record.

    Sensitivity s: ``paper`` takes s = r·l (LDPFL III-B-2: two records can differ in all r·l bits);
    ``reference-code`` takes s = r·l/2, as the authors' public code does.
    """

    DOMAIN: ClassVar[str] = "bits"
    FEATURE_FORMAT: ClassVar[str] = PACKED_BITS
    RECORD_PARAMETER: ClassVar[str | None] = "features"
    CLASS_NAMES: ClassVar[tuple[str, ...]] = ("all",)

    epsilon: float = param(0.5, "nominal privacy budget ε of one record")
    integer_bits: int = param(4, "m, integer bits of the fixed-point encoding", "-m")
    fraction_bits: int = param(5, "n, fraction bits of the fixed-point encoding", "-n")
    features: int = param(1152, "r, values per record (flatten width)")
    sensitivity_rule: str = param("paper", "paper: s = r*l; reference-code: s = r*l/2")

    def __post_init__(self) -> None:
        """Validate ε, r, the sensitivity rule, m and n."""
        require_epsilon(self.epsilon)
        require_record_size("features (r)", self.features)
        require_choice("sensitivity_rule", self.sensitivity_rule, SENSITIVITY_RULES)
        self.encoding  # validates m and n  # noqa: B018

    @cached_property
    def encoding(self) -> FixedPointEncoding:
        """The fixed-point encoding of m and n (LDPFL eq. 14)."""
        return FixedPointEncoding(self.integer_bits, self.fraction_bits)

    def fixed_point_encoding(self) -> FixedPointEncoding:
        """Return the encoding of its m and n (LDPFL eq. 14)."""
        return self.encoding

    @property
    def width(self) -> int:
        """r·l bits per record."""
        return self.features * self.encoding.bits_per_value

    @property
    def sensitivity(self) -> float:
        """The sensitivity s: r·l (``paper``) or r·l/2 (``reference-code``)."""
        return float(self.width) if self.sensitivity_rule == "paper" else self.width / 2.0

    def bit_classes(self) -> tuple[BitClass, ...]:  # pragma: no cover - abstract
        """Return the probabilities of each class of positions (the mechanism's equations)."""
        raise NotImplementedError

    def position_classes(self) -> np.ndarray:
        """Class index of each of the r·l positions (all 0 unless a mechanism has several classes)."""
        return np.zeros(self.width, dtype=np.intp)

    @cached_property
    def _thresholds(self) -> tuple[np.ndarray, np.ndarray]:
        classes = self.bit_classes()
        t0 = np.array([quantize_probability(c.p_one_given_zero) for c in classes], dtype=np.uint32)
        t1 = np.array([quantize_probability(c.p_one_given_one) for c in classes], dtype=np.uint32)
        index = self.position_classes()
        return t0[index], t1[index]

    def effective_bit_classes(self) -> tuple[BitClass, ...]:
        """Return the probabilities the randomizer really uses (after quantizing to 32-bit thresholds)."""
        return tuple(
            BitClass(c.name, quantize_probability(c.p_one_given_one) / THRESHOLD_SCALE,
                     quantize_probability(c.p_one_given_zero) / THRESHOLD_SCALE)
            for c in self.bit_classes()
        )

    def randomize(self, x: np.ndarray, *, rng: np.random.Generator) -> np.ndarray:
        """Randomize uint8 0/1 bits of shape (..., r·l); returns uint8 bits of the same shape."""
        bits = require_bits(x, self.width)
        t0, t1 = self._thresholds
        return randomize_bits(bits, t0, t1, rng=require_generator(rng))

    def randomize_features(self, features: np.ndarray, *, rng: np.random.Generator) -> np.ndarray:
        """Encode real features of shape (..., r) (eq. 14) and randomize the bits."""
        return self.randomize(self.encoding.encode(features), rng=rng)

    def expected_density(self, input_density: np.ndarray) -> np.ndarray:
        """Return the expected density of 1s per position after randomization, given the input density."""
        t0, t1 = self._thresholds
        d = np.asarray(input_density, dtype=np.float64)
        return d * (t1 / THRESHOLD_SCALE) + (1.0 - d) * (t0 / THRESHOLD_SCALE)

    def report(self) -> PrivacyReport:
        """Report the exact ε per bit and per record from the quantized probabilities."""
        effective = self.effective_bit_classes()
        per_class = np.array([bit_epsilon(c.p_one_given_one, c.p_one_given_zero) for c in effective])
        counts = np.bincount(self.position_classes(), minlength=len(effective))
        per_record = float(np.dot(counts, per_class)) if np.all(np.isfinite(per_class)) else math.inf
        l = self.encoding.bits_per_value
        per_feature = float(per_class[self.position_classes().reshape(self.features, l)].sum(axis=1).max())
        probabilities = {}
        for nominal, real, eps in zip(self.bit_classes(), effective, per_class, strict=True):
            probabilities[f"class {nominal.name}"] = {
                "positions": int(counts[self.CLASS_NAMES.index(nominal.name)]),
                "p_one_given_one": real.p_one_given_one,
                "p_one_given_zero": real.p_one_given_zero,
                "p_one_given_one_formula": nominal.p_one_given_one,
                "p_one_given_zero_formula": nominal.p_one_given_zero,
                "exact_epsilon_per_bit": float(eps),
            }
        notes = [
            f"sensitivity s = {self.sensitivity:g} ({self.sensitivity_rule} rule; r*l = {self.width})",
            f"exact epsilon per feature value ({l} bits): {per_feature:.6g}",
            "per record = sum of per-bit epsilons over all r*l positions: every bit pattern is reachable, "
            "so the worst pair of inputs differs in every bit",
            "probabilities are quantized to 32-bit thresholds; the exact epsilon uses the quantized values",
        ]
        return PrivacyReport(
            mechanism=self.NAME,
            source=self.SOURCE,
            parameters=self.parameters(),
            nominal_epsilon=self.epsilon,
            nominal_delta=0.0,
            exact_epsilon_per_coordinate=float(per_class.max()),
            exact_epsilon_per_record=per_record,
            exact_delta=0.0,
            coordinate="bit",
            record=f"record of r*l = {self.width} bits",
            sensitivity=self.sensitivity,
            probabilities=probabilities,
            notes=tuple(notes) + self.extra_notes(),
        )

    def extra_notes(self) -> tuple[str, ...]:
        """Return notes a mechanism adds to its report."""
        return ()
