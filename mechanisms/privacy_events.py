"""The one vocabulary of privacy events: what a part of a release is, described by a small frozen record.

As dp-accounting's ``dp_event`` does, each record *describes* a mechanism; the accountant
(:mod:`ldpfl.mechanisms.accounting`) composes them, and every maker of a privacy figure describes what it
releases with them: a client file's release guarantee (its features, labels, extractor and re-releases), the
label release, the federation's ledger (each upload), a DP-SGD silo's steps, its evaluation replies and the
``stats:K`` statistics release.

Events (what the accountant composes):

* :class:`DpSgdEvent`: T steps of DP-SGD (Abadi et al. 2016, Algorithm 1), Poisson rate q, noise multiplier σ;
* :class:`GaussianEvent`: k releases of the Gaussian mechanism with noise multiplier σ/Δ₂, no sampling;
* :class:`RandomizedResponseEvent`: one of k classes by k-ary randomized response at ε (labels, a predicted class);
* :class:`PureEvent`: any other pure ε-DP part, ε in [0, ∞] (0: the part depends on no record; ∞: not private);
* :class:`ZcdpEvent`: a ρ-zCDP part (the discrete Gaussian, Canonne, Kamath, Steinke 2020), RDP only.

Releases (what one upload of a federation is, before the ledger counts its rounds): a :class:`GaussianRelease`
(σ, Δ₂ and the client's δ, discrete or continuous), a :class:`PureEvent`, or :class:`NoRelease` (stage 2 adds
no noise); :func:`release_from_report` reads one from a mechanism's ``PrivacyReport``.

The JSON form of a release guarantee's part event has one writer per event (``to_json``) and one reader
(:func:`event_from_json`). Pure Python: dp-accounting is loaded by the accountant only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Real
from typing import Any

from .report import PrivacyReport, json_number, number_from_json
from .validation import require_finite_positive

DP_SGD_KEYS = ("noise_multiplier", "sampling_probability", "steps")
"""The keys of DP-SGD as it ran (:meth:`DpSgdEvent.to_json`)."""


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class DpSgdEvent:
    """T steps of DP-SGD with noise multiplier σ and Poisson sampling rate q (Abadi et al. 2016, Alg. 1).

    Each step uses a record with probability q, clips every per-record gradient to L2 norm C and adds N(0, σ²C²)
    noise to their sum: ``SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(σ)), T)``.
    """

    noise_multiplier: float
    sampling_probability: float
    steps: int

    def __post_init__(self) -> None:
        """Validate σ > 0, q in (0, 1] and T >= 0."""
        require_finite_positive("noise_multiplier", self.noise_multiplier)
        q = self.sampling_probability
        if isinstance(q, bool) or not isinstance(q, int | float) or not 0.0 < q <= 1.0:
            raise ValueError(f"sampling_probability must lie in (0, 1], got {q!r}")
        _count("steps", self.steps)

    def to_json(self) -> dict[str, float | int]:
        """Return the event as a release guarantee's part records it: σ, q and T."""
        return {"noise_multiplier": self.noise_multiplier, "sampling_probability": self.sampling_probability,
                "steps": self.steps}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DpSgdEvent:
        """Read :meth:`to_json`'s form (``ValueError`` when it is malformed)."""
        try:
            return cls(float(data["noise_multiplier"]), float(data["sampling_probability"]), int(data["steps"]))
        except (KeyError, TypeError) as error:
            raise ValueError(f"DP-SGD event is malformed ({error!r})") from None


@dataclass(frozen=True)
class GaussianEvent:
    """``count`` releases of a Gaussian mechanism whose σ is ``noise_multiplier`` times its L2 sensitivity."""

    noise_multiplier: float
    count: int = 1

    def __post_init__(self) -> None:
        """Validate σ/Δ₂ > 0 and the count."""
        require_finite_positive("noise_multiplier", self.noise_multiplier)
        _count("count", self.count)


@dataclass(frozen=True)
class RandomizedResponseEvent:
    """k-ary randomized response at ε: the truth w.p. e^ε/(e^ε + k − 1), each other value w.p. 1/(e^ε + k − 1)."""

    epsilon: float
    categories: int

    def __post_init__(self) -> None:
        """Validate ε > 0 and k >= 2."""
        require_finite_positive("epsilon", self.epsilon)
        if isinstance(self.categories, bool) or not isinstance(self.categories, int) or self.categories < 2:
            raise ValueError(f"categories must be an integer >= 2, got {self.categories!r}")

    def to_json(self) -> dict[str, float | int]:
        """Return the part's ``event`` JSON: ``{"krr": ε, "num_classes": k}``."""
        return {"krr": self.epsilon, "num_classes": self.categories}


@dataclass(frozen=True)
class PureEvent:
    """A pure ε-DP part, ε in [0, ∞] (the accountant takes it as binary randomized response at ε, which dominates it).

    ε = 0: the part depends on no record (composes to nothing); ε = ∞: it is not private (nothing is promised).
    """

    epsilon: float

    def __post_init__(self) -> None:
        """Validate ε >= 0 (∞ allowed)."""
        eps = self.epsilon
        if isinstance(eps, bool) or not isinstance(eps, Real) or math.isnan(eps) or eps < 0:
            raise ValueError(f"epsilon must be a number >= 0 (inf allowed), got {eps!r}")

    def to_json(self) -> dict[str, float | str | None]:
        """Return the part's ``event`` JSON: ``{"pure_epsilon": ε}`` (∞ as ``"inf"``)."""
        return {"pure_epsilon": json_number(self.epsilon)}


@dataclass(frozen=True)
class ZcdpEvent:
    """A ρ-zCDP part (Bun and Steinke 2016), composed by the RDP accountant."""

    rho: float

    def __post_init__(self) -> None:
        """Validate ρ >= 0 (finite)."""
        if isinstance(self.rho, bool) or not isinstance(self.rho, int | float) or not 0 <= self.rho < math.inf:
            raise ValueError(f"rho must be a finite number >= 0, got {self.rho!r}")


Event = DpSgdEvent | GaussianEvent | RandomizedResponseEvent | PureEvent | ZcdpEvent

PartEvent = PureEvent | RandomizedResponseEvent | DpSgdEvent | None
"""What a release guarantee's part records for the accountant: a pure ε, a k-RR, DP-SGD as it ran (σ, q, T), or
nothing (``{}``: a part with δ > 0 or one no accountant composes)."""


def event_from_json(data: object) -> PartEvent:
    """Read a part's ``event`` (the one reader; ``ValueError`` naming the key when it is malformed)."""
    if not isinstance(data, Mapping):
        raise ValueError("part key 'event' must be a JSON object")
    if not data:
        return None
    if "krr" in data:
        eps = number_from_json(data["krr"], name="part event 'krr'", optional=False)
        k = data.get("num_classes")
        if isinstance(k, bool) or not isinstance(k, int):
            raise ValueError(f"part event 'num_classes' must be an integer, got {k!r}")
        assert eps is not None
        return RandomizedResponseEvent(eps, k)
    if "pure_epsilon" in data:
        eps = number_from_json(data["pure_epsilon"], name="part event 'pure_epsilon'", optional=False)
        assert eps is not None
        return PureEvent(eps)
    if all(key in data for key in DP_SGD_KEYS):
        return DpSgdEvent.from_json(data)
    raise ValueError(f"part event {dict(data)!r} is none of pure_epsilon, krr or DP-SGD (noise_multiplier, "
                     "sampling_probability, steps)")


# ---------------------------------------------------------------------------------------------------------------
# What one upload of a federation releases


@dataclass(frozen=True)
class GaussianRelease:
    """One release with Gaussian noise of parameter σ on a vector of L2 sensitivity Δ₂ (same units), at the client's δ.

    ``discrete``: the secure sampler's discrete Gaussian (Canonne, Kamath, Steinke 2020), which the RDP accountant
    bounds and the PLD accountant does not model.
    """

    sigma: float
    l2_sensitivity: float
    delta: float
    discrete: bool = True

    def __post_init__(self) -> None:
        """Validate σ > 0, Δ₂ > 0 and δ in (0, 1)."""
        require_finite_positive("sigma", self.sigma)
        require_finite_positive("l2_sensitivity", self.l2_sensitivity)
        if isinstance(self.delta, bool) or not isinstance(self.delta, Real) or not 0.0 < self.delta < 1.0:
            raise ValueError(f"delta must lie in the open interval (0, 1), got {self.delta!r}")

    @property
    def noise_multiplier(self) -> float:
        """σ/Δ₂, dp-accounting's parameter of the Gaussian event."""
        return self.sigma / self.l2_sensitivity

    def event(self, count: int) -> GaussianEvent:
        """Return the accountant's event of ``count`` such releases."""
        return GaussianEvent(self.noise_multiplier, count)


@dataclass(frozen=True)
class NoRelease:
    """Stage 2 adds no noise (``--perturbation none``): an upload computed from released values and labels."""


Release = GaussianRelease | PureEvent | NoRelease
"""What one upload releases: a Gaussian, a pure ε-LDP release (ε may be ∞ for a deterministic output), or nothing."""


def release_from_report(report: PrivacyReport) -> Release:
    """Return the per-upload release described by a mechanism's ``PrivacyReport`` (per record, i.e. per upload).

    * a mechanism that does not randomize (``none``) → ``NoRelease``;
    * a report with σ and a δ > 0 (the Gaussian family) → ``GaussianRelease(σ, record sensitivity, δ)``;
      it is ``discrete`` when ``probabilities["sampler"]["kind"]`` starts with "discrete" (the secure sampler);
    * otherwise → ``PureEvent(exact ε per record)``.

    A report without a per-record figure (``dim`` unknown) is refused: the ledger needs the whole upload.
    """
    if report.mechanism == "none":
        return NoRelease()
    if report.exact_epsilon_per_record is None:
        raise ValueError(f"the {report.mechanism} report has no per-record epsilon (dim unknown); build the "
                         "mechanism with dim= before accounting for its uploads")
    if report.sigma is not None and report.exact_delta > 0:
        if report.sensitivity is None:
            raise ValueError(f"the {report.mechanism} report has a sigma but no sensitivity: its uploads cannot be "
                             "accounted")
        sampler = dict(report.probabilities).get("sampler", {})
        discrete = isinstance(sampler, Mapping) and str(sampler.get("kind", "")).startswith("discrete")
        return GaussianRelease(float(report.sigma), float(report.sensitivity), float(report.exact_delta),
                               discrete=discrete)
    return PureEvent(float(report.exact_epsilon_per_record))


__all__ = ["DP_SGD_KEYS", "DpSgdEvent", "Event", "GaussianEvent", "GaussianRelease", "NoRelease", "PartEvent",
           "PureEvent", "RandomizedResponseEvent", "Release", "ZcdpEvent", "event_from_json", "release_from_report"]
