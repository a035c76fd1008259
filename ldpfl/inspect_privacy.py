"""The privacy a file states, against the privacy its mechanism's parameters give.

The mechanism is resolved from the attributes ``mechanism`` / ``mechanism_parameters`` into a
``MechanismSpec`` (the same record stage 1 wrote), checked against the file's m, n, r and format, and
its report compared with the stored one (nominal and exact ε side by side). Whether the file is private
is the stored report's ``PrivacyReport.private``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contract.schema import ClientMetadata
from mechanisms.randomness import RANDOMNESS_DESCRIPTIONS

EPS_KEYS = ("nominal_epsilon", "exact_epsilon_per_coordinate", "exact_epsilon_per_record")


@dataclass(frozen=True)
class PrivacySummary:
    """The stored privacy report, condensed, and whether the mechanism's parameters reproduce it."""

    mechanism: str
    private: bool
    nominal_epsilon: float | None
    exact_epsilon_per_coordinate: float | None
    exact_epsilon_per_record: float | None
    coordinate: str
    record: str
    probabilities: Mapping[str, Any]
    randomness: str
    recomputed: Mapping[str, float | None] | None  # None: the mechanism could not be rebuilt
    agrees: bool | None

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict (with the description of the randomness mode)."""
        return dataclasses.asdict(self) | {
            "randomness_description": RANDOMNESS_DESCRIPTIONS.get(self.randomness, "unspecified")}


def as_float(value: Any) -> float | None:
    """Return ``value`` as a float (``"inf"`` as infinity), or ``None`` when it is not a number."""
    if value is None:
        return None
    if value == "inf":
        return math.inf
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def file_mechanism(metadata: ClientMetadata) -> tuple[Any | None, list[str]]:
    """Return the mechanism the attributes name, with the contradictions found (if any).

    ``mechanism_parameters`` holds the mechanism's own parameters, plus the encoding's ``integer_bits``
    and ``fraction_bits`` when the mechanism does not take them (``none`` over packed bits); the
    resolved m, n and r must equal the file's. The mechanism is ``None`` when the attributes do not
    build one, or build one that contradicts the file.
    """
    try:
        spec = metadata.mechanism_spec()
    except (ValueError, TypeError) as error:
        return None, [f"attributes 'mechanism'/'mechanism_parameters' do not build a mechanism ({error})"]
    problems = []
    if spec.feature_format != metadata.feature_format:
        problems.append(f"mechanism {spec.name!r} writes {spec.feature_format} features but the file's "
                        f"feature_format is {metadata.feature_format!r}")
    resolved: dict[str, int | None] = {"features": spec.features}
    if spec.encoding is not None:  # float files carry no encoding: their m and n say nothing
        resolved = {"integer_bits": spec.integer_bits, "fraction_bits": spec.fraction_bits, **resolved}
    for key, value in resolved.items():
        if value is not None and value != getattr(metadata, key):
            problems.append(f"mechanism parameter {key} = {value} differs from the file's {key} = "
                            f"{getattr(metadata, key)}")
    return (None if problems else spec.build()), problems


def privacy_summary(metadata: ClientMetadata, mechanism: Any | None) -> tuple[PrivacySummary, list[str]]:
    """Condense the stored report and compare its ε values with the report of ``mechanism``."""
    stored = metadata.privacy()
    values = {k: as_float(getattr(stored, k)) for k in EPS_KEYS}
    recomputed = None
    problems = []
    if mechanism is not None:
        fresh = mechanism.report()
        recomputed = {k: as_float(getattr(fresh, k)) for k in EPS_KEYS}
        for key in EPS_KEYS:
            if not _same(values[key], recomputed[key]):
                problems.append(f"privacy report: stored {key} = {values[key]} but the mechanism's parameters give "
                                f"{recomputed[key]}")
    summary = PrivacySummary(
        mechanism=metadata.mechanism, private=stored.private, **values, coordinate=stored.coordinate,
        record=stored.record, probabilities=dict(stored.probabilities), randomness=metadata.randomness,
        recomputed=recomputed, agrees=None if recomputed is None else not problems,
    )
    return summary, problems
