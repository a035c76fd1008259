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

from .randomness import GENERATORS, RANDOMNESS_DESCRIPTIONS, UNRECORDED, describe_randomness, randomness_label

NOT_GIVEN = UNRECORDED


def json_number(value: float | None) -> float | str | None:
    """Return ``value`` for JSON: ``None`` kept, an infinite value as the string ``"inf"``, else a float."""
    if value is None:
        return None
    if math.isinf(value):
        return "inf"
    return float(value)


def number_from_json(value: Any, *, name: str, optional: bool) -> float | None:
    """Read a JSON number (or ``"inf"``) as float; ``None`` stays ``None`` when ``optional`` allows it.

    Raises
    ------
    ValueError
        ``value`` is not a number (bool refused), ``"inf"``, or an allowed ``None``; the message starts
        with ``name``.
    """
    if value is None and optional:
        return None
    if value == "inf":
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float):
        allowed = "a number, 'inf'" + (" or null" if optional else "")
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return float(value)


def format_epsilon(value: Any, *, digits: int = 4, infinite: str = "inf (not private)") -> str:
    """Return an ε for a line of text: ``n/a`` for ``None``, ``infinite`` for ∞ or ``"inf"``, else ``digits`` digits."""
    if value is None:
        return "n/a"
    if value == "inf" or (isinstance(value, float) and math.isinf(value)):
        return infinite
    return f"{float(value):.{digits}g}"


_TEXT_KEYS = ("mechanism", "source", "coordinate", "record", "randomness", "generator")
_NUMBER_KEYS = ("nominal_delta", "exact_delta")
_OPTIONAL_NUMBER_KEYS = ("nominal_epsilon", "exact_epsilon_per_coordinate", "exact_epsilon_per_record", "sigma",
                         "sensitivity")


@dataclass(frozen=True)
class PrivacyReport:
    """What one mechanism, with fixed parameters, guarantees.

    The one writer of its JSON form is :meth:`to_dict`, the one reader :meth:`from_dict`; ``parameters`` and
    ``probabilities`` hold plain numbers and strings (the mechanism's), never a report.
    """

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
    generator: str = NOT_GIVEN

    @property
    def private(self) -> bool:
        """False when the per-record ε is infinite (the output is not private)."""
        return self.exact_epsilon_per_record is None or math.isfinite(self.exact_epsilon_per_record)

    def with_randomness(self, mode: str, generator: str = NOT_GIVEN) -> PrivacyReport:
        """Return the same report, labelled with the randomness mode (``csprng`` or ``seeded``) and generator.

        ``generator`` names the bit generator (``AES-CTR``, ``ChaCha20``, ``PCG64``: ``Randomness.generator_name``).
        """
        if mode not in RANDOMNESS_DESCRIPTIONS:
            raise ValueError(f"randomness mode must be one of {sorted(RANDOMNESS_DESCRIPTIONS)}, got {mode!r}")
        if generator not in (NOT_GIVEN, *GENERATORS):
            raise ValueError(f"generator must be one of {', '.join(GENERATORS)}, got {generator!r}")
        return dataclasses.replace(self, randomness=mode, generator=generator)

    @property
    def randomness_label(self) -> str:
        """Return ``csprng (AES-CTR)``, ``seeded (PCG64)``, ...: the mode and the generator."""
        return randomness_label(self.randomness, self.generator)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict; infinite ε becomes the string ``"inf"``."""
        out = dataclasses.asdict(self)
        for key in ("nominal_epsilon", "exact_epsilon_per_coordinate", "exact_epsilon_per_record", "sigma",
                    "sensitivity"):
            out[key] = json_number(out[key])
        out["parameters"] = dict(self.parameters)
        out["probabilities"] = json.loads(json.dumps(self.probabilities, default=float))
        out["notes"] = list(self.notes)
        out["randomness_description"] = describe_randomness(self.randomness, self.generator)
        return out

    def to_json(self) -> str:
        """Return :meth:`to_dict` as one JSON line with sorted keys."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Any, *, ignore_unknown: bool = False) -> PrivacyReport:
        """Inverse of :meth:`to_dict`, for readers of HDF5 attributes and JSON outputs.

        Parameters
        ----------
        data : mapping
            A dict as :meth:`to_dict` writes it (``"inf"`` for infinite values; ``randomness_description``
            is recomputed and may be left out).
        ignore_unknown : bool
            Skip keys that are not fields of the report (e.g. the client and target that stage 2 adds);
            by default they raise.

        Raises
        ------
        ValueError
            ``data`` is not a mapping, or a key is missing, unknown or of the wrong type; the message
            names the key.
        """
        if isinstance(data, PrivacyReport):
            return data
        if not isinstance(data, Mapping):
            raise ValueError(f"a privacy report must be a JSON object, got {type(data).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(str(k) for k in data if k not in fields and k != "randomness_description")
        if unknown and not ignore_unknown:
            raise ValueError(f"privacy report has unknown key(s) {', '.join(map(repr, unknown))}")
        missing = [name for name, f in fields.items() if f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING and name not in data]
        if missing:
            raise ValueError(f"privacy report is missing key(s) {', '.join(map(repr, missing))}")
        kwargs: dict[str, Any] = {}
        for name in fields:
            if name not in data:
                continue
            value = data[name]
            if name in _TEXT_KEYS:
                if not isinstance(value, str):
                    raise ValueError(f"privacy report key {name!r} must be a string, got {value!r}")
            elif name in _OPTIONAL_NUMBER_KEYS:
                value = number_from_json(value, name=f"privacy report key {name!r}", optional=True)
            elif name in _NUMBER_KEYS:
                value = number_from_json(value, name=f"privacy report key {name!r}", optional=False)
            elif name in ("parameters", "probabilities"):
                if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
                    raise ValueError(f"privacy report key {name!r} must be an object with string keys, "
                                     f"got {value!r}")
                value = dict(value)
            elif name == "notes":
                if not isinstance(value, list | tuple) or not all(isinstance(n, str) for n in value):
                    raise ValueError(f"privacy report key 'notes' must be a list of strings, got {value!r}")
                value = tuple(value)
            kwargs[name] = value
        if "randomness" in kwargs and kwargs["randomness"] not in (NOT_GIVEN, *RANDOMNESS_DESCRIPTIONS):
            raise ValueError(f"privacy report key 'randomness' must be one of "
                             f"{', '.join([NOT_GIVEN, *RANDOMNESS_DESCRIPTIONS])}, got {kwargs['randomness']!r}")
        if "generator" in kwargs and kwargs["generator"] not in (NOT_GIVEN, *GENERATORS):
            raise ValueError(f"privacy report key 'generator' must be one of "
                             f"{', '.join([NOT_GIVEN, *GENERATORS])}, got {kwargs['generator']!r}")
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
        lines.append(f"randomness           {self.randomness_label}: "
                     f"{describe_randomness(self.randomness, self.generator)}")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)
