"""The field types of the JSON records the Flower engine's apps exchange, validated by pydantic on the way in.

Each type is an annotation that pydantic reads when it validates a record (``flower_engine.protocol.decode``):
exact JSON types, counts ≥ 0, budgets finite and > 0, and the project's own values (a privacy report, a release
guarantee, a label release, the run's label noise, a silo's training) read by their own ``from_dict``/``from_json``.
They live beside the records' owners, below ``flower_engine``, so that :mod:`.client_description` (a record the
silos send) uses them without importing the Flower engine. Imports neither flwr nor torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

from pydantic import ConfigDict, Field, PlainValidator

from ldpfl.contract.label_release import LabelRelease
from ldpfl.contract.release_guarantee import ReleaseGuarantee
from ldpfl.mechanisms.report import PrivacyReport

from .label_noise import LabelNoise
from .silo_training import SiloTraining, read_training

STRICT = ConfigDict(strict=True, extra="forbid")
"""pydantic's settings of every record: exact JSON types (no "3" for 3) and exactly the record's fields."""

Count = Annotated[int, Field(ge=0)]
AtLeastOne = Annotated[int, Field(ge=1)]
FinitePositive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Finite = Annotated[float, Field(allow_inf_nan=False)]


def _read_report(value: object) -> PrivacyReport:
    """Read a file's privacy report as a message carries it (``PrivacyReport.to_json``'s object)."""
    return value if isinstance(value, PrivacyReport) else PrivacyReport.from_dict(value, ignore_unknown=True)


def _read_guarantee(value: object) -> ReleaseGuarantee:
    """Read a file's release guarantee as a message carries it (``ReleaseGuarantee.to_dict``)."""
    return value if isinstance(value, ReleaseGuarantee) else ReleaseGuarantee.from_dict(value)  # type: ignore[arg-type]


def _read_label_release(value: object) -> LabelRelease:
    """Read a file's label release as a message carries it (``LabelRelease.to_json``)."""
    return LabelRelease.from_json(value)


def _read_label_noise(value: object) -> LabelNoise:
    """Read the run's label noise as a message carries it (``LabelNoise.to_dict``)."""
    if isinstance(value, LabelNoise):
        return value
    if not isinstance(value, Mapping):
        raise ValueError(f"label_noise must be a JSON object, got {value!r}")
    noise = LabelNoise.from_dict(value)
    assert noise is not None
    return noise


def _read_training(value: object) -> SiloTraining:
    """Read a silo's training as a message carries it (``SiloTraining.wire_form``, read by ``read_training``)."""
    if isinstance(value, SiloTraining):
        return value
    if not isinstance(value, Mapping):
        raise ValueError(f"training must be a JSON object, got {value!r}")
    return read_training(value)


WireReport = Annotated[PrivacyReport, PlainValidator(_read_report)]
"""A ``PrivacyReport`` field of a message, read by ``PrivacyReport.from_dict``."""
WireGuarantee = Annotated[ReleaseGuarantee, PlainValidator(_read_guarantee)]
"""A ``ReleaseGuarantee`` field of a message, read by ``ReleaseGuarantee.from_dict``."""
WireLabelRelease = Annotated[LabelRelease, PlainValidator(_read_label_release)]
"""A ``LabelRelease`` field of a message, read by ``LabelRelease.from_json``."""
WireLabelNoise = Annotated[LabelNoise, PlainValidator(_read_label_noise)]
"""The run's ``LabelNoise`` in a message, read by ``LabelNoise.from_dict``."""
WireTraining = Annotated[SiloTraining, PlainValidator(_read_training)]
"""A silo's training (``silo_training``) in a message, read by ``read_training``."""
