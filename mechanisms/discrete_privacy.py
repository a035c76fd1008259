"""Exact privacy of the discrete mechanisms of ``ldpfl.mechanisms.secure_noise``, as pure functions.

Everything is in grid units: an integer query whose value moves by at most Δ (an integer) between two
neighbouring inputs, plus integer noise. CKS = Canonne, Kamath and Steinke, "The Discrete Gaussian for
Differential Privacy", NeurIPS 2020 (arXiv:2004.00010).

* Discrete Gaussian, one coordinate: the tight (ε, δ) curve of CKS Theorem 7,
  δ(ε) = P[Y > εσ²/Δ - Δ/2] - e^ε·P[Y > εσ²/Δ + Δ/2],  Y ~ N_Z(0, σ²),
  which is the smallest δ for the pair of inputs (0, Δ) (``discrete_gaussian_delta`` /
  ``discrete_gaussian_epsilon``).
* Discrete Gaussian, d coordinates with L2 sensitivity Δ₂: a valid (not tight) bound. The 1-D discrete
  Gaussian satisfies D_α(N_Z(0, σ²) ‖ N_Z(v, σ²)) ≤ α v²/(2σ²) for integer v (CKS §2, the discrete Gaussian
  is (Δ²/(2σ²))-zCDP like the continuous one); independent coordinates add Rényi divergences, so the
  d-dimensional mechanism is ρ-zCDP with ρ = Δ₂²/(2σ²) (``discrete_gaussian_rho``). It is turned into
  (ε, δ) by dp-accounting's RDP accountant (``ZCDpEvent(ρ)``: RDP αρ at every order α), which applies
  CKS Proposition 12 (arXiv v4), ε = αρ + log(1 - 1/α) - log(δα)/(α - 1), at the best of its orders
  (``zcdp_epsilon`` / ``zcdp_delta``). Stage 2's ledger composes the same noise with the same accountant,
  so one release gets one ε. The orders are a grid, so ε sits a little above the minimum over all α > 1:
  less than 0.5% above for ρ from 0.01 to 100, up to 10% for ρ from 1e-4 to 1e4 (δ from 1e-9 to 1e-3).
  For d = 1 the tight Theorem 7 curve is smaller and is what the reports use per coordinate.
* Discrete Laplace DLap(t), P(k) ∝ e^(-|k|/t): pure ε = Δ₁/t for L1 sensitivity Δ₁ (the ratio of the pmfs
  at k and k - v is e^((|k - v| - |k|)/t) ≤ e^(|v|/t), multiplied over coordinates).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from numbers import Integral, Real

from . import accounting

DIRECT_SUM_MAX_SIGMA = 256.0
"""Up to this σ, tails are summed term by term; above it, Euler-Maclaurin (|error| < 1e-11 in log P for
tails down to P ≈ e^-200, checked against 30-digit sums in the tests)."""

_TAIL_WIDTH = 40.0  # terms beyond n + 40σ weigh < e^-800 of the first one


def _require_sigma(sigma: float) -> float:
    if isinstance(sigma, bool) or not isinstance(sigma, Real) or not math.isfinite(sigma) or sigma <= 0:
        raise ValueError(f"sigma must be a finite number > 0, got {sigma!r}")
    return float(sigma)


def _require_integer_sensitivity(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 0:
        raise ValueError(f"sensitivity must be an integer >= 0 (in grid units), got {value!r}")
    return int(value)


def _require_delta(delta: float) -> float:
    if isinstance(delta, bool) or not isinstance(delta, Real) or not 0.0 < delta < 1.0:
        raise ValueError(f"delta must lie in the open interval (0, 1), got {delta!r}")
    return float(delta)


def _require_epsilon(epsilon: float) -> float:
    if isinstance(epsilon, bool) or not isinstance(epsilon, Real) or math.isnan(epsilon) or epsilon < 0:
        raise ValueError(f"epsilon must be a number >= 0, got {epsilon!r}")
    return float(epsilon)


# --------------------------------------------------------------------------------------------------
# Discrete Gaussian tails.


def _logsumexp(values) -> float:
    import numpy as np

    values = np.asarray(values, dtype=np.float64)
    top = float(values.max())
    if top == -math.inf:
        return -math.inf
    return top + math.log(float(np.exp(values - top).sum()))


@functools.lru_cache(maxsize=64)
def _log_normalizer_direct(sigma: float) -> float:
    import numpy as np

    half = math.ceil(_TAIL_WIDTH * sigma) + 2
    k = np.arange(-half, half + 1, dtype=np.float64)
    return _logsumexp(-(k * k) / (2.0 * sigma * sigma))


def discrete_gaussian_log_tail(sigma: float, n: int) -> float:
    """Compute log P[Y ≥ n] for Y ~ N_Z(0, σ²) and an integer n.

    σ ≤ ``DIRECT_SUM_MAX_SIGMA``: the terms e^(-k²/(2σ²)) are summed directly (normalizer over |k| ≤ 40σ + 2,
    tail over n ≤ k ≤ n + 40σ + 2; what is left out weighs < e^-800). Larger σ: Euler-Maclaurin,
    Σ_{k≥n} f(k) = ∫_n^∞ f + f(n)/2 - f'(n)/12 + f'''(n)/720 + R with f = e^(-x²/(2σ²)), and the normalizer
    √(2π)σ(1 + 2Σ_m e^(-2π²σ²m²)) (Poisson summation), whose correction is below e^-10000 here.
    For n ≤ 0 the complement P[Y ≥ n] = 1 - P[Y ≥ 1 - n] keeps the precision.
    """
    sigma = _require_sigma(sigma)
    if isinstance(n, bool) or not isinstance(n, Integral):
        raise ValueError(f"n must be an integer, got {n!r}")
    n = int(n)
    if n <= 0:
        upper = discrete_gaussian_log_tail(sigma, 1 - n)
        return math.log1p(-math.exp(upper)) if upper > -math.inf else 0.0
    if sigma <= DIRECT_SUM_MAX_SIGMA:
        import numpy as np

        k = np.arange(n, n + math.ceil(_TAIL_WIDTH * sigma) + 3, dtype=np.float64)
        return _logsumexp(-(k * k) / (2.0 * sigma * sigma)) - _log_normalizer_direct(sigma)
    from scipy import special

    z = n / sigma
    log_integral_part = float(special.log_ndtr(-z))  # ∫_n^∞ f / (√(2π)σ)
    log_f_over_norm = -0.5 * z * z - math.log(math.sqrt(2.0 * math.pi) * sigma)
    u = n / (sigma * sigma)  # -f'(n)/f(n); and f'''(n)/f(n) = -(u³ - 3u/σ²)
    terms = 0.5 + u / 12.0 - (u**3 - 3.0 * u / (sigma * sigma)) / 720.0
    correction = math.exp(log_f_over_norm - log_integral_part) * terms
    return log_integral_part + math.log1p(correction)


def discrete_gaussian_delta(epsilon: float, sigma: float, sensitivity: int) -> float:
    """Tight δ(ε) of k ↦ k + N_Z(0, σ²) for an integer query of sensitivity Δ (CKS Theorem 7).

    For inputs 0 and Δ the worst event is S = {y : P(y - Δ) > e^ε P(y)}, i.e. y ≥ a + Δ with
    a = ⌊εσ²/Δ - Δ/2⌋ + 1 (the privacy loss (2yΔ - Δ²)/(2σ²) exceeds ε there), which gives
    δ = P[Y ≥ a] - e^ε P[Y ≥ a + Δ]. Every integer a gives a lower bound on the hockey-stick divergence and
    the optimal a gives δ, so a and its two neighbours are all tried (float rounding of εσ²/Δ cannot make
    the result smaller than the true δ).
    """
    epsilon = _require_epsilon(epsilon)
    sigma = _require_sigma(sigma)
    delta_int = _require_integer_sensitivity(sensitivity)
    if delta_int == 0:
        return 0.0
    if math.isinf(epsilon):
        return 0.0
    centre = math.floor(epsilon * sigma * sigma / delta_int - delta_int / 2.0) + 1
    best = 0.0
    for a in (centre - 1, centre, centre + 1):
        log_first = discrete_gaussian_log_tail(sigma, a)
        log_second = epsilon + discrete_gaussian_log_tail(sigma, a + delta_int)
        if log_first == -math.inf:
            continue
        value = math.exp(log_first) * -math.expm1(log_second - log_first) if log_second < log_first else 0.0
        best = max(best, value)
    return min(best, 1.0)


def epsilon_upper_bracket(delta_at: Callable[[float], float], delta: float) -> float:
    """Return the first ε of 1, 2, 4, ... with ``delta_at(ε) <= delta``, or ∞ past 1e9.

    ``delta_at`` is a non-increasing δ(ε) curve; the root finders of the exact ε search below the result.
    """
    high = 1.0
    while delta_at(high) > delta:
        high *= 2.0
        if high > 1e9:
            return math.inf
    return high


def discrete_gaussian_epsilon(sigma: float, sensitivity: int, delta: float) -> float:
    """Smallest ε ≥ 0 with δ(ε) ≤ δ on CKS Theorem 7's tight curve (one coordinate, one release)."""
    sigma = _require_sigma(sigma)
    delta_int = _require_integer_sensitivity(sensitivity)
    delta = _require_delta(delta)
    if delta_int == 0 or discrete_gaussian_delta(0.0, sigma, delta_int) <= delta:
        return 0.0
    high = epsilon_upper_bracket(lambda e: discrete_gaussian_delta(e, sigma, delta_int), delta)
    if math.isinf(high):
        return math.inf
    low = 0.0
    # δ(ε) is non-increasing; bisection keeps δ(high) ≤ δ, so the answer never understates ε.
    for _ in range(200):
        mid = 0.5 * (low + high)
        if discrete_gaussian_delta(mid, sigma, delta_int) <= delta:
            high = mid
        else:
            low = mid
        if high - low <= 1e-12 * max(1.0, high):
            break
    return high


# --------------------------------------------------------------------------------------------------
# zCDP (multivariate discrete Gaussian).


def discrete_gaussian_rho(sigma: float, l2_sensitivity: float) -> float:
    """ρ = Δ₂²/(2σ²): zCDP of d independent N_Z(0, σ²) coordinates on an integer vector query (module doc)."""
    sigma = _require_sigma(sigma)
    if isinstance(l2_sensitivity, bool) or not isinstance(l2_sensitivity, Real) or not l2_sensitivity >= 0:
        raise ValueError(f"l2_sensitivity must be a number >= 0, got {l2_sensitivity!r}")
    return float(l2_sensitivity) ** 2 / (2.0 * sigma * sigma)


def _require_rho(rho: float) -> float:
    if isinstance(rho, bool) or not isinstance(rho, Real) or not rho >= 0 or math.isinf(rho):
        raise ValueError(f"rho must be a finite number >= 0, got {rho!r}")
    return float(rho)


def _zcdp(rho: float) -> list[accounting.ZcdpEvent]:
    """One ρ-zCDP event for the package's accountant (dp-accounting's RDP, its default orders)."""
    return [accounting.ZcdpEvent(rho)]


def zcdp_delta(rho: float, epsilon: float) -> float:
    """δ such that ρ-zCDP implies (ε, δ)-DP: dp-accounting's conversion (CKS Proposition 12, arXiv v4)."""
    epsilon = _require_epsilon(epsilon)
    rho = _require_rho(rho)
    if rho == 0.0:
        return 0.0
    return accounting.delta(_zcdp(rho), epsilon, neighbours=accounting.ADD_REMOVE, method=accounting.RDP)


def zcdp_epsilon(rho: float, delta: float) -> float:
    """Smallest ε of dp-accounting's conversion of ρ-zCDP at ``delta`` (CKS Proposition 12, module doc).

    ε = min over the accountant's orders α of αρ + log(1 - 1/α) - log(δα)/(α - 1).
    """
    delta = _require_delta(delta)
    rho = _require_rho(rho)
    if rho == 0.0:
        return 0.0
    return accounting.epsilon(_zcdp(rho), delta, neighbours=accounting.ADD_REMOVE, method=accounting.RDP)


def discrete_gaussian_record_epsilon(sigma: float, l2_sensitivity: float, delta: float) -> float:
    """Compute ε at δ of d independent N_Z(0, σ²) coordinates on an integer vector of L2 sensitivity Δ₂.

    The zCDP bound ρ = Δ₂²/(2σ²) converted by dp-accounting (CKS Proposition 12): valid, not tight.
    """
    return zcdp_epsilon(discrete_gaussian_rho(sigma, l2_sensitivity), delta)


# --------------------------------------------------------------------------------------------------
# Discrete Laplace.


def discrete_laplace_epsilon(scale: float, l1_sensitivity: float) -> float:
    """Pure ε = Δ₁/t of integer noise DLap(t) per coordinate on an integer query of L1 sensitivity Δ₁."""
    if isinstance(scale, bool) or not isinstance(scale, Real) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a finite number > 0, got {scale!r}")
    if isinstance(l1_sensitivity, bool) or not isinstance(l1_sensitivity, Real) or not l1_sensitivity >= 0:
        raise ValueError(f"l1_sensitivity must be a number >= 0, got {l1_sensitivity!r}")
    return float(l1_sensitivity) / float(scale)
