"""The privacy a file states, against the privacy its mechanism's parameters give.

The mechanism is resolved from the attributes ``mechanism`` / ``mechanism_parameters`` into a
``MechanismSpec`` (the same record stage 1 wrote), checked against the file's m, n, r and format, and
its report compared with the stored one (nominal and exact ε side by side). Whether the file is private
is the stored report's ``PrivacyReport.private``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ldpfl.contract.file_checks import EPS_KEYS, as_float, mechanism_problems, privacy_problems
from ldpfl.contract.schema import ClientMetadata
from ldpfl.mechanisms.base import Mechanism
from ldpfl.mechanisms.randomness import describe_randomness

__all__ = ["EPS_KEYS", "PrivacySummary", "as_float", "file_mechanism", "privacy_summary"]


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
    generator: str  # the bit generator of the noise (``AES-CTR``, ``ChaCha20``, ``PCG64``)
    recomputed: Mapping[str, float | None] | None  # None: the mechanism could not be rebuilt
    agrees: bool | None

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict (with the description of the randomness mode and generator)."""
        return dataclasses.asdict(self) | {
            "randomness_description": describe_randomness(self.randomness, self.generator)}


def file_mechanism(metadata: ClientMetadata) -> tuple[Any | None, list[str]]:
    """Return the mechanism the attributes name, with the contradictions found (if any).

    The check is ``ldpfl.contract.file_checks.mechanism_problems``, the one the run-directory validator
    (``ldpfl federate``) applies too.
    """
    _, mechanism, problems = mechanism_problems(metadata)
    return mechanism, problems


def privacy_summary(metadata: ClientMetadata, mechanism: Mechanism | None) -> tuple[PrivacySummary, list[str]]:
    """Condense the stored report and compare its ε values with the report of ``mechanism``."""
    stored = metadata.privacy()
    values, recomputed, problems = privacy_problems(metadata, mechanism)
    summary = PrivacySummary(
        mechanism=metadata.mechanism, private=stored.private, **values, coordinate=stored.coordinate,
        record=stored.record, probabilities=dict(stored.probabilities), randomness=metadata.randomness,
        generator=metadata.generator,
        recomputed=recomputed, agrees=None if recomputed is None else not problems,
    )
    return summary, problems
