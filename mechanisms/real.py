"""Shared pieces of the mechanisms that perturb real-valued vectors (features or model parameters)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import Mechanism, param, require_generator
from .calibration import gaussian_exact_epsilon
from .clipping import clip_elementwise
from .report import PrivacyReport
from .validation import (
    require_epsilon,
    require_finite_positive,
    require_int_in_range,
    require_open_unit_interval,
    require_real_array,
)


@dataclass(frozen=True)
class RealMechanism(Mechanism):
    """A mechanism over real vectors whose last axis holds the ``dim`` coordinates of one record."""

    DOMAIN: ClassVar[str] = "real"

    epsilon: float = param(1.0, "nominal privacy budget ε")
    dim: int | None = param(None, "coordinates per record, for the per-record ε (default: unknown)")

    def __post_init__(self) -> None:
        require_epsilon(self.epsilon)
        if self.dim is not None:
            require_int_in_range("dim", self.dim, 1)


@dataclass(frozen=True)
class GaussianBase(RealMechanism):
    """Gaussian noise N(0, σ²) on every coordinate; subclasses say how σ and the sensitivity arise."""

    delta: float = param(1e-5, "δ of (ε, δ)-DP, in (0, 1)")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_open_unit_interval("delta", self.delta)

    @property
    def sigma(self) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def preprocess(self, x: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def coordinate_sensitivity(self) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def record_sensitivity(self) -> float | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def randomize(self, x: np.ndarray, *, rng: np.random.Generator) -> np.ndarray:
        x = self.preprocess(require_real_array(x))
        dtype = np.float32 if x.dtype == np.float32 else np.float64
        noise = require_generator(rng).standard_normal(x.shape, dtype=dtype)
        noise *= dtype(self.sigma)
        return (x + noise).astype(dtype, copy=False)

    def gaussian_notes(self) -> tuple[str, ...]:
        return ()

    def report(self) -> PrivacyReport:
        sigma = self.sigma
        per_coordinate = gaussian_exact_epsilon(sigma, self.coordinate_sensitivity(), self.delta)
        record_sens = self.record_sensitivity()
        per_record = None if record_sens is None else gaussian_exact_epsilon(sigma, record_sens, self.delta)
        notes = (
            "exact epsilon: tight (epsilon, delta) curve of the Gaussian mechanism (Balle & Wang 2018) "
            "at the same delta, for one release; composition over rounds is not included",
            *self.gaussian_notes(),
        )
        if record_sens is None:
            notes += ("per-record epsilon needs dim (number of coordinates); pass dim=",)
        return PrivacyReport(
            mechanism=self.NAME, source=self.SOURCE, parameters=self.parameters(),
            nominal_epsilon=self.epsilon, nominal_delta=self.delta,
            exact_epsilon_per_coordinate=per_coordinate, exact_epsilon_per_record=per_record,
            exact_delta=self.delta, coordinate="coordinate", record=self.record_name(),
            sigma=sigma, sensitivity=record_sens if record_sens is not None else self.coordinate_sensitivity(),
            notes=notes,
        )

    def record_name(self) -> str:
        return f"record of {self.dim} coordinates" if self.dim else "record (dim unknown)"


@dataclass(frozen=True)
class ElementwiseClippedGaussian(GaussianBase):
    """Clip each coordinate to [-c, c] (WU 3.1), then Gaussian noise: one coordinate moves by at most 2c,
    a record of ``dim`` coordinates by at most 2c·√dim in L2."""

    clip: float = param(4.0, "c, element-wise clipping bound")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_finite_positive("clip", self.clip)

    def preprocess(self, x: np.ndarray) -> np.ndarray:
        return clip_elementwise(x, self.clip)

    def coordinate_sensitivity(self) -> float:
        return 2.0 * self.clip

    def record_sensitivity(self) -> float | None:
        return None if self.dim is None else 2.0 * self.clip * math.sqrt(self.dim)


def pure_report(mech: RealMechanism, per_coordinate: float, notes: tuple[str, ...] = (),
                **extra: object) -> PrivacyReport:
    """Report of a mechanism that is pure ε-LDP per coordinate, composed over ``dim`` coordinates."""
    per_record = None if mech.dim is None else (
        math.inf if math.isinf(per_coordinate) else per_coordinate * mech.dim)
    if mech.dim is None:
        notes = (*notes, "per-record epsilon = dim x per-coordinate epsilon; pass dim=")
    else:
        notes = (*notes, "per record = dim x per-coordinate epsilon (independent coordinates, basic composition)")
    return PrivacyReport(
        mechanism=mech.NAME, source=mech.SOURCE, parameters=mech.parameters(),
        nominal_epsilon=mech.epsilon, nominal_delta=float(getattr(mech, "delta", 0.0)),
        exact_epsilon_per_coordinate=per_coordinate, exact_epsilon_per_record=per_record, exact_delta=0.0,
        coordinate="coordinate",
        record=f"record of {mech.dim} coordinates" if mech.dim else "record (dim unknown)",
        notes=notes, **extra,
    )
