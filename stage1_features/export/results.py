"""What ``run_export`` returns: one :class:`ClientSummary` per client inside an :class:`ExportResult`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ldpfl import mechanisms
from ldpfl.contract.label_release import CLEAR_LABELS, LabelRelease
from ldpfl.contract.layout import client_stem
from ldpfl.contract.release_guarantee import ReleaseGuarantee, weakest


@dataclass(frozen=True)
class ClientSummary:
    """One client of a run: where its file is and whether this run made it."""

    index: int
    rows: Mapping[str, int]
    local_accuracy: float | None
    file: str
    sha256: str
    status: str  # "new", "reused" (listed and verified) or "adopted" (found, validated, added to the manifest)
    model_file: str | None = None
    seconds: float | None = None
    train_samples_per_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return dataclasses.asdict(self) | {"rows": dict(self.rows)}


@dataclass(frozen=True)
class ExportResult:
    """What ``run_export`` did."""

    run_dir: Path
    manifest: Path
    dataset: str
    extractor: str
    mechanism: str
    feature_format: str
    features: int
    feature_width: int
    privacy: mechanisms.PrivacyReport
    randomness: str
    clients: list[ClientSummary]
    seconds: float
    notes: tuple[str, ...] = ()
    release: str = "flatten"
    label_release: LabelRelease = CLEAR_LABELS  # how the files release their labels
    release_guarantees: Mapping[int, ReleaseGuarantee] = dataclasses.field(default_factory=dict)
    """Each client file's ``release_guarantee`` by client index: everything it releases about one record."""

    @property
    def release_guarantee(self) -> ReleaseGuarantee | None:
        """Return the weakest client file's guarantee (the largest (ε, δ)); None before any client is finished."""
        return weakest(self.release_guarantees.values())

    @property
    def new(self) -> int:
        """Return how many clients this run exported (not reused or adopted)."""
        return sum(c.status == "new" for c in self.clients)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready summary (the ``--json`` output of ``ldpfl export``)."""
        report = self.privacy.to_dict()
        return {
            "run_dir": str(self.run_dir), "manifest": str(self.manifest), "dataset": self.dataset,
            "extractor": self.extractor, "release": self.release, "mechanism": self.mechanism,
            "feature_format": self.feature_format,
            "features": self.features, "feature_width": self.feature_width,
            "nominal_epsilon": report.get("nominal_epsilon"),
            "exact_epsilon_per_record": report.get("exact_epsilon_per_record"),
            "exact_epsilon_per_coordinate": report.get("exact_epsilon_per_coordinate"),
            "private": self.privacy.private,
            "randomness": self.randomness, "generator": self.privacy.generator, "seconds": round(self.seconds, 3),
            "clients": [c.to_dict() for c in self.clients],
            "new": self.new, "reused": len(self.clients) - self.new, "notes": list(self.notes),
            "label_release": self.label_release.to_json(),
            "release_guarantee": None if self.release_guarantee is None else self.release_guarantee.to_dict(),
            "release_guarantees": {client_stem(index): g.to_dict()  # keyed as the manifest's
                                   for index, g in sorted(self.release_guarantees.items())},
        }
