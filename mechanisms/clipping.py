"""Clipping before perturbation.

WU 3.1 reads "if b > c replace b with c, otherwise replace b with -c"; taken literally it would map
every parameter to ±c. The intent (and the only reading under which the sensitivity 2c of eq. 7 holds)
is element-wise clipping to [-c, c], which is what ``clip_elementwise`` does.
"""

from __future__ import annotations

import numpy as np


def clip_elementwise(x: np.ndarray, clip: float) -> np.ndarray:
    """Clip each entry to [-c, c] (WU 3.1, read as intended)."""
    return np.clip(x, -clip, clip)


def clip_l2_norm(x: np.ndarray, max_norm: float) -> np.ndarray:
    """Scale each record (last axis) down so that its L2 norm is at most ``max_norm``."""
    x = np.asarray(x)
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    scale = np.minimum(1.0, max_norm / np.maximum(norms, np.finfo(np.float64).tiny))
    return (x * scale).astype(x.dtype, copy=False)


def clip_to_interval(x: np.ndarray, low: float, high: float) -> np.ndarray:
    """Clip each entry into [low, high] (PLDP safe range τ)."""
    return np.clip(x, low, high)
