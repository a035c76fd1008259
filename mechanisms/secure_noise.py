"""Noise without a floating-point side channel: randomized rounding to a grid plus integer noise.

Why. ``x + sigma * rng.standard_normal()`` leaks the input through the low-order bits of the float result
(Mironov, "On significance of the least significant bits for differential privacy", CCS 2012): for an input
a, every output y with |y| < a/2 is an exact (Sterbenz) difference and so lies on the ulp(a/2) grid, while
for input 0 it almost never does. Here the input only ever enters through an *integer*:

1. ``randomized_round``: x/grid is rounded to k = floor(x/grid) or floor(x/grid) + 1, up with probability
   frac(x/grid), so E[k·grid] = x (unbiased stochastic rounding);
2. ``discrete_gaussian`` / ``discrete_laplace``: integer noise Z whose law does not depend on x at all;
3. the release is (k + Z)·grid, with the sum computed in int64 and multiplied by a power-of-two grid in
   float64, which is exact (``lattice_values``). Every output is an exact multiple of ``grid``.

So the release is a deterministic function of the integer k + Z, and its privacy is that of the integer
mechanism k ↦ k + Z with the integer sensitivity of k (``ldpfl.mechanisms.discrete_privacy``). Casting the result to
float32 afterwards is post-processing of that integer and cannot leak anything more.

Samplers (Canonne, Kamath and Steinke, "The Discrete Gaussian for Differential Privacy", NeurIPS 2020; CKS
below), vectorized over a batch: rejection steps run in rounds over the indices that are still unaccepted.

* Geometric G with P(G = g) = (1 - q) q^g, q = e^(-1/t): G = R + m·V with m = ⌈t⌉, R uniform on {0..m-1}
  accepted with probability e^(-R/t), and V the number of successes of Bernoulli(e^(-m/t)) before the
  first failure. This is CKS Algorithm 2, lines 1-8 (there t is an integer and m = t, so the loop uses
  Bernoulli(e^(-1))); with m = ⌈t⌉ it also covers a non-integer t. The loop over V is unbounded, so the
  tail is not truncated.
* Discrete Laplace DLap(t), P(k) ∝ e^(-|k|/t): the difference G1 - G2 of two i.i.d. geometric variables
  (Inusah and Kozubowski, "A discrete analogue of the Laplace distribution", JSPI 2006, Proposition 3.3;
  CKS §5.2 uses the same law, sampled with a sign bit instead).
* Discrete Gaussian N_Z(0, σ²), P(k) ∝ e^(-k²/(2σ²)): CKS Algorithm 3, rejection from DLap(t) with
  t = ⌊σ⌋ + 1 and acceptance probability exp(-(|Y| - σ²/t)²/(2σ²)).

What remains floating point, and why it creates no input-dependent lattice: the Bernoulli trials compare a
53-bit uniform U (``Generator.random``: a multiple of 2^-53) with a float64 probability p = exp(...), so the
trial succeeds with probability ⌈fl(p)·2^53⌉/2^53 instead of p (CKS Algorithm 1 would make it exact with
rational arithmetic, which does not vectorize in int64 at the σ used here). Each trial is off by at most
about 3·2^-53 (the ceiling, exp's < 1 ulp, the rounding of its argument), and a sample uses on average at most
12.3 trials (discrete Gaussian; 6.4 for the discrete Laplace; measured), so by coupling each sample's law is
within ``SAMPLER_TV_PER_SAMPLE`` = 2^-47 of the exact one in total variation, and a record of d coordinates
within d·2^-47 (< 10^-7 for d ≤ 10^7). The (ε, δ) of the exact law then holds for the sampled one with
δ + (1 + e^ε)·d·2^-47; reports give the exact law's figures and say so. The noise is drawn without looking at
the input, and the input is only rounded to an integer, so this residue cannot make the set of possible
outputs depend on the input. The randomized rounding's own probability frac(x/grid) is also compared in float;
it only moves probability between two lattice points inside the sensitivity bound, so it affects unbiasedness
(by ≤ 2^-53·grid) and never privacy.

Limits (refused with a one-line ``ValueError`` naming the parameter): ``grid`` is a power of two in
[2^-1000, 2^1000]; |x/grid| ≤ 2^52; ``scale`` of the discrete Laplace in [2^-5, 2^44] (below 2^-5,
P(noise ≠ 0) < 2^-45 is no longer represented by 53-bit comparisons; above 2^44 the noise could leave the
range where int64 sums and float64 products are exact); σ of the discrete Gaussian in (0, 2^44].
"""

from __future__ import annotations

import math
from numbers import Real

import numpy as np

from .base import require_generator

MAX_LATTICE = 2**52
"""|x/grid| (and so the rounded integer) must stay at or below this."""

EXACT_FLOAT_INTEGER = 2**53
"""Every integer of magnitude ≤ 2^53 is exactly representable in float64."""

MIN_GRID_EXPONENT = -1000
MAX_GRID_EXPONENT = 1000
MIN_LAPLACE_SCALE = 2.0**-5
MAX_NOISE_SCALE = 2.0**44
SAMPLER_TV_PER_SAMPLE = 2.0**-47
"""Total-variation distance between one sample's law and the exact N_Z / DLap law (module docstring)."""
GRID_BITS_BELOW_SIGMA = 20
"""``lattice_grid``: the grid is 2^20 times finer than σ, so rounding adds < 2^-42·σ² of variance."""
MAX_ROUNDED_BITS = 50
"""``lattice_grid``: |x/grid| ≤ 2^50, leaving room below 2^52 (``randomized_round``) and 2^53 (the sum)."""


# --------------------------------------------------------------------------------------------------
# Validation.


def require_grid(grid: float) -> float:
    """Return ``grid`` as float if it is a power of two 2^e with -1000 ≤ e ≤ 1000."""
    if isinstance(grid, bool) or not isinstance(grid, Real) or not math.isfinite(grid) or grid <= 0:
        raise ValueError(f"grid must be a power of two > 0, got {grid!r}")
    mantissa, exponent = math.frexp(float(grid))
    if mantissa != 0.5:
        raise ValueError(f"grid must be a power of two (2**k) so that x/grid is exact, got {grid!r}")
    if not MIN_GRID_EXPONENT <= exponent - 1 <= MAX_GRID_EXPONENT:
        raise ValueError(f"grid must lie in [2**{MIN_GRID_EXPONENT}, 2**{MAX_GRID_EXPONENT}], got {grid!r}")
    return float(grid)


def _require_scale(name: str, value: float, low: float, low_inclusive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    value = float(value)
    too_low = value < low if low_inclusive else value <= low
    if too_low or value > MAX_NOISE_SCALE:
        bracket = "[" if low_inclusive else "("
        raise ValueError(f"{name} must lie in {bracket}{low:g}, 2**44] (in grid units), got {value!r}")
    return value


def _size_tuple(size: int | tuple[int, ...]) -> tuple[int, ...]:
    shape = (size,) if isinstance(size, (int, np.integer)) else tuple(size)
    if any(isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0 for n in shape):
        raise ValueError(f"size must be a non-negative integer or a tuple of them, got {size!r}")
    return tuple(int(n) for n in shape)


def _floor_log2(value: float) -> int:
    """⌊log2 value⌋ exactly (frexp, no log rounding)."""
    mantissa, exponent = math.frexp(value)
    return exponent - 1


def _ceil_log2(value: float) -> int:
    mantissa, exponent = math.frexp(value)
    return exponent - 1 if mantissa == 0.5 else exponent


def lattice_grid(sigma: float, bound: float, *, max_fraction_of_bound_bits: int | None = None) -> float:
    """Choose the power-of-two grid for noise of scale σ on inputs with |x| ≤ ``bound``.

    g = 2^e with e = ⌊log2 σ⌋ - 20 (``GRID_BITS_BELOW_SIGMA``): fine next to the noise. With
    ``max_fraction_of_bound_bits`` = b, also g ≤ bound·2^-b (an L2 clip needs √d·g ≪ bound). Then e is raised
    to at least ⌈log2 bound⌉ - 50 so that |x/g| ≤ 2^50. Refuses (ValueError naming sigma) a σ/g above 2^44,
    which only happens when σ > 2^(44-b)·bound.
    """
    if isinstance(sigma, bool) or not isinstance(sigma, Real) or not math.isfinite(sigma) or sigma <= 0:
        raise ValueError(f"sigma must be a finite number > 0, got {sigma!r}")
    if isinstance(bound, bool) or not isinstance(bound, Real) or not math.isfinite(bound) or bound <= 0:
        raise ValueError(f"bound must be a finite number > 0, got {bound!r}")
    exponent = _floor_log2(float(sigma)) - GRID_BITS_BELOW_SIGMA
    if max_fraction_of_bound_bits is not None:
        exponent = min(exponent, _floor_log2(float(bound)) - max_fraction_of_bound_bits)
    exponent = max(exponent, _ceil_log2(float(bound)) - MAX_ROUNDED_BITS)
    if not MIN_GRID_EXPONENT <= exponent <= MAX_GRID_EXPONENT:
        raise ValueError(f"sigma={sigma!r} and bound={bound!r} need the grid 2**{exponent}, outside "
                         f"[2**{MIN_GRID_EXPONENT}, 2**{MAX_GRID_EXPONENT}]")
    grid = math.ldexp(1.0, exponent)
    if sigma / grid > MAX_NOISE_SCALE:
        raise ValueError(f"sigma={sigma!r} is more than 2**{44 - (max_fraction_of_bound_bits or 0)} times the "
                         f"input bound {bound!r}: the noise would not fit the exact int64/float64 range")
    return grid


# --------------------------------------------------------------------------------------------------
# Randomized rounding.


def randomized_round(x: np.ndarray, grid: float, *, rng: np.random.Generator) -> np.ndarray:
    """Unbiased stochastic rounding of x/grid to an integer: floor(x/grid) + Bernoulli(frac(x/grid)).

    Parameters
    ----------
    x : array of finite reals (float32 is widened to float64, exactly).
    grid : a power of two; x/grid is then an exact float64 operation.
    rng : the Generator that draws the rounding bits.

    Returns
    -------
    int64 array k of x's shape with E[k]·grid = x (up to the 53-bit comparison) and |k - x/grid| < 1.
    """
    grid = require_grid(grid)
    rng = require_generator(rng)
    v = np.asarray(x, dtype=np.float64) / grid  # exact: grid is a power of two (no overflow by the checks below)
    if v.size and not np.all(np.isfinite(v)):
        raise ValueError("x must hold finite numbers only (x/grid overflowed or x holds NaN/inf)")
    if v.size and float(np.max(np.abs(v))) > MAX_LATTICE:
        raise ValueError(f"x/grid must stay within ±2**52 so that int64 and float64 stay exact; grid {grid!r} is "
                         "too fine for these values")
    low = np.floor(v)
    frac = v - low  # exact for |v| ≤ 2^52 (Sterbenz)
    up = rng.random(v.shape) < frac
    return low.astype(np.int64) + up


def lattice_values(k: np.ndarray, grid: float) -> np.ndarray:
    """k·grid in float64, exactly: refuses |k| > 2^53 (not every such integer is a float64)."""
    grid = require_grid(grid)
    k = np.asarray(k)
    if not np.issubdtype(k.dtype, np.integer):
        raise ValueError(f"k must be an integer array, got dtype {k.dtype}")
    if k.size and int(np.max(np.abs(k.astype(np.int64)))) > EXACT_FLOAT_INTEGER:
        raise ValueError("k (rounded input + noise) must stay within ±2**53 to be exact in float64")
    return k.astype(np.float64) * grid  # exact: |k| ≤ 2^53 and grid is a power of two in the normal range


# --------------------------------------------------------------------------------------------------
# Samplers.


def _bernoulli(p: np.ndarray | float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Draw n Bernoulli(p) trials; P(True) = ⌈fl(p)·2^53⌉ / 2^53 (53-bit uniform compared with float p)."""
    return rng.random(n) < p


def _geometric(scale: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Draw n i.i.d. G with P(G = g) = (1 - q) q^g, q = e^(-1/scale), as int64 (CKS Algorithm 2, lines 1-8).

    G = R + m·V, m = ⌈scale⌉: R uniform on {0, ..., m-1} accepted with probability e^(-R/scale) gives
    P(R = r) ∝ e^(-r/scale); V counts successes of Bernoulli(e^(-m/scale)) before the first failure, so
    P(V = v) ∝ e^(-m v/scale). Each g has a unique (r, v), hence P(G = g) ∝ e^(-g/scale).
    """
    m = max(1, math.ceil(scale))
    # R: rejection, first over all n, then in rounds over the indices still unaccepted.
    if m > 1:
        out = rng.integers(0, m, size=n, dtype=np.int64)
        pending = np.flatnonzero(~_bernoulli(_exp_of_ratio(out, scale), n, rng))
        while pending.size:
            r = rng.integers(0, m, size=pending.size, dtype=np.int64)
            accept = _bernoulli(_exp_of_ratio(r, scale), pending.size, rng)
            out[pending[accept]] = r[accept]
            pending = pending[~accept]
    else:
        out = np.zeros(n, dtype=np.int64)
    # V: unbounded loop, first over all n, then in rounds over the indices whose last trial succeeded.
    p_continue = math.exp(-m / scale)
    active = np.flatnonzero(_bernoulli(p_continue, n, rng))
    while active.size:
        out[active] += m
        active = active[_bernoulli(p_continue, active.size, rng)]
    return out


def _exp_of_ratio(r: np.ndarray, scale: float) -> np.ndarray:
    """Compute exp(-r/scale) elementwise (one division and one exp per element, in place)."""
    x = r.astype(np.float64)
    x /= -scale
    return np.exp(x, out=x)


def _two_sided_geometric(scale: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """G1 - G2 for i.i.d. geometric G1, G2 (one call of size 2n): DLap(scale) as int64."""
    g = _geometric(scale, 2 * n, rng)
    return g[:n] - g[n:]


def discrete_laplace(scale: float, size: int | tuple[int, ...], *, rng: np.random.Generator) -> np.ndarray:
    """Sample DLap(scale): P(k) = tanh(1/(2·scale))·e^(-|k|/scale) on the integers.

    Difference of two i.i.d. geometric variables with q = e^(-1/scale) (see the module docstring).

    Parameters
    ----------
    scale : t in grid units, in [2^-5, 2^44]. Noise on an integer query of L1 sensitivity Δ gives pure
        ε = Δ/t (``discrete_privacy.discrete_laplace_epsilon``).
    size : output shape.
    rng : the Generator.

    Returns
    -------
    int64 array of shape ``size``.
    """
    scale = _require_scale("scale", scale, MIN_LAPLACE_SCALE)
    rng = require_generator(rng)
    shape = _size_tuple(size)
    return _two_sided_geometric(scale, math.prod(shape), rng).reshape(shape)


def discrete_gaussian(sigma: float, size: int | tuple[int, ...], *, rng: np.random.Generator) -> np.ndarray:
    """Sample N_Z(0, σ²): P(k) ∝ e^(-k²/(2σ²)) on the integers (CKS Algorithm 3).

    t = ⌊σ⌋ + 1; repeat Y ~ DLap(t), accept with probability exp(-(|Y| - σ²/t)²/(2σ²)); rounds run over
    the indices not yet accepted.

    Parameters
    ----------
    sigma : σ in grid units, in (0, 2^44]. (σ is the parameter of the law, not exactly its standard
        deviation, which is slightly below σ for small σ.)
    size : output shape.
    rng : the Generator.

    Returns
    -------
    int64 array of shape ``size``.
    """
    sigma = _require_scale("sigma", sigma, 0.0, low_inclusive=False)
    rng = require_generator(rng)
    shape = _size_tuple(size)
    n = math.prod(shape)
    t = math.floor(sigma) + 1
    centre = sigma * sigma / t
    two_var = 2.0 * sigma * sigma
    out = _two_sided_geometric(t, n, rng)
    pending = np.flatnonzero(~_bernoulli(_gaussian_acceptance(out, centre, two_var), n, rng))
    while pending.size:
        y = _two_sided_geometric(t, pending.size, rng)
        accept = _bernoulli(_gaussian_acceptance(y, centre, two_var), pending.size, rng)
        out[pending[accept]] = y[accept]
        pending = pending[~accept]
    return out.reshape(shape)


def _gaussian_acceptance(y: np.ndarray, centre: float, two_var: float) -> np.ndarray:
    """Compute CKS Algorithm 3's acceptance probability exp(-(|y| - σ²/t)²/(2σ²)) elementwise, in place."""
    gap = np.abs(y).astype(np.float64)
    gap -= centre
    gap *= gap
    gap /= -two_var
    return np.exp(gap, out=gap)


# --------------------------------------------------------------------------------------------------
# Whole mechanisms on a grid.


def add_discrete_gaussian(x: np.ndarray, sigma: float, grid: float, *, rng: np.random.Generator) -> np.ndarray:
    """(randomized_round(x) + N_Z(0, (σ/grid)²))·grid as float64: every entry an exact multiple of ``grid``.

    ``sigma`` is in the units of x; the integer noise has parameter σ/grid.
    """
    grid = require_grid(grid)
    k = randomized_round(x, grid, rng=rng)
    noise = discrete_gaussian(sigma / grid, k.shape, rng=rng)
    return lattice_values(k + noise, grid)


def add_discrete_laplace(x: np.ndarray, scale: float, grid: float, *, rng: np.random.Generator) -> np.ndarray:
    """(randomized_round(x) + DLap(scale/grid))·grid as float64: every entry an exact multiple of ``grid``."""
    grid = require_grid(grid)
    k = randomized_round(x, grid, rng=rng)
    noise = discrete_laplace(scale / grid, k.shape, rng=rng)
    return lattice_values(k + noise, grid)
