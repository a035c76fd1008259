"""What the low-dimensional LDP mechanisms share: their two input domains, validation and exact samplers.

Two domains, declared as ``DOMAIN``:

* ``category``: one categorical value of k categories per record (``krr``, ``oue-label``). The batch-first
  array holds one-hot rows of width k (any numeric dtype); shape and dtype are kept. ``randomize_labels``
  takes integer labels instead.
* ``bounded``: a vector of d values per record in a box ([-1, 1]^d, or [-c, c]^d for ``laplace``); values
  outside are clipped into it first (``duchi``, ``piecewise``, ``hybrid``, ``laplace``). float32 is kept,
  other numbers give float64.

Sampling is exact in integers: a Bernoulli event of probability T/2^64 is ``u < T`` for a uniform 64-bit word
u (``bernoulli64``; ``randomness.random_words`` gives 64 uniform bits from any numpy bit generator), uniform
choices use ``Generator.integers`` (exact bounded integers), and real inputs enter the continuous-output
mechanisms only through ``secure_noise.randomized_round``. No output is a
float computed from the input's bits, so the reports' ε hold for what is released (Mironov, CCS 2012).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import FLOAT32, Mechanism, param, require_generator
from .calibration_ldp import THRESHOLD_SCALE
from .randomness import random_words
from .report import PrivacyReport
from .secure_noise import randomized_round as round_to_grid
from .validation import require_epsilon, require_int_in_range, require_real_array

CATEGORY = "category"
BOUNDED = "bounded"

MAX_CATEGORIES = 10**7
MAX_DIM = 10**7
MIN_EPSILON = 1e-6  # below it, 64-bit thresholds no longer separate the probabilities of a record's outputs
CHUNK_ELEMENTS = 1 << 20  # values randomized per step: bounds the temporaries of a large batch


def require_ldp_epsilon(name: str, value: float) -> float:
    """ε of a low-dimensional mechanism: 1e-6 <= ε <= 500 (``require_epsilon`` quotes the value first)."""
    require_epsilon(value)
    if value < MIN_EPSILON:
        raise ValueError(f"epsilon must be at least {MIN_EPSILON:g} for {name} (its 64-bit sampler cannot "
                         f"resolve smaller budgets), got {value!r}")
    return float(value)


# --------------------------------------------------------------------------------------------------
# Exact samplers.


def bernoulli64(threshold: int | np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` Bernoulli trials, True with probability exactly T / 2^64 (T an int or a uint64 array)."""
    raw = random_words(size, rng)
    if isinstance(threshold, np.ndarray):
        return raw < threshold
    return raw < np.uint64(threshold)


def probability_thresholds(p: np.ndarray) -> np.ndarray:
    """uint64 thresholds T = round(p · 2^64) for an array of probabilities, clamped to [1, 2^64 - 2048].

    2^64 - 2048 is the largest float64 below 2^64; the map p -> T is monotone (non-decreasing), so the
    extreme thresholds come from the extreme probabilities.
    """
    scaled = np.rint(np.asarray(p, dtype=np.float64) * float(THRESHOLD_SCALE))
    return np.clip(scaled, 1.0, float(THRESHOLD_SCALE - 2048)).astype(np.uint64)


def random_signs(rows: int, width: int, rng: np.random.Generator) -> np.ndarray:
    """Draw a (rows, width) bool array of independent fair bits (True = +1) from uniform 64-bit words."""
    n = rows * width
    words = random_words((n + 63) // 64, rng)
    bits = np.unpackbits(words.view(np.uint8), count=n, bitorder="little")
    return bits.view(np.bool_).reshape(rows, width)


def sample_dimensions(rows: int, d: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """(rows, k) int64: for each row, k distinct dimensions of [0, d) drawn uniformly (WXY19 Algorithm 4, line 2).

    Small k: Floyd's algorithm, one exact bounded integer per step for every row at once (O(rows·k²));
    large k: an independent Fisher-Yates shuffle of each row (``Generator.permuted``, O(rows·d)).
    """
    if k == d:
        return np.broadcast_to(np.arange(d, dtype=np.int64), (rows, d)).copy()
    if k > 64 and k * k > 16 * d:
        return rng.permuted(np.broadcast_to(np.arange(d, dtype=np.int64), (rows, d)), axis=1)[:, :k].copy()
    chosen = np.empty((rows, k), dtype=np.int64)
    for step, top in enumerate(range(d - k, d)):  # Floyd: draw t in [0, top]; take top if t is already chosen
        t = rng.integers(0, top + 1, size=rows, dtype=np.int64)
        taken = (chosen[:, :step] == t[:, None]).any(axis=1)
        chosen[:, step] = np.where(taken, top, t)
    return chosen


def randomized_round(x: np.ndarray, grid: float, *, rng: np.random.Generator) -> np.ndarray:
    """Unbiased stochastic rounding of x/grid to int64 (``ldpfl.mechanisms.secure_noise.randomized_round``)."""
    return round_to_grid(x, grid, rng=rng)


# --------------------------------------------------------------------------------------------------
# Input validation.


def require_one_hot(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(x as an array, the int64 label of each row) for one-hot rows of width k; anything else raises."""
    x = np.asarray(x)
    if x.dtype == np.bool_:
        values = x.view(np.uint8)
    elif np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.floating):
        values = x
    else:
        raise ValueError(f"expected one-hot rows (0/1 numbers), got dtype {x.dtype}")
    if x.ndim == 0 or x.shape[-1] != k:
        raise ValueError(f"one-hot rows must have k = {k} entries on the last axis, got shape {x.shape}")
    flat = values.reshape(-1, k)
    if flat.size:
        if not np.all((flat == 0) | (flat == 1)):
            raise ValueError("one-hot rows must hold only 0 and 1 (one 1 per row); found another value")
        ones = np.count_nonzero(flat, axis=1)
        if np.any(ones != 1):
            bad = int(ones[ones != 1][0])
            raise ValueError(f"each one-hot row must hold exactly one 1, found a row with {bad}")
    return x, np.argmax(flat, axis=1).astype(np.int64).reshape(x.shape[:-1])


def require_labels(labels: np.ndarray, k: int) -> np.ndarray:
    """Integer labels in [0, k) (any shape); anything else raises."""
    labels = np.asarray(labels)
    if not np.issubdtype(labels.dtype, np.integer) or labels.dtype == np.bool_:
        raise ValueError(f"labels must be an integer array, got dtype {labels.dtype}")
    if labels.size and (int(labels.min()) < 0 or int(labels.max()) >= k):
        bad = int(labels.min()) if int(labels.min()) < 0 else int(labels.max())
        raise ValueError(f"labels must lie in [0, k) = [0, {k}), found {bad}")
    return labels


# --------------------------------------------------------------------------------------------------
# Base classes.


@dataclass(frozen=True)
class LDPMechanism(Mechanism):
    """A pure ε-LDP mechanism whose ε is the budget of one whole record."""

    FEATURE_FORMAT: ClassVar[str] = FLOAT32

    epsilon: float = param(1.0, "ε, the privacy budget of one record (pure ε-LDP)")

    def __post_init__(self) -> None:
        require_ldp_epsilon(self.NAME, self.epsilon)

    def _report(self, per_coordinate: float, per_record: float, coordinate: str, record: str,
                probabilities: dict, notes: tuple[str, ...], sensitivity: float | None = None,
                sigma: float | None = None, exact_delta: float = 0.0, thresholds: bool = True) -> PrivacyReport:
        if thresholds:
            notes = (*notes, "probabilities are quantized to 64-bit integer thresholds (an event of probability "
                             "T/2^64 is u < T for a uniform 64-bit word u); the exact epsilon uses those integers")
        return PrivacyReport(
            mechanism=self.NAME, source=self.SOURCE, parameters=self.parameters(),
            nominal_epsilon=self.epsilon, nominal_delta=0.0,
            exact_epsilon_per_coordinate=float(per_coordinate), exact_epsilon_per_record=float(per_record),
            exact_delta=exact_delta, coordinate=coordinate, record=record, sigma=sigma, sensitivity=sensitivity,
            probabilities=probabilities, notes=notes,
        )


@dataclass(frozen=True)
class CategoricalMechanism(LDPMechanism):
    """One categorical value of k categories per record, as a one-hot row (``randomize``) or a label."""

    DOMAIN: ClassVar[str] = CATEGORY
    RECORD_PARAMETER: ClassVar[str | None] = "categories"

    categories: int = param(10, "k, the number of categories (the width of a one-hot row)")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_int_in_range("categories (k)", self.categories, 2, MAX_CATEGORIES)

    def record_size(self) -> int:
        """Return k, the width of a one-hot row."""
        return self.categories

    def randomize(self, x: np.ndarray, *, rng: np.random.Generator) -> np.ndarray:
        """Randomize one-hot rows of shape (..., k); the result has x's shape and dtype."""
        rng = require_generator(rng)
        x, labels = require_one_hot(x, self.categories)
        return self._randomize_one_hot(labels, rng).astype(x.dtype, copy=False)

    def randomize_labels(self, labels: np.ndarray, *, rng: np.random.Generator) -> np.ndarray:  # pragma: no cover
        """Randomize integer labels in [0, k) (see the subclasses for the output)."""
        raise NotImplementedError

    def _randomize_one_hot(self, labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError


@dataclass(frozen=True)
class BoundedMechanism(LDPMechanism):
    """A vector of d values per record, clipped into a box; the last axis holds the d values."""

    DOMAIN: ClassVar[str] = BOUNDED
    RECORD_PARAMETER: ClassVar[str | None] = "dim"

    dim: int = param(10, "d, values per record (the width of the released vector)")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_int_in_range("dim (d)", self.dim, 1, MAX_DIM)

    @property
    def bound(self) -> float:
        """Inputs are clipped to [-bound, bound]."""
        return 1.0

    def randomize(self, x: np.ndarray, *, rng: np.random.Generator) -> np.ndarray:
        """Randomize rows of shape (..., d); values are clipped to [-bound, bound] first. float32 is kept."""
        rng = require_generator(rng)
        x = require_real_array(x)
        if x.ndim == 0 or x.shape[-1] != self.dim:
            raise ValueError(f"{self.NAME} takes rows of d = {self.dim} values on the last axis, got shape {x.shape}")
        dtype = np.float32 if x.dtype == np.float32 else np.float64
        rows = np.clip(x.reshape(-1, self.dim).astype(np.float64), -self.bound, self.bound)
        out = np.empty(rows.shape, dtype=dtype)
        step = max(1, CHUNK_ELEMENTS // self.dim)
        for start in range(0, rows.shape[0], step):  # row blocks bound the temporaries, not a per-value loop
            out[start:start + step] = self._randomize_rows(rows[start:start + step], rng)
        return out.reshape(x.shape)

    def record_size(self) -> int:
        """Return d, the values per record."""
        return self.dim

    def _randomize_rows(self, t: np.ndarray, rng: np.random.Generator) -> np.ndarray:  # pragma: no cover
        """Randomize a (rows, d) float64 block already clipped into the box; return float64."""
        raise NotImplementedError

    def expected_variance(self, x: np.ndarray) -> np.ndarray:  # pragma: no cover
        """Var of each output value given the input x (closed form, per coordinate)."""
        raise NotImplementedError

    def record_name(self) -> str:
        """Describe a record for the privacy report."""
        return f"record of d = {self.dim} values"
