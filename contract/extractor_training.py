"""The ``extractor_training`` attribute of a client file, read once into a frozen record for the accountant.

How the function that computed a file's released values was trained (``ldpfl.contract.schema``)::

    {"training": "none"}                                   no trained extractor (raw inputs)
    {"training": "none", "fixed": {"kind": "scattering2d", "J": 2, "L": 8, ...}}   weight-free (``scatter``)
    {"training": "non-private", "records": n}
    {"training": "dp-sgd", "epsilon": ε, "delta": δ, "noise_multiplier": σ, "sampling_probability": q,
     "steps": T, "records": n, ...}

:class:`ExtractorTraining` keeps what the release guarantee needs typed (the kind, n, DP-SGD as it ran and its δ,
the fixed extractor's description) beside the attribute as recorded (``details``, written back unchanged).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ldpfl.mechanisms import accounting
from ldpfl.mechanisms.privacy_events import DP_SGD_KEYS

NO_TRAINING = "none"
NON_PRIVATE = "non-private"
DP_SGD = "dp-sgd"
UNTRAINED_EXTRACTORS = ("none", "scatter")
"""Extractor names that are not trained (raw inputs; ``scatter``, fixed by the software): no part from training.

A ``scatter`` file records ``{"training": "none", "fixed": {...}}``, which gives its part of ε = 0
(``ldpfl.contract.release_guarantee.extractor_part``)."""


def dp_sgd_event(record: Mapping[str, Any] | accounting.DpSgdEvent) -> accounting.DpSgdEvent:
    """Return the accountant's event of DP-SGD as recorded (σ, q, T; ``ValueError`` when it is malformed)."""
    return record if isinstance(record, accounting.DpSgdEvent) else accounting.DpSgdEvent.from_json(record)


@dataclass(frozen=True)
class ExtractorTraining:
    """How a file's extractor was trained: ``training`` (none, non-private, dp-sgd), n, and DP-SGD as it ran.

    ``dp_sgd`` and ``delta`` are set for ``dp-sgd``; ``fixed`` describes a weight-free extractor (``scatter``);
    ``details`` is the attribute as recorded (:meth:`to_json` returns it).
    """

    training: str
    records: int | None = None
    dp_sgd: accounting.DpSgdEvent | None = None
    delta: float | None = None
    fixed: Mapping[str, Any] | None = None
    details: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, value: object, *, trained: bool = True) -> ExtractorTraining:
        """Read the attribute; ``None`` (not recorded) is the non-private training of earlier versions when ``trained``.

        Raises
        ------
        ValueError
            Not a JSON object, or a DP-SGD record without σ, q, T or δ.
        """
        if value is None:
            kind = NON_PRIVATE if trained else NO_TRAINING
            return cls(kind, details={"training": kind})
        if not isinstance(value, Mapping):
            raise ValueError(f"extractor_training must be a JSON object, got {value!r}")
        kind = str(value.get("training"))
        records = value.get("records")
        records = int(records) if isinstance(records, int | float) and not isinstance(records, bool) else None
        fixed = value.get("fixed") if isinstance(value.get("fixed"), Mapping) else None
        if kind != DP_SGD:
            return cls(kind, records, fixed=fixed, details=dict(value))
        if "delta" not in value:
            raise ValueError("extractor_training of DP-SGD lacks the key 'delta'")
        return cls(kind, records, dp_sgd_event(value), float(value["delta"]), fixed, dict(value))

    def to_json(self) -> dict[str, Any]:
        """Return the attribute as recorded."""
        return dict(self.details)


__all__ = ["DP_SGD", "DP_SGD_KEYS", "NON_PRIVATE", "NO_TRAINING", "UNTRAINED_EXTRACTORS", "ExtractorTraining",
           "dp_sgd_event"]
