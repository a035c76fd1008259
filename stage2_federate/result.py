"""What a federation run returns, on either engine (``ldpfl federate --json``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ldpfl.contract.federation_privacy import LedgerSection
from ldpfl.contract.jsonout import json_ready

from .client_privacy import ClientPrivacy
from .outliers import OutlierReport, persistent_outliers
from .pooled_figure import final_round_flags


@dataclass(frozen=True)
class FederationResult:
    """The per-round history, the final accuracy and the output paths of a run."""

    history: list[dict[str, Any]]
    final_accuracy: float | None
    paths: dict[str, Path]
    config: dict[str, Any]
    privacy: tuple[ClientPrivacy, ...]  # each client's, in client-index order (metrics.json's privacy)
    resumed_from_round: int | None = None
    warnings: tuple[str, ...] = ()
    privacy_ledger: LedgerSection | None = None  # ledger.ledger_section: each client's total over the run

    def to_dict(self) -> dict[str, Any]:
        """Return the result as JSON-ready values (``ldpfl federate --json``)."""
        return json_ready({
            "final_test_accuracy": self.final_accuracy, "rounds_completed": len(self.history),
            "resumed_from_round": self.resumed_from_round,
            "test_accuracy": [r["test_accuracy"] for r in self.history],
            **({"clean_test_accuracy": [r.get("clean_test_accuracy") for r in self.history]}
               if any("clean_test_accuracy" in r for r in self.history) else {}),
            "per_client": [r.get("per_client", []) for r in self.history],  # each silo's test loss and accuracy
            "rejected": [r.get("rejected", []) for r in self.history],  # silos the server refused, and why
            **({"outliers": [r.get("outliers") for r in self.history],  # the silos the rule discounted, by how much
                "named_outliers": [p.to_dict() for p in persistent_outliers(
                    [OutlierReport.from_dict(r["outliers"]) for r in self.history if r.get("outliers")])]}
               if any(r.get("outliers") for r in self.history) else {}),
            **({"pooled_figure_flags": flags} if (flags := final_round_flags(self.history)) else {}),
            "outputs": {k: str(v) for k, v in self.paths.items()}, "config": self.config,
            "warnings": list(self.warnings),
            "privacy_ledger": None if self.privacy_ledger is None else self.privacy_ledger.to_dict(),
        })
