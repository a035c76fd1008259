"""Aggregation math as pure functions over numpy arrays (no state, no I/O, no torch).

Every function takes the clients' vectors as a sequence of 1-D arrays (or a 2-D array whose rows are
clients) and returns new arrays. Randomness, where a rule needs it, comes from a Generator passed in.
Paper keys: LDPFL = Chamikara et al. (004), WU = Wu, Xu, Zhu (000), PLDP = Shen et al. (002),
FEDAW = Tan et al. (003). What the server keeps across rounds (server momentum, FedAdam's moments) lives in
``server_optimizers``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ldpfl import mechanisms as mech
from ldpfl.mechanisms.base import require_generator


def _as_weights(weights: Sequence[float] | np.ndarray, count: int) -> np.ndarray:
    """Validate ``count`` non-negative finite weights with a positive sum."""
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (count,) or not np.all(np.isfinite(w)) or np.any(w < 0) or not w.sum() > 0:
        raise ValueError(f"weights must be {count} finite numbers >= 0 with a positive sum, got {w.tolist()!r}")
    return w


def weighted_average(vectors: Sequence[np.ndarray] | np.ndarray, weights: Sequence[float] | np.ndarray
                     ) -> np.ndarray:
    """Σ_i w_i x_i / Σ_i w_i.

    The one weighted mean behind WU eq. 12 (w = α_i), FEDAW eq. 2 (w = n_k) and eq. 10 (w = g_k), and,
    with equal weights, LDPFL Algorithm 1 line 21, WU eq. 15 and PLDP eq. 7. Accumulates in float64
    (one client at a time, so a stack of clients is never materialized) and returns the dtype of the
    first vector (float32 model vectors stay float32).
    """
    if len(vectors) == 0:
        raise ValueError("weighted_average needs at least one vector, got none")
    w = _as_weights(weights, len(vectors))
    first = np.asarray(vectors[0])
    if first.ndim != 1:
        raise ValueError(f"each vector must be 1-D, got shape {first.shape}")
    total = np.zeros(first.shape, dtype=np.float64)
    for weight, vector in zip(w / w.sum(), vectors, strict=True):
        vector = np.asarray(vector)
        if vector.shape != first.shape:
            raise ValueError(f"vectors differ in shape: {first.shape} and {vector.shape}")
        if weight:
            total += weight * vector
    out_dtype = first.dtype if np.issubdtype(first.dtype, np.floating) else np.float64
    return total.astype(out_dtype, copy=False)


def mean(vectors: Sequence[np.ndarray] | np.ndarray) -> np.ndarray:
    """Arithmetic mean 1/n Σ_i x_i: LDPFL Algorithm 1 line 21 (LDPFL eq. 1), WU method A, PLDP eq. 7."""
    return weighted_average(vectors, np.ones(len(vectors)))


def sample_size_weights(counts: Sequence[int] | np.ndarray) -> np.ndarray:
    """n_k / n (FEDAW eq. 2, the FedAvg weights)."""
    n = np.asarray(counts, dtype=np.float64)
    return _as_weights(n, n.size) / n.sum()


def inverse_sigma_weights(sigmas: Sequence[float] | np.ndarray) -> np.ndarray:
    """ρ_i / Σ_j ρ_j with ρ_i = 1/σ_i.

    This is WU eq. 11 (the weights α_i of the weighted average) and eq. 14 (the selection
    probabilities P_i): the two equations are the same formula, written once here.
    """
    s = np.asarray(sigmas, dtype=np.float64)
    if s.ndim != 1 or s.size == 0 or not np.all(np.isfinite(s)) or np.any(s <= 0):
        raise ValueError(f"sigmas must be a non-empty list of finite numbers > 0, got {s.tolist()!r}")
    rho = 1.0 / s
    return rho / rho.sum()


def probability_selection_mask(probabilities: Sequence[float] | np.ndarray, omega: float) -> np.ndarray:
    """WU 4.2: client i is selected when P_i > ω (boolean mask)."""
    p = np.asarray(probabilities, dtype=np.float64)
    if not 0.0 <= omega <= 1.0:
        raise ValueError(f"omega must lie in [0, 1], got {omega!r}")
    return p > omega


def draw_omega(probabilities: Sequence[float] | np.ndarray, rng: np.random.Generator) -> float:
    """Draw WU 4.2's uniform ω so that at least one client is selected.

    Decision (WU 4.2 is silent): the P_i sum to 1, so one ω ~ U[0, 1] drawn above max_i P_i selects
    nobody. We redraw ω until somebody is selected; the redrawn ω is then uniform on [0, max_i P_i),
    so we draw that directly: ω = max_i P_i · U with U ~ U[0, 1). The client with the largest P_i is
    therefore always selected, and every client's selection probability keeps its order in P_i.
    """
    p = np.asarray(probabilities, dtype=np.float64)
    if p.ndim != 1 or p.size == 0 or np.any(p < 0) or not p.max() > 0:
        raise ValueError(f"probabilities must be a non-empty list of numbers >= 0 with a positive maximum, "
                         f"got {p.tolist()!r}")
    return float(p.max() * require_generator(rng).random())


def _stack(vectors: Sequence[np.ndarray] | np.ndarray) -> np.ndarray:
    """Return the clients' vectors as rows of a 2-D array (one shape, at least one vector)."""
    if len(vectors) == 0:
        raise ValueError("robust aggregation needs at least one vector, got none")
    first = np.asarray(vectors[0])
    if first.ndim != 1 or any(np.shape(v) != first.shape for v in vectors):
        raise ValueError(f"vectors must be 1-D of one shape, got {[np.shape(v) for v in vectors]}")
    return np.stack([np.asarray(v) for v in vectors])


def _out_dtype(vectors: Sequence[np.ndarray] | np.ndarray) -> np.dtype:
    first = np.asarray(vectors[0])
    return first.dtype if np.issubdtype(first.dtype, np.floating) else np.dtype(np.float64)


def coordinate_median(vectors: Sequence[np.ndarray] | np.ndarray) -> np.ndarray:
    """Coordinate-wise median (Yin et al. 2018, "Byzantine-robust distributed learning", Option II; Flower's FedMedian).

    Each coordinate is the median of the clients' values (the mean of the two middle ones for an even count).
    """
    return np.median(_stack(vectors).astype(np.float64), axis=0).astype(_out_dtype(vectors), copy=False)


def trim_count(fraction: float, count: int) -> int:
    """Values dropped at each end of a coordinate: ⌊β·n⌋, at most ⌊(n − 1)/2⌋ so that one value is left."""
    if not (isinstance(fraction, float | int) and 0.0 <= fraction < 0.5):
        raise ValueError(f"trim fraction beta must lie in [0, 0.5), got {fraction!r}")
    return min(int(math.floor(fraction * count + 1e-9)), (count - 1) // 2)


def trimmed_mean(vectors: Sequence[np.ndarray] | np.ndarray, fraction: float) -> np.ndarray:
    """Coordinate-wise β-trimmed mean (Yin et al. 2018, Option I; Flower's FedTrimmedAvg).

    In each coordinate the ``trim_count(β, n)`` smallest and largest values are dropped and the rest averaged.
    """
    rows = np.sort(_stack(vectors).astype(np.float64), axis=0)
    k = trim_count(fraction, rows.shape[0])
    return rows[k:rows.shape[0] - k].mean(axis=0).astype(_out_dtype(vectors), copy=False)


def clip_to_norm(vector: np.ndarray, bound: float) -> np.ndarray:
    """Scale ``vector`` to an L2 norm of at most ``bound``: x · min(1, C / ‖x‖) (DP-FedAvg's clipping, McMahan 2018)."""
    if not (math.isfinite(bound) and bound >= 0):
        raise ValueError(f"the norm bound must be finite and >= 0, got {bound!r}")
    x = np.asarray(vector, dtype=np.float64)
    norm = float(np.linalg.norm(x))
    return x if norm <= bound else x * (bound / norm)


def norm_clipped_mean(updates: Sequence[np.ndarray] | np.ndarray, weights: Sequence[float] | np.ndarray,
                      bound: float | None = None) -> tuple[np.ndarray, float]:
    """Clip each update to ``bound`` (default: the lower median of their norms), then their weighted mean.

    Norm bounding (Sun et al. 2019, "Can you really backdoor federated learning?"): one update can move the
    model by at most ``bound`` · its weight. Returns the mean (the dtype of the first update) and the bound used.
    """
    rows = _stack(updates).astype(np.float64)
    if bound is None:
        norms = sorted(float(n) for n in np.linalg.norm(rows, axis=1))
        bound = norms[(len(norms) - 1) // 2]
    clipped = [clip_to_norm(row, bound) for row in rows]
    return weighted_average(clipped, weights).astype(_out_dtype(updates), copy=False), float(bound)


def cap_weights(weights: Sequence[float] | np.ndarray, cap: float) -> np.ndarray:
    """Return the weights normalized with none above ``cap``: the excess of a capped client goes to the others.

    Water-filling: clients over the cap are set to it and the rest of the mass is shared by the others in
    proportion to their weights, until none is over. When ``cap`` < 1/n no weighting can respect it: the
    weights are then equal (1/n). Clients of weight 0 stay at 0 (if only they are left uncapped, the capped
    ones are renormalized, which may leave them above ``cap``).
    """
    if not (isinstance(cap, float | int) and 0.0 < cap <= 1.0):
        raise ValueError(f"the weight cap must lie in (0, 1], got {cap!r}")
    w = np.asarray(weights, dtype=np.float64)
    w = _as_weights(w, w.size) / w.sum()
    n = w.size
    if cap * n <= 1.0:
        return np.full(n, 1.0 / n)
    fixed = np.zeros(n, dtype=bool)
    out = w.copy()
    while True:
        free = ~fixed
        mass = 1.0 - cap * fixed.sum()
        total = w[free].sum()
        if total <= 0:
            out[fixed] = cap
            return out / out.sum()
        out[free] = mass * w[free] / total
        out[fixed] = cap
        over = free & (out > cap * (1 + 1e-12))
        if not over.any():
            return out
        fixed |= over


def sign(vector: np.ndarray) -> np.ndarray:
    """WU eq. 9: -1, 0 or +1 per entry (same dtype)."""
    return np.sign(vector)


def apply_update(global_vector: np.ndarray, aggregate: np.ndarray) -> np.ndarray:
    """W ← W + aggregate, when clients upload updates (local − global) instead of parameters."""
    g = np.asarray(global_vector)
    return (g + np.asarray(aggregate, dtype=g.dtype)).astype(g.dtype, copy=False)


def label_similarity_weights(histograms: Sequence[Sequence[int]] | np.ndarray) -> np.ndarray:
    """FEDAW eqs. 7-8: g_k = cos(G_k, S), G_k client k's label distribution, S the uniform one.

    Returns the raw g_k (eq. 10 divides by their sum, as ``weighted_average`` does).
    """
    rows = [np.asarray(h, dtype=np.float64) for h in histograms]
    if not rows:
        raise ValueError("label_similarity_weights needs at least one histogram, got none")
    return np.array([mech.label_distribution_weight(h) for h in rows])


def fraction_count(fraction: float, total: int) -> int:
    """PLDP Algorithm 1 line 4: the server selects γ·N clients.

    Decision: γ·N is rounded down (as FedAvg's m = max(C·K, 1), which DP-FedAW's Algorithm 1 copies),
    with a small tolerance so that 0.7·10 gives 7 despite floating point, and at least one client.
    """
    if not (isinstance(fraction, float | int) and 0.0 < fraction <= 1.0):
        raise ValueError(f"fraction γ must lie in (0, 1], got {fraction!r}")
    if total < 1:
        raise ValueError(f"the number of clients must be >= 1, got {total!r}")
    return max(1, int(math.floor(fraction * total + 1e-9)))
