"""The released statistics of a ``stats:K`` file under ``ldpfl inspect`` (issue 40 item 3).

A ``stats:K`` file releases no record: its silo released, once, noisy per-class sums, class counts and second
moments of its records projected to K values and clipped to C (``ldpfl.contract.released_statistics``), and its
``/train`` rows are synthetic records drawn from them with a public key. This module condenses what such a file
records into :class:`StatisticsSummary` (the ``released statistics`` section of ``inspect``, text and JSON) and
makes its two checks:

* **noise vs ε**: the noise scales give back the recorded ε. The σ of each part is the one the privacy report
  records (``sigma_sums``, ``sigma_counts``, ``sigma_moments``), which must equal what the mechanism's parameters
  imply; ε under add/remove and replace-one is recomputed from those σ and C alone
  (``released_statistics.epsilon_from_noise``: μ from eq. 1 of ``sufficient_statistics``) and must equal the
  recorded target ε under its relation and the report's figures under both;
* **synthetic rows**: the rows and labels of ``/train`` are those the recorded statistics and synthetic key give
  (``released_statistics.statistics_problems``, the check ``federate`` refuses a file by).

Every disagreement is one line (a finding); the section says ``ok`` or lists them. Only numpy, the contract and
the mechanisms are imported (no framework, no matplotlib).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np

from ldpfl.contract import released_statistics as rs
from ldpfl.contract.client_reader import short_error
from ldpfl.contract.jsonout import json_ready
from ldpfl.contract.schema import ClientMetadata
from ldpfl.mechanisms import accounting
from ldpfl.mechanisms import statistics_model as model
from ldpfl.mechanisms import sufficient_statistics as ss
from ldpfl.mechanisms.gaussian_statistics import CLASS_MEANS, CLIP_FRACTION, GaussianStatistics, Released

SIGMA_KEYS = ("sigma_sums", "sigma_counts", "sigma_moments")
"""The privacy report's record of each part's noise scale (``GaussianStatistics.report``)."""
RELATIONS = (accounting.ADD_REMOVE, accounting.REPLACE_ONE)
OK, FLAGGED = "ok", "flagged"
CHECK_ERRORS = (ValueError, TypeError, KeyError, OSError, RuntimeError, ArithmeticError, np.linalg.LinAlgError)
"""What reading or recomputing an untrusted release may raise: each becomes one finding, never a traceback."""


@dataclass(frozen=True)
class StatisticsSummary:
    """What a ``stats:K`` file released, its guarantee recomputed from its noise, and its two checks."""

    width: int  # K
    classes: int  # c
    statistics: ss.Statistics  # as released (noisy)
    scales: ss.NoiseScales  # σ of each part and μ, as the mechanism's parameters give them
    recorded_scales: Mapping[str, float] | None  # the privacy report's sigma_* (None: not recorded)
    clip: float
    clip_is_default: bool
    shares: tuple[float, float, float]
    moments_about: str  # class-means (the release's own noisy means) or origin
    moments_clip: float  # C_r about the class means, C about the origin
    shrinkage: float
    delta: float
    neighbours: str  # the relation the target ε is stated under
    target_epsilon: float  # the recorded ε (mechanism parameter)
    stated_epsilon: Mapping[str, float | None]  # the privacy report's ε under each relation
    recomputed_epsilon: Mapping[str, float]  # ε under each relation, from the noise scales and C
    synthetic_key: int
    noise_findings: tuple[str, ...]
    row_findings: tuple[str, ...]

    @property
    def synthetic_rows(self) -> list[int | None]:
        """Return the synthetic rows per class the counts give: round(N_c), N_c floored at 1 (None: not finite)."""
        return synthetic_rows(self.statistics.counts)

    @property
    def noise_edge(self) -> float:
        """Return τ√(2K), the spectral radius of the covariance estimate's noise (``statistics_model.noise_edge``)."""
        records = float(np.maximum(self.statistics.counts, 1.0).sum())
        return model.noise_edge(self.scales, records, self.classes, self.width)

    def eigenvalues(self) -> np.ndarray:
        """Return the eigenvalues (descending) of the pooled within-class covariance, before floor and ridge."""
        return covariance_spectrum(self.statistics)

    @property
    def problems(self) -> list[str]:
        """Return every finding: the noise check's, then the synthetic rows'."""
        return [*self.noise_findings, *self.row_findings]

    def to_dict(self) -> dict[str, Any]:
        """Return the section, JSON-ready (the ``released_statistics`` key of a file in ``inspect --json``)."""
        values = self.eigenvalues()
        edge = self.noise_edge
        return json_ready({
            "width": self.width, "classes": self.classes,
            "counts": self.statistics.counts.tolist(), "synthetic_rows_per_class": self.synthetic_rows,
            "clip": self.clip, "clip_is_default": self.clip_is_default, "moments_about": self.moments_about,
            "moments_clip": self.moments_clip,
            "shares": dict(zip(("sums", "counts", "moments"), self.shares, strict=True)),
            "mu_add_remove": self.scales.mu,
            "sigma": {"sums": self.scales.sums, "counts": self.scales.counts, "moments": self.scales.moments},
            "recorded_sigma": None if self.recorded_scales is None else dict(self.recorded_scales),
            "delta": self.delta, "neighbours": self.neighbours, "target_epsilon": self.target_epsilon,
            "stated_epsilon": dict(self.stated_epsilon), "epsilon_from_noise": dict(self.recomputed_epsilon),
            "synthetic_key": self.synthetic_key, "shrinkage": self.shrinkage,
            "noise_edge": edge,
            "eigenvalues_above_noise_edge": int(np.count_nonzero(values > edge)) if values.size else None,
            "checks": {name: {"status": OK if not findings else FLAGGED, "findings": list(findings)}
                       for name, findings in (("noise_vs_epsilon", self.noise_findings),
                                              ("synthetic_rows", self.row_findings))},
        })

    def lines(self) -> list[str]:
        """Return the ``released statistics`` section of ``inspect``'s text."""
        c, k = self.classes, self.width
        counts = self.statistics.counts
        clip = f"C = {self.clip:.4g}" + (f" ({CLIP_FRACTION:g} sqrt(K), the default)" if self.clip_is_default else "")
        implied = _implied(self.scales)
        sigmas = implied if self.recorded_scales is None else dict(self.recorded_scales)
        if self.recorded_scales is None:
            source = "the mechanism's parameters give these; the privacy report records none"
        elif all(math.isclose(sigmas[key], implied[key], rel_tol=1e-9) for key in SIGMA_KEYS):
            source = "as the privacy report records them; the mechanism's parameters give the same"
        else:
            source = ("as the privacy report records them; the mechanism's parameters give "
                      + ", ".join(_fmt(implied[key]) for key in SIGMA_KEYS))
        recomputed = ", ".join(f"{_fmt(self.recomputed_epsilon[r], 6)} {r}" for r in RELATIONS)
        stated = ", ".join(f"{_fmt(self.stated_epsilon.get(r), 6)} {r}" for r in RELATIONS)
        values = self.eigenvalues()
        edge = self.noise_edge
        return [
            f"released statistics  (stats:{k}: no record is released; the silo's records, projected to K = {k} "
            "values and clipped, released once; the train rows are synthetic records drawn from these)",
            f"  released    per-class sums ({c} x {k}), class counts ({c}), second moments ({k} x {k}, symmetric), "
            "each with Gaussian noise",
            f"  counts      noisy {' '.join(f'{v:.1f}' for v in counts)} (total {counts.sum():.1f}, sigma "
            f"{_fmt(self.scales.counts)} each)",
            f"  synthetic   {' '.join('-' if n is None else str(n) for n in self.synthetic_rows)} rows per class, "
            "drawn with the public "
            f"key {self.synthetic_key}",
            f"  clip        {clip}: each projected record's L2 norm; second moments about the "
            + (f"release's own noisy class means, each residual clipped to C_r = {self.moments_clip:.4g}"
               if self.moments_about == CLASS_MEANS else "origin"),
            f"  budget      mu = {_fmt(self.scales.mu, 6)} (Gaussian DP, add/remove), shares sums "
            f"{self.shares[0]:g} / counts {self.shares[1]:g} / second moments {self.shares[2]:g}",
            f"  noise       sigma sums {_fmt(sigmas['sigma_sums'])}, counts {_fmt(sigmas['sigma_counts'])}, second "
            f"moments {_fmt(sigmas['sigma_moments'])} ({source})",
            f"  epsilon     from these sigma and C at delta {self.delta:g}: {recomputed}; recorded: target "
            f"{_fmt(self.target_epsilon, 6)} {self.neighbours}, report {stated}",
            f"  covariance  {int(np.count_nonzero(values > edge))} of {k} eigenvalues above the noise edge "
            f"{_fmt(edge)} (largest {_fmt(float(values[0]))}); ridge {self.shrinkage:g} noise edges" if values.size
            else "  covariance  no spectrum: the released statistics are not finite",
            "  check       noise vs epsilon: " + ("ok, the noise scales give back the recorded epsilon under both "
                                                  "relations" if not self.noise_findings
                                                  else "; ".join(self.noise_findings)),
            "  check       synthetic rows: " + ("ok, they are the records the recorded statistics and synthetic key "
                                                "give" if not self.row_findings else "; ".join(self.row_findings)),
        ]


def _fmt(x: float | None, digits: int = 4) -> str:
    if x is None or math.isnan(x):
        return "-"
    return "inf" if math.isinf(x) else f"{x:.{digits}g}"


def synthetic_rows(counts: np.ndarray) -> list[int | None]:
    """Return round(max(N_c, 1)) per class, as ``statistics_model.synthetic_records`` draws them (None: not finite)."""
    return [int(np.rint(max(float(c), 1.0))) if math.isfinite(c) else None for c in np.asarray(counts).tolist()]


def covariance_spectrum(statistics: ss.Statistics) -> np.ndarray:
    """Return the eigenvalues (descending) of the pooled within-class covariance the statistics estimate.

    ``statistics_model.estimate``'s first step: the within-class scatter / (n − c), N_c floored at 1, before its
    eigenvalues are floored at 0 and the ridge added, so the noise's spread about 0 (its semicircle, radius the
    noise edge) shows.
    """
    counts = np.maximum(statistics.counts, 1.0)
    scatter = statistics.scatter()  # the centered moments, or M − Σ_c S_c S_cᵀ / N_c
    covariance = (scatter + scatter.T) / (2.0 * max(float(counts.sum()) - statistics.classes, 1.0))
    try:
        return np.linalg.eigvalsh(covariance)[::-1] if np.all(np.isfinite(covariance)) else np.array([])
    except np.linalg.LinAlgError:  # no convergence: nothing to show (the rows' check says what is wrong)
        return np.array([])


def pooled(summaries: Sequence[StatisticsSummary]) -> tuple[ss.Statistics, ss.NoiseScales]:
    """Return the statistics and noise of several silos' releases pooled (sums add, noise variances add)."""
    statistics, scales = summaries[0].statistics, summaries[0].scales
    for summary in summaries[1:]:
        statistics, scales = statistics + summary.statistics, scales + summary.scales
    return statistics, scales


def _recorded_scales(metadata: ClientMetadata) -> dict[str, float] | None:
    """Return the privacy report's σ of each part, or None when it does not record all three as numbers."""
    probabilities = metadata.privacy_report.probabilities
    values = {key: probabilities.get(key) for key in SIGMA_KEYS}
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values.values()):
        return None
    return {key: float(v) for key, v in values.items()}  # type: ignore[arg-type]


def _noise_findings(scales: ss.NoiseScales, recorded: Mapping[str, float] | None) -> list[str]:
    """Return how the report's σ contradict the parameters' (one line; the ε lines come from the ε check)."""
    if recorded is None:
        return ["the privacy report does not record the noise scales sigma_sums, sigma_counts, sigma_moments"]
    implied = _implied(scales)
    wrong = [key for key in SIGMA_KEYS if not math.isclose(recorded[key], implied[key], rel_tol=1e-9)]
    if not wrong:
        return []
    return [f"the privacy report records {', '.join(f'{k} = {recorded[k]:.6g}' for k in wrong)}; the mechanism's "
            f"parameters give {', '.join(f'{implied[k]:.6g}' for k in wrong)}"]


def _implied(scales: ss.NoiseScales) -> dict[str, float]:
    """Return the σ of each part under the report's names."""
    return dict(zip(SIGMA_KEYS, (scales.sums, scales.counts, scales.moments), strict=True))


def _epsilon_findings(recomputed: Mapping[str, float], mechanism: GaussianStatistics,
                      stated: Mapping[str, float | None]) -> list[str]:
    """Return how ε recomputed from the recorded noise contradicts the recorded target and the report."""
    problems = []
    target = recomputed[mechanism.neighbours]
    if not math.isclose(target, mechanism.epsilon, rel_tol=1e-6, abs_tol=1e-6):
        problems.append(f"the recorded noise scales spend epsilon {target:.6g} ({mechanism.neighbours}), not the "
                        f"recorded {mechanism.epsilon:g}")
    for relation in RELATIONS:
        figure = stated.get(relation)
        if figure is not None and not math.isclose(recomputed[relation], figure, rel_tol=1e-6, abs_tol=1e-6):
            problems.append(f"the recorded noise scales spend epsilon {recomputed[relation]:.6g} {relation}, the "
                            f"privacy report states {figure:.6g}")
    return problems


def _stated_epsilon(metadata: ClientMetadata) -> dict[str, float | None]:
    """Return the privacy report's ε under each relation (add/remove in its probabilities, replace-one exact)."""
    report = metadata.privacy_report
    add_remove = report.probabilities.get("epsilon_add_remove")
    return {accounting.ADD_REMOVE: float(add_remove) if isinstance(add_remove, int | float) else None,
            accounting.REPLACE_ONE: report.exact_epsilon_per_record}


def _row_findings(handle: h5py.File, released: Released, mechanism: GaussianStatistics) -> list[str]:
    """Return how the synthetic rows and labels differ from those the statistics and key give (one line each).

    ``released_statistics.row_problems``: the rows alone; the noise check states ε from the recorded σ itself.
    """
    try:
        return rs.row_problems(handle, released, mechanism)
    except CHECK_ERRORS as error:
        return [f"the synthetic rows could not be regenerated from the released statistics ({short_error(error)})"]


def statistics_summary(handle: h5py.File, metadata: ClientMetadata) -> tuple[StatisticsSummary | None, list[str]]:
    """Return the section of a ``stats:K`` file and its findings; ``(None, [])`` for any other file.

    The findings are the noise check's (the report's σ against the parameters', ε from them against the recorded
    figures) and ``released_statistics.statistics_problems``'s rows and labels (its own ε lines, which the noise
    check states from the recorded σ, are not repeated). A release that cannot be read or checked is one finding.
    """
    if not rs.is_statistics_file(metadata):
        return None, []
    try:
        mechanism = rs.mechanism_of(metadata)
        released = rs.read_release(handle, metadata)
        recorded, stated = _recorded_scales(metadata), _stated_epsilon(metadata)
    except CHECK_ERRORS as error:
        return None, [f"the released statistics could not be read ({short_error(error)})"]
    clip = mechanism.clip_for(metadata.features)
    noise = released.scales if recorded is None else ss.NoiseScales(
        recorded["sigma_sums"], recorded["sigma_counts"], recorded["sigma_moments"], math.nan)
    noise_findings = _noise_findings(released.scales, recorded)
    try:
        recomputed = rs.epsilon_from_noise(noise, clip, mechanism.delta,
                                           moments_clip=mechanism.moments_clip_for(metadata.features),
                                           centered=mechanism.centered)
        noise_findings += _epsilon_findings(recomputed, mechanism, stated)
    except CHECK_ERRORS as error:
        recomputed = {relation: math.nan for relation in RELATIONS}
        noise_findings.append(f"no epsilon follows from the recorded noise scales ({short_error(error)})")
    row_findings = _row_findings(handle, released, mechanism)
    summary = StatisticsSummary(
        width=metadata.features, classes=metadata.num_classes, statistics=released.statistics,
        scales=released.scales, recorded_scales=recorded, clip=clip, clip_is_default=mechanism.clip is None,
        shares=mechanism.shares, moments_about=mechanism.moments_about,
        moments_clip=mechanism.moments_clip_for(metadata.features), shrinkage=mechanism.shrinkage,
        delta=mechanism.delta,
        neighbours=mechanism.neighbours, target_epsilon=mechanism.epsilon, stated_epsilon=stated,
        recomputed_epsilon=recomputed, synthetic_key=released.synthetic_key,
        noise_findings=tuple(noise_findings), row_findings=tuple(row_findings))
    return summary, summary.problems


__all__ = ["SIGMA_KEYS", "StatisticsSummary", "covariance_spectrum", "pooled", "statistics_summary"]
