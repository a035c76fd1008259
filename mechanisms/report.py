"""The frozen privacy report every mechanism publishes.

It carries two ε values side by side:
* ``nominal_epsilon``: the ε the user asked for, which feeds the paper's formulas;
* ``exact_epsilon_per_coordinate`` / ``exact_epsilon_per_record``: the ε that the code as written
  provides, computed from the output probabilities (or noise) it actually uses.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .randomness import RANDOMNESS_DESCRIPTIONS

NOT_GIVEN = "unspecified"


def _json_number(value: float | None) -> float | str | None:
    if value is None:
        return None
    if math.isinf(value):
        return "inf"
    return float(value)


@dataclass(frozen=True)
class PrivacyReport:
    """What one mechanism, with fixed parameters, guarantees."""

    mechanism: str
    source: str
    parameters: Mapping[str, Any]
    nominal_epsilon: float | None
    nominal_delta: float
    exact_epsilon_per_coordinate: float | None
    exact_epsilon_per_record: float | None
    exact_delta: float
    coordinate: str
    record: str
    sigma: float | None = None
    sensitivity: float | None = None
    probabilities: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    randomness: str = NOT_GIVEN

    @property
    def private(self) -> bool:
        return self.exact_epsilon_per_record is None or math.isfinite(self.exact_epsilon_per_record)

    def with_randomness(self, mode: str) -> PrivacyReport:
        """The same report, labelled with the randomness mode (``csprng`` or ``seeded``)."""
        if mode not in RANDOMNESS_DESCRIPTIONS:
            raise ValueError(f"randomness mode must be one of {sorted(RANDOMNESS_DESCRIPTIONS)}, got {mode!r}")
        return dataclasses.replace(self, randomness=mode)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; infinite ε becomes the string ``"inf"``."""
        out = dataclasses.asdict(self)
        for key in ("nominal_epsilon", "exact_epsilon_per_coordinate", "exact_epsilon_per_record", "sigma",
                    "sensitivity"):
            out[key] = _json_number(out[key])
        out["parameters"] = dict(self.parameters)
        out["probabilities"] = json.loads(json.dumps(self.probabilities, default=float))
        out["notes"] = list(self.notes)
        out["randomness_description"] = RANDOMNESS_DESCRIPTIONS.get(self.randomness, NOT_GIVEN)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrivacyReport:
        """Inverse of :meth:`to_dict` (used by readers of HDF5 attributes)."""
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        for key in ("nominal_epsilon", "exact_epsilon_per_coordinate", "exact_epsilon_per_record", "sigma",
                    "sensitivity"):
            if kwargs.get(key) == "inf":
                kwargs[key] = math.inf
        kwargs["notes"] = tuple(kwargs.get("notes", ()))
        return cls(**kwargs)

    def format_text(self) -> str:
        """Human-readable lines, nominal and exact ε side by side."""

        def fmt(x: float | None) -> str:
            if x is None:
                return "n/a"
            if math.isinf(x):
                return "inf (not private)"
            return f"{x:.6g}"

        params = ", ".join(f"{k}={v}" for k, v in self.parameters.items())
        lines = [
            f"mechanism            {self.mechanism}   ({self.source})",
            f"parameters           {params or '-'}",
            f"nominal epsilon      {fmt(self.nominal_epsilon)}" + (
                f"   delta {self.nominal_delta:g}" if self.nominal_delta else ""),
            f"exact epsilon        {fmt(self.exact_epsilon_per_coordinate)} per {self.coordinate}",
            f"                     {fmt(self.exact_epsilon_per_record)} per {self.record}" + (
                f"   delta {self.exact_delta:g}" if self.exact_delta else ""),
        ]
        if self.sigma is not None:
            lines.append(f"sigma                {self.sigma:.6g}")
        if self.sensitivity is not None:
            lines.append(f"sensitivity          {self.sensitivity:g}")
        for name, value in self.probabilities.items():
            lines.append(f"{name:<20} {value}")
        lines.append(f"randomness           {RANDOMNESS_DESCRIPTIONS.get(self.randomness, NOT_GIVEN)}")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)
