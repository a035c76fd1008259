"""Shared pieces of the mechanisms that perturb real-valued vectors (features or model parameters)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import FLOAT32, Mechanism, param, require_generator
from .clipping import clip_elementwise
from .discrete_privacy import discrete_gaussian_epsilon, discrete_gaussian_record_epsilon
from .report import PrivacyReport
from .secure_noise import discrete_gaussian, lattice_grid, lattice_values, randomized_round
from .validation import (
    require_epsilon,
    require_finite_positive,
    require_open_unit_interval,
    require_record_size,
    require_records,
)


@dataclass(frozen=True)
class RealMechanism(Mechanism):
    """A mechanism over real vectors whose last axis holds the ``dim`` coordinates of one record."""

    DOMAIN: ClassVar[str] = "real"
    FEATURE_FORMAT: ClassVar[str] = FLOAT32
    RECORD_PARAMETER: ClassVar[str | None] = "dim"

    epsilon: float = param(1.0, "nominal privacy budget ε")
    dim: int | None = param(None, "coordinates per record, for the per-record ε (default: unknown)")

    def __post_init__(self) -> None:
        """Validate ε and dim (1 to 10^7, the HDF5 schema's width limit)."""
        require_epsilon(self.epsilon)
        if self.dim is not None:
            require_record_size("dim", self.dim)

    def records(self, x: np.ndarray) -> np.ndarray:
        """Return ``x`` as a real array of records on its last axis, as the report assumes.

        Refuses (one-line ``ValueError``) a 0-d value, which has no record axis, and, when ``dim`` is declared,
        records of another width: the per-record ε is that of ``dim`` coordinates.
        """
        return require_records(self.NAME, x, self.dim, "dim")


@dataclass(frozen=True)
class GaussianBase(RealMechanism):
    """Gaussian noise of scale σ on every coordinate, sampled exactly on a power-of-two grid.

    ``randomize`` clips (``lattice_input``), rounds each value without bias to an integer number of grid
    steps g (``secure_noise.randomized_round``), adds discrete Gaussian noise N_Z(0, (σ/g)²) (Canonne,
    Kamath, Steinke 2020, Algorithm 3) and releases the sum times g, an exact multiple of g. The float
    expression x + σ·N(0, 1) leaked x through its low-order bits (Mironov 2012); here the input only
    reaches the output through an integer. Subclasses say how σ, the input bound and the sensitivities
    (in grid steps) arise; the report is the privacy of the discrete mechanism actually sampled
    (``discrete_privacy``).
    """

    delta: float = param(1e-5, "δ of (ε, δ)-DP, in (0, 1)")

    GRID_BOUND_BITS: ClassVar[int | None] = None
    """With b set, the grid is also at most 2^-b times the input bound (``secure_noise.lattice_grid``)."""

    def __post_init__(self) -> None:
        """Validate ε, dim, δ, the subclass's parameters (``validate``), then σ and its grid."""
        super().__post_init__()
        require_open_unit_interval("delta", self.delta)
        self.validate()
        sigma = self.sigma  # refuses an ε whose σ overflows
        try:
            self.grid  # noqa: B018
        except ValueError as err:
            raise ValueError(f"epsilon={self.epsilon!r} and delta={self.delta!r} give sigma={sigma:.6g}, which has "
                             f"no exact grid: {err}") from None

    def validate(self) -> None:
        """Check the subclass's own parameters (before σ and the grid are computed)."""

    @property
    def sigma(self) -> float:  # pragma: no cover - abstract
        """σ of the noise, in the units of the input."""
        raise NotImplementedError

    def noise_scale(self) -> float:
        """σ of the Gaussian noise (WU eq. 4 or 7, DP-FedAW Theorem 1)."""
        return float(self.sigma)

    def input_bound(self) -> float:  # pragma: no cover - abstract
        """Largest |value| after clipping (c, or S_f/2 for an L2 clip)."""
        raise NotImplementedError

    def preprocess(self, x: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        """Clip as the paper does."""
        raise NotImplementedError

    def lattice_input(self, x: np.ndarray) -> np.ndarray:
        """Clip so that the rounded integers stay within the sensitivity (default: ``preprocess``)."""
        return self.preprocess(x)

    @property
    def grid(self) -> float:
        """The power-of-two grid g of the release (``secure_noise.lattice_grid`` of σ and the input bound)."""
        return lattice_grid(self.sigma, self.input_bound(), max_fraction_of_bound_bits=self.GRID_BOUND_BITS)

    def coordinate_sensitivity_steps(self) -> int:  # pragma: no cover - abstract
        """How far one rounded coordinate can move, in grid steps (an integer)."""
        raise NotImplementedError

    def record_sensitivity_steps(self) -> float | None:  # pragma: no cover - abstract
        """L2 distance between two rounded records, in grid steps; None when dim is needed and unknown."""
        raise NotImplementedError

    def coordinate_sensitivity(self) -> float:
        """``coordinate_sensitivity_steps`` in the units of the input."""
        return self.coordinate_sensitivity_steps() * self.grid

    def record_sensitivity(self) -> float | None:
        """``record_sensitivity_steps`` in the units of the input."""
        steps = self.record_sensitivity_steps()
        return None if steps is None else steps * self.grid

    def randomize(self, x: np.ndarray, *, rng: np.random.Generator) -> np.ndarray:
        """Release (randomized_round(clipped x / g) + N_Z(0, (σ/g)²))·g; float32 input gives float32 output.

        The float64 result is an exact multiple of g; casting it to float32 is post-processing of the
        released integer.
        """
        x = self.records(x)
        rng = require_generator(rng)
        dtype = np.float32 if x.dtype == np.float32 else np.float64
        grid = self.grid
        steps = randomized_round(self.lattice_input(x), grid, rng=rng)
        steps += discrete_gaussian(self.sigma / grid, steps.shape, rng=rng)
        return lattice_values(steps, grid).astype(dtype, copy=False)

    def gaussian_notes(self) -> tuple[str, ...]:
        """Return the notes a subclass adds to the report."""
        return ()

    def report(self) -> PrivacyReport:
        """(ε, δ) of the discrete Gaussian actually sampled, for one release.

        Per coordinate: the tight curve of CKS Theorem 7 with the integer sensitivity in grid steps. Per
        record: the zCDP bound ρ = Δ₂²/(2(σ/g)²) converted by CKS Proposition 12 (valid, not tight), or the
        per-coordinate figure when the record has one coordinate.
        """
        sigma, grid, delta = self.sigma, self.grid, self.delta
        sigma_steps = sigma / grid
        coordinate_steps = self.coordinate_sensitivity_steps()
        per_coordinate = discrete_gaussian_epsilon(sigma_steps, coordinate_steps, delta)
        record_steps = self.record_sensitivity_steps()
        if record_steps is None:
            per_record = None
        elif self.dim == 1:
            per_record = per_coordinate
        else:
            per_record = discrete_gaussian_record_epsilon(sigma_steps, record_steps, delta)
        notes = (
            "sampled exactly: inputs rounded without bias to multiples of the grid g, discrete Gaussian noise "
            "N_Z(0, (sigma/g)^2) (Canonne, Kamath, Steinke 2020), outputs exact multiples of g, so the low-order "
            "bits carry nothing about the input",
            "exact epsilon per coordinate: tight (epsilon, delta) curve of the discrete Gaussian (CKS Theorem 7) "
            "at the same delta; per record: zCDP rho = sensitivity^2/(2 sigma^2) converted to (epsilon, delta) "
            "(CKS Proposition 12), a valid bound; one release, composition over rounds is not included",
            "the sampler's float acceptance tests put each value's law within 2^-47 of the exact one in total "
            "variation (docs/privacy.md); the figures are those of the exact law",
            *self.gaussian_notes(),
        )
        if record_steps is None:
            notes += ("per-record epsilon needs dim (number of coordinates); pass dim=",)
        sampler = {"kind": "discrete-gaussian", "grid": grid, "sigma_grid_steps": sigma_steps,
                   "coordinate_sensitivity_grid_steps": coordinate_steps,
                   "record_l2_sensitivity_grid_steps": record_steps}
        return PrivacyReport(
            mechanism=self.NAME, source=self.SOURCE, parameters=self.parameters(),
            nominal_epsilon=self.epsilon, nominal_delta=delta,
            exact_epsilon_per_coordinate=per_coordinate, exact_epsilon_per_record=per_record,
            exact_delta=delta, coordinate="coordinate", record=self.record_name(),
            sigma=sigma, sensitivity=self.record_sensitivity() if record_steps is not None else (
                self.coordinate_sensitivity()),
            probabilities={"sampler": sampler}, notes=notes,
        )

    def record_name(self) -> str:
        """How the report names one record."""
        return f"record of {self.dim} coordinates" if self.dim else "record (dim unknown)"


@dataclass(frozen=True)
class ElementwiseClippedGaussian(GaussianBase):
    """Clip each coordinate to [-c, c] (WU 3.1), then Gaussian noise on the grid g.

    A rounded coordinate lies in [-⌈c/g⌉, ⌈c/g⌉] grid steps, so it moves by at most 2⌈c/g⌉ (= 2c/g when g
    divides c, as it does for the power-of-two c of the papers) and a record of ``dim`` coordinates by at
    most 2⌈c/g⌉·√dim in L2.
    """

    clip: float = param(4.0, "c, element-wise clipping bound")

    def validate(self) -> None:
        """Check c."""
        super().validate()
        require_finite_positive("clip", self.clip)

    def input_bound(self) -> float:
        """Return c."""
        return float(self.clip)

    def preprocess(self, x: np.ndarray) -> np.ndarray:
        """Clip each coordinate to [-c, c] (WU 3.1), in float64."""
        return clip_elementwise(x, self.clip)

    def coordinate_sensitivity_steps(self) -> int:
        """2⌈c/g⌉."""
        return 2 * math.ceil(self.clip / self.grid)

    def record_sensitivity_steps(self) -> float | None:
        """2⌈c/g⌉·√dim (None without dim)."""
        return None if self.dim is None else self.coordinate_sensitivity_steps() * math.sqrt(self.dim)


def pure_report(mech: RealMechanism, per_coordinate: float, notes: tuple[str, ...] = (), *,
                nominal_delta: float = 0.0, sigma: float | None = None,
                probabilities: Mapping[str, object] | None = None) -> PrivacyReport:
    """Build the report of a mechanism that is pure ε-LDP per coordinate, composed over ``dim`` coordinates.

    ``nominal_delta`` is the δ the user gave (ldpsign's σ calibration); the exact δ is 0. ``sigma`` and
    ``probabilities`` (plain numbers) go into the report as they are.
    """
    per_record = None if mech.dim is None else (
        math.inf if math.isinf(per_coordinate) else per_coordinate * mech.dim)
    if mech.dim is None:
        notes = (*notes, "per-record epsilon = dim x per-coordinate epsilon; pass dim=")
    else:
        notes = (*notes, "per record = dim x per-coordinate epsilon (independent coordinates, basic composition)")
    return PrivacyReport(
        mechanism=mech.NAME, source=mech.SOURCE, parameters=mech.parameters(),
        nominal_epsilon=mech.epsilon, nominal_delta=float(nominal_delta),
        exact_epsilon_per_coordinate=per_coordinate, exact_epsilon_per_record=per_record, exact_delta=0.0,
        coordinate="coordinate",
        record=f"record of {mech.dim} coordinates" if mech.dim else "record (dim unknown)",
        notes=notes, sigma=sigma, probabilities=dict(probabilities or {}),
    )
