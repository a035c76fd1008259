"""Clipping before perturbation.

WU 3.1 reads "if b > c replace b with c, otherwise replace b with -c"; taken literally it would map
every parameter to ±c. The intent (and the only reading under which the sensitivity 2c of eq. 7 holds)
is element-wise clipping to [-c, c], which is what ``clip_elementwise`` does.
"""

from __future__ import annotations

import numpy as np


def clip_elementwise(x: np.ndarray, clip: float) -> np.ndarray:
    """Clip each entry to [-c, c] in float64 (WU 3.1, read as intended).

    In float64, so the bound is c itself: clipping a float16 input in float16 would round c = 0.3 up to
    0.30005, beyond the bound the sensitivity assumes.
    """
    return np.clip(np.asarray(x, dtype=np.float64), -clip, clip)


def clip_l2_norm(x: np.ndarray, max_norm: float) -> np.ndarray:
    """Scale each record (last axis) down so that its L2 norm is at most ``max_norm``; float64.

    The norm is taken of x/m, m = max_j |x_j| (entries in [-1, 1], so no square overflows or underflows),
    and compared with max_norm/m: the square of |x_j| ≳ 1e154 is inf in float64, which scaled such a record
    to the zero vector.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 0:
        raise ValueError("clip_l2_norm takes records on the last axis, got a 0-d value")
    if x.shape[-1] == 0:
        return x.copy()
    peak = np.max(np.abs(x), axis=-1, keepdims=True)
    unit = x / np.where(peak > 0.0, peak, 1.0)  # the record over its largest |entry|: entries in [-1, 1]
    unit_norm = np.linalg.norm(unit, axis=-1, keepdims=True)  # in [1, sqrt(d)] (0 for a zero record)
    too_long = peak * unit_norm > max_norm  # |x| > max_norm (an overflowing product is inf: too long too)
    return np.where(too_long, unit * (max_norm / np.where(too_long, unit_norm, 1.0)), x)


def clip_to_interval(x: np.ndarray, low: float, high: float) -> np.ndarray:
    """Clip each entry into [low, high] (PLDP safe range τ), in float64."""
    return np.clip(np.asarray(x, dtype=np.float64), low, high)
