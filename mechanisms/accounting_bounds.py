"""A fast, valid bracket [lower, upper] of the ε that :mod:`ldpfl.mechanisms.accounting` gives, in numpy alone.

``ldpfl inspect`` checks that a file's stored guarantee does not claim less than its parts give. Recomputing the
PLD of a DP-SGD part exactly costs seconds (dp-accounting alone takes about 1.8 s to import); this module bounds
the same figure in numpy alone, so a stored figure inside the bracket is accepted at once and one outside it is
recomputed exactly (the caller's choice).

The pair of distributions is dp-accounting's own for REPLACE_ONE (``privacy_loss_mechanism.AdditiveNoisePrivacyLoss``,
"REPLACE adjacency type" with Poisson sampling; Zhu, Dong, Wang 2022, Theorem 11): one step of DP-SGD with noise
multiplier σ and Poisson rate q, in units of the clipping norm,

    P = (1 − q)·N(0, σ²) + q·N(1, σ²)    against    Q = (1 − q)·N(0, σ²) + q·N(−1, σ²),

the record's clipped gradient being +C on one side and −C on the other. Both are reached by two real neighbouring
data sets (two records whose gradients are opposite), so the (ε, δ) of T steps of this pair is a *lower* bound on
the mechanism's, and dp-accounting's pessimistic figure an upper bound on it. k-RR and binary RR (every other pure
part) have exact three- and two-point privacy-loss distributions (losses ε, 0, −ε).

Method: the privacy-loss distribution (PLD; Meiser and Mohammadi 2018; Koskela, Jälkö, Honkela 2020) of each step,
L = ln(P(Y)/Q(Y)) with Y ~ P, is discretized on a grid of width h by rounding every loss **down** (the
"optimistic" PLD of Meiser and Mohammadi 2018, Section 5), mass far in the lower tail is dropped (a loss of −∞)
and mass far in the upper tail is rounded down to the largest kept loss; the steps and the pure parts are
composed by convolution (FFT). Every change lowers the losses, so the hockey-stick divergence

    δ(ε) = E_P[(1 − e^{ε − L})₊]                         (Balle et al. 2018, Theorem 5; Sommer et al. 2019)

computed from it is at most the true one, and the ε it gives at δ is a lower bound. Rounding up instead moves each
event's loss by at most h, so the same distribution shifted by (T + parts)·h, with the dropped and capped mass η
counted as δ, gives an upper bound: ``upper = ε_shifted(δ − η)``. The FFT's rounding error (bounded in
:data:`FFT_ERROR`, accumulated over every convolution) is added to δ on the lower side and removed on the upper side.

For a Poisson-sampled Gaussian, L is increasing in Y: with u = e^{Y/σ²} and a = q·e^{−1/(2σ²)},
P(Y)/Q(Y) = ((1 − q) + a·u)/((1 − q) + a/u), whose inverse is a root of a·u² + (1 − q)(1 − r)·u − r·a = 0; each
grid bucket is an interval of Y, and its P-mass is a difference of Gaussian tails (``math.erfc``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from .accounting import DpSgdEvent, PureEvent, RandomizedResponseEvent

TAIL_MASS = 1e-14
"""The P-mass cut from each tail of one step's PLD and of each composition (counted in η)."""
FFT_ERROR = 50 * 2.0**-53
"""Times log2(n)·√n, a bound on |Σ w·(ĉ − c)| for weights w in [0, 1] of the FFT convolution ĉ of two probability
vectors of length n: Higham 2002, Theorem 24.2 (‖ŷ − y‖₂ <= log2(n)·η·‖y‖₂, η ≈ 6u) for the two forward and the
inverse transforms, ‖Fa‖∞ <= ‖a‖₁ = 1, ‖a‖₂ <= 1, and |Σ w·e| <= √n·‖e‖₂."""
WIDTH = 0.02
"""The bracket's target width in ε: the grid is h = WIDTH / (T + 2), no finer than MIN_GRID and MAX_BUCKETS allow."""
MAX_BUCKETS = 1 << 16
"""The most grid buckets of one step's PLD (keeps one file's check within tens of milliseconds)."""
MIN_GRID = 1e-4
"""The finest grid (dp-accounting's own default): T steps are bracketed within about (T + parts)·1e-4."""
_TAIL_SIGMAS = 7.7  # Φ̄(7.7) < 1e-14


@dataclass(frozen=True)
class Bracket:
    """ε at δ lies in [lower, upper] (both valid bounds); ``grid`` is the discretization h used."""

    lower: float
    upper: float
    grid: float

    def holds(self, value: float, *, slack: float = 1e-9) -> bool:
        """Return whether ``value`` lies in the bracket (within a relative ``slack``)."""
        return self.lower * (1 - slack) - slack <= value <= self.upper * (1 + slack) + slack


@dataclass(frozen=True)
class _Pld:
    """A discretized PLD: ``mass[i]`` at loss (offset + i)·grid.

    ``cut`` is the tail mass removed, ``error`` the FFT error bound accumulated.
    """

    offset: int
    mass: np.ndarray
    grid: float
    cut: float
    error: float
    events: int  # how many events were rounded (each by at most one grid step)


_erfc = np.frompyfunc(math.erfc, 1, 1)


def _upper_tail(y: np.ndarray, sigma: float, q: float) -> np.ndarray:
    """P(Y > y) for Y ~ (1 − q)·N(0, σ²) + q·N(1, σ²)."""
    scale = sigma * math.sqrt(2.0)
    return 0.5 * ((1.0 - q) * np.asarray(_erfc(y / scale), dtype=float)
                  + q * np.asarray(_erfc((y - 1.0) / scale), dtype=float))


def _loss(y: float, sigma: float, q: float) -> float:
    """ln(P(y)/Q(y)) for the pair of the module docstring."""
    a = q * math.exp(-0.5 / sigma**2)
    log_u = y / sigma**2
    up = math.log((1 - q) + a * math.exp(log_u)) if log_u < 700 else math.log(a) + log_u
    down = math.log((1 - q) + a * math.exp(-log_u)) if -log_u < 700 else math.log(a) - log_u
    return up - down


def _y_of_loss(losses: np.ndarray, sigma: float, q: float) -> np.ndarray:
    """Return the y at which ln(P(y)/Q(y)) equals each of ``losses`` (the stable root of a·u² + b·u − r·a = 0)."""
    a = q * math.exp(-0.5 / sigma**2)
    r = np.exp(losses)
    b = (1.0 - q) * (1.0 - r)
    root = np.sqrt(b * b + 4.0 * a * a * r)
    u = np.where(b > 0, 2.0 * r * a / (b + root), (root - b) / (2.0 * a))
    return sigma**2 * np.log(u)


def _sgd_step(sigma: float, q: float, grid: float) -> _Pld:
    """One DP-SGD step's PLD, every loss rounded down to the grid."""
    y_low, y_high = -1.0 - _TAIL_SIGMAS * sigma, 1.0 + _TAIL_SIGMAS * sigma
    j_low = math.floor(_loss(y_low, sigma, q) / grid)
    j_high = math.floor(_loss(y_high, sigma, q) / grid)
    edges = _y_of_loss(np.arange(j_low + 1, j_high + 1) * grid, sigma, q)  # bucket j is [y_j, y_{j+1})
    edges = np.clip(edges, y_low, y_high)
    tails = _upper_tail(np.concatenate([[y_low], edges]), sigma, q)
    mass = np.append(-np.diff(tails), tails[-1])  # the last bucket takes all above: rounded down to it
    dropped = 1.0 - float(tails[0])  # below y_low: a loss of −∞
    return _Pld(j_low, np.clip(mass, 0.0, None), grid, dropped + float(_upper_tail(np.array([y_high]), sigma, q)[0]),
                0.0, 1)


def _truncate(pld: _Pld) -> _Pld:
    """Drop the lower tail (loss −∞) and round the upper tail down to the largest kept loss, TAIL_MASS each."""
    mass = pld.mass
    low = int(np.searchsorted(np.cumsum(mass), TAIL_MASS, side="right"))
    high = len(mass) - int(np.searchsorted(np.cumsum(mass[::-1]), TAIL_MASS, side="right"))
    low, high = min(low, high - 1), max(high, low + 1)
    kept = mass[low:high].copy()
    dropped, capped = float(mass[:low].sum()), float(mass[high:].sum())
    kept[-1] += capped
    return _Pld(pld.offset + low, kept, pld.grid, pld.cut + dropped + capped, pld.error, pld.events)


def _convolve(first: _Pld, second: _Pld) -> _Pld:
    size = len(first.mass) + len(second.mass) - 1
    length = 1 << (size - 1).bit_length()
    out = np.fft.irfft(np.fft.rfft(first.mass, length) * np.fft.rfft(second.mass, length), length)[:size]
    return _truncate(_Pld(first.offset + second.offset, np.clip(out, 0.0, None), first.grid, first.cut + second.cut,
                          first.error + second.error + FFT_ERROR * math.log2(length) * math.sqrt(length),
                          first.events + second.events))


def _self_compose(step: _Pld, count: int) -> _Pld:
    result: _Pld | None = None
    power = step
    while count:
        if count & 1:
            result = power if result is None else _convolve(result, power)
        count >>= 1
        if count:
            power = _convolve(power, power)
    assert result is not None
    return result


@functools.lru_cache(maxsize=64)
def _sgd_pld(sigma: float, q: float, steps: int, grid: float) -> _Pld:
    """T steps of DP-SGD (memoised: identical events across the files of one call are composed once)."""
    return _self_compose(_sgd_step(sigma, q, grid), steps)


def _pure_pld(epsilon: float, categories: int, grid: float) -> _Pld:
    """k-RR at ε (binary RR for k = 2): losses ε, 0 and −ε with P-masses e^ε/Z, (k − 2)/Z and 1/Z, Z = e^ε + k − 1."""
    z = math.exp(epsilon) + categories - 1
    top, bottom = math.floor(epsilon / grid), math.floor(-epsilon / grid)
    mass = np.zeros(top - bottom + 1)
    mass[-1] += math.exp(epsilon) / z
    mass[-bottom] += (categories - 2) / z
    mass[0] += 1.0 / z
    return _Pld(bottom, mass, grid, 0.0, 0.0, 1)


def _epsilon(pld: _Pld, delta: float, *, shift: int = 0) -> float:
    """Return the smallest ε >= 0 with Σ p·(1 − e^{ε − l})₊ <= ``delta`` over losses l = (offset + i + shift)·grid."""
    losses = (pld.offset + shift + np.arange(len(pld.mass))) * pld.grid
    positive = losses > 0
    losses, mass = losses[positive], pld.mass[positive]
    if not len(losses):
        return 0.0
    # δ(ε) on (l_{k−1}, l_k] is S0(k) − e^ε·S1(k), with S0, S1 the tail sums of p and p·e^{−l} from k on
    s0 = np.cumsum(mass[::-1])[::-1]
    s1 = np.cumsum((mass * np.exp(-losses))[::-1])[::-1]
    if s0[0] - s1[0] <= delta:  # δ(0)
        return 0.0
    if delta <= 0:
        return math.inf
    at_grid = s0 - np.exp(losses) * s1  # δ(l_k): bucket k itself adds 0 there; the last is 0
    k = int(np.argmax(at_grid <= delta))
    return max(0.0, float(math.log((s0[k] - delta) / s1[k])))


def _grid(event: DpSgdEvent | None, parts: int) -> float:
    """Return the grid: WIDTH over the events rounded (with DP-SGD, T + 2 whatever the parts).

    DP-SGD alone and DP-SGD with a file's values and labels so share one grid (and one memoised composition).
    """
    if event is None:
        return WIDTH / max(parts, 1)
    sigma, q = event.noise_multiplier, event.sampling_probability
    span = _loss(1.0 + _TAIL_SIGMAS * sigma, sigma, q) - _loss(-1.0 - _TAIL_SIGMAS * sigma, sigma, q)
    return max(WIDTH / (event.steps + 2), span / MAX_BUCKETS, MIN_GRID)


def epsilon_bracket(events: list[DpSgdEvent | RandomizedResponseEvent | PureEvent], delta: float) -> Bracket:
    """Return valid lower and upper bounds of ε at ``delta`` of ``events`` composed under REPLACE_ONE.

    At most one :class:`DpSgdEvent` (the case of a file's guarantee); pure parts as k-RR or binary RR. The
    figure of :func:`ldpfl.mechanisms.accounting.epsilon` for the same events lies in it up to its own
    discretization (about 1e-4 per event, pessimistic).

    Raises
    ------
    ValueError
        More than one DP-SGD event, another kind of event, or δ outside (0, 1).
    """
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
    sgd = [e for e in events if isinstance(e, DpSgdEvent) and e.steps > 0]
    pure = [e for e in events if not isinstance(e, DpSgdEvent)]
    if len(sgd) > 1 or any(not isinstance(e, RandomizedResponseEvent | PureEvent) for e in pure):
        raise ValueError("a bracket composes at most one DP-SGD event with k-RR and pure parts")
    grid = _grid(sgd[0] if sgd else None, len(pure))
    pld: _Pld | None = None
    if sgd:
        pld = _sgd_pld(float(sgd[0].noise_multiplier), float(sgd[0].sampling_probability), int(sgd[0].steps), grid)
    for event in pure:
        k = event.categories if isinstance(event, RandomizedResponseEvent) else 2
        part = _pure_pld(float(event.epsilon), k, grid)
        pld = part if pld is None else _convolve(pld, part)
    if pld is None:
        return Bracket(0.0, 0.0, grid)
    lower = _epsilon(pld, delta + pld.error)
    upper = _epsilon(pld, delta - pld.cut - pld.error, shift=pld.events)
    return Bracket(lower, upper, grid)


__all__ = ["Bracket", "epsilon_bracket"]
