"""Parameter validation shared by every mechanism.

Each check raises ``ValueError`` that quotes the offending value and the allowed range, so that a
CLI can show it as a one-line usage error.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import numpy as np


def require_finite_positive(name: str, value: float) -> float:
    """Return ``value`` as float if it is a finite real number > 0."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


MAX_EPSILON = 500.0

MAX_RECORD_SIZE = 10_000_000
"""Largest record size (r features, d coordinates): the HDF5 schema's width limit (contract.schema)."""


def require_epsilon(value: float) -> float:
    """Check a privacy budget: finite, > 0 and at most ``MAX_EPSILON`` (beyond, e^ε overflows and means nothing)."""
    require_finite_positive("epsilon", value)
    if value > MAX_EPSILON:
        raise ValueError(f"epsilon must be at most {MAX_EPSILON:g}, got {value!r}")
    return float(value)


def require_finite(name: str, value: float) -> float:
    """Return ``value`` as float if it is a finite real number."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def require_open_unit_interval(name: str, value: float) -> float:
    """Return ``value`` as float if 0 < value < 1."""
    if isinstance(value, bool) or not isinstance(value, Real) or not (0.0 < value < 1.0):
        raise ValueError(f"{name} must lie in the open interval (0, 1), got {value!r}")
    return float(value)


def require_int_in_range(name: str, value: int, low: int, high: int | None = None) -> int:
    """Return ``value`` if it is an integer with ``low <= value <= high``."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < low or (
        high is not None and value > high
    ):
        allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return int(value)


def require_record_size(name: str, value: int) -> int:
    """Return ``value`` if it is an integer in [1, ``MAX_RECORD_SIZE``] (r or d, values per record).

    The bound is the HDF5 schema's largest feature width; above it a mechanism would fail later with a
    MemoryError instead of a one-line error.
    """
    value = require_int_in_range(name, value, 1)
    if value > MAX_RECORD_SIZE:
        raise ValueError(f"{name} must be an integer <= {MAX_RECORD_SIZE} (the HDF5 schema's width limit), "
                         f"got {value!r}")
    return value


def require_choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
    return value


def require_bits(bits: np.ndarray, width: int) -> np.ndarray:
    """Return ``bits`` as a uint8 array of 0/1 whose last axis has ``width`` entries."""
    bits = np.asarray(bits)
    if bits.dtype == np.bool_:
        bits = bits.view(np.uint8)
    elif bits.dtype != np.uint8:
        if not np.issubdtype(bits.dtype, np.integer):
            raise ValueError(f"bits must be an integer or boolean array of 0/1, got dtype {bits.dtype}")
        if bits.size and bits.min() < 0:
            raise ValueError(f"bits must be 0 or 1, found the value {int(bits.min())}")
        bits = bits.astype(np.uint8) if bits.size == 0 or (bits.min() >= 0 and bits.max() <= 1) else bits
    if bits.ndim == 0 or bits.shape[-1] != width:
        raise ValueError(f"bits must have {width} entries on the last axis (r*l), got shape {bits.shape}")
    if bits.size and bits.max() > 1:
        raise ValueError(f"bits must be 0 or 1, found the value {int(bits.max())}")
    return bits


def require_real_array(x: np.ndarray) -> np.ndarray:
    """Return ``x`` as a floating array (float32 is kept; other numbers become float64)."""
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.floating):
        if not np.issubdtype(x.dtype, np.number) or np.issubdtype(x.dtype, np.complexfloating):
            raise ValueError(f"expected a real-valued array, got dtype {x.dtype}")
        x = x.astype(np.float64)
    if x.size and not np.all(np.isfinite(x)):
        raise ValueError("input holds NaN or infinite values; randomize only finite numbers")
    return x


def require_records(mechanism: str, x: np.ndarray, width: int | None, parameter: str) -> np.ndarray:
    """Return ``x`` as a real array of records on its last axis, of ``width`` values when declared.

    Refuses (one-line ``ValueError`` naming ``mechanism`` and the declared ``parameter``) a 0-d value, which has no
    record axis, and records of another width than the declared one.
    """
    x = require_real_array(x)
    if x.ndim == 0:
        raise ValueError(f"{mechanism} takes records on the last axis of a batch-first array, got a 0-d value")
    if width is not None and x.shape[-1] != width:
        raise ValueError(f"{mechanism} was declared with {parameter} = {width} values per record, got records of "
                         f"{x.shape[-1]} values (shape {x.shape})")
    return x
