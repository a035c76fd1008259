"""One round's metrics as a typed, frozen record: a row of ``metrics.csv`` and an entry of ``metrics.json``.

Both engines make the same record (``loop``). Optional parts are left out of the written row when they do
not apply: ``omega`` (only strategies that draw ω, WU 4.2), ``clean_test_*`` (only with ``eval_clean``),
and ``lost`` (only transports that can lose a client: a Flower node that does not answer; an in-process
client cannot be lost, so the local engine's rows have no ``lost``).

``rejected`` names every silo whose reply the server refused in the round (``reply_checks``: an upload of the
wrong dtype or shape, not finite, past the update-norm bound; metrics or evaluation sums out of range), with the
server's reason: such a silo is left out of the round, never aggregated nor counted in the figures.
``outliers`` (only with a robust rule, or FedAvg's ``outlier_report``) says which silos the rule discounted, clipped
or flagged, and by how much (``outliers``); where the silos' training noise is known (``silo_training``: noisy
SGD steps) also each silo's distance in units of its own noise and its bound (``noise_distance``,
``noise_bound``) and the round's ``noise_median``, which name the silos.
``per_client`` holds the global model's loss and accuracy on each silo's test rows (the union figures are
``test_loss`` and ``test_accuracy``). A round whose model is not evaluated (``eval_every``: ``schedule``) has
NaN test figures (``null`` in ``metrics.json``, empty in ``metrics.csv``), no ``per_client`` and
``"model_evaluated": false`` in its row; an evaluated round's row has no such key.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .outliers import OutlierReport

Number = float | int


@dataclass(frozen=True)
class SplitSums:
    """One silo's evaluation of the global model on one split: summed cross-entropy, correct predictions, rows."""

    loss_sum: float
    correct: int
    rows: int


@dataclass(frozen=True)
class ClientEvaluation:
    """What one silo reports of the global model: its test split's sums (and its clean file's, ``eval_clean``)."""

    client: int
    test: SplitSums
    clean: SplitSums | None = None


@dataclass(frozen=True)
class ClientScore:
    """The global model's mean loss and accuracy on one silo's test rows (a round's ``per_client`` entry)."""

    client: int
    test_loss: float
    test_accuracy: float
    test_rows: int

    def to_dict(self) -> dict[str, Any]:
        """Return the entry as written in ``metrics.json``."""
        return dataclasses.asdict(self)


Rejection = tuple[int, str]
"""A silo whose reply the server refused in a round, and the server's reason (``reply_checks``)."""


@dataclass(frozen=True)
class Evaluation:
    """The global model's mean loss and accuracy on the union of the test splits (and the clean ones)."""

    test_loss: float
    test_accuracy: float
    clean: tuple[float, float] | None = None  # (loss, accuracy) on the clients' clean test files (eval_clean)
    notes: tuple[str, ...] = ()  # clients whose split was left out, and why
    per_client: tuple[ClientScore, ...] = ()  # each silo's own figures (those whose sums were accepted)
    rejected: tuple[Rejection, ...] = ()  # silos whose evaluation sums the server refused


def union_evaluation(sums: Sequence[SplitSums]) -> tuple[float, float]:
    """Mean loss and accuracy over the union of the splits from their sums (NaN when they hold no rows)."""
    rows = sum(s.rows for s in sums)
    if rows == 0:
        return math.nan, math.nan
    return sum(s.loss_sum for s in sums) / rows, sum(s.correct for s in sums) / rows


def evaluation_of(reports: Sequence[ClientEvaluation], *, clean: bool, notes: Sequence[str] = (),
                  rejected: Sequence[Rejection] = ()) -> Evaluation:
    """Return the evaluation of the union of the accepted silos' splits, with each silo's own figures.

    Both engines make their evaluation here from the silos' sums (``reply_checks.check_evaluations`` has
    refused those out of range), so a figure never depends on where it ran.
    """
    test_loss, test_accuracy = union_evaluation([r.test for r in reports])
    clean_figures = union_evaluation([r.clean for r in reports if r.clean is not None]) if clean else None
    per_client = tuple(ClientScore(r.client, *(union_evaluation([r.test]) if r.test.rows else (math.nan, math.nan)),
                                   r.test.rows) for r in sorted(reports, key=lambda r: r.client))
    return Evaluation(test_loss, test_accuracy, clean_figures, tuple(notes), per_client, tuple(rejected))


@dataclass(frozen=True)
class RoundRecord:
    """What happened in one round (LDPFL Algorithm 1 lines 17-21) and how good the resulting model is."""

    round: int
    train_loss: float
    train_accuracy: float
    test_loss: float
    test_accuracy: float
    selected: tuple[int, ...]
    dropped: tuple[int, ...]
    excluded: tuple[int, ...]
    aggregated: tuple[int, ...]
    weights: tuple[Number, ...]
    client_epsilons: tuple[float | None, ...]
    kept_previous_model: bool
    notes: tuple[str, ...]
    seconds: float
    omega: Any = None  # the strategy's ω (WU 4.2), when it draws one
    clean_test_loss: float | None = None
    clean_test_accuracy: float | None = None
    lost: tuple[int, ...] | None = None  # None: the transport cannot lose a client
    rejected: tuple[Rejection, ...] = ()  # (silo, the server's reason): replies refused in the round
    per_client: tuple[ClientScore, ...] = ()  # the global model on each silo's test rows
    model_evaluated: bool = True  # False: the round's model was not evaluated (``eval_every``), test figures NaN
    outliers: OutlierReport | None = None  # the silos the rule discounted or clipped (``outliers``), None: no report

    def evaluated(self, evaluation: Evaluation, seconds: float) -> RoundRecord:
        """Return this record with the evaluation of its model and the round's duration."""
        clean_loss, clean_accuracy = (None, None) if evaluation.clean is None else evaluation.clean
        return dataclasses.replace(self, test_loss=evaluation.test_loss, test_accuracy=evaluation.test_accuracy,
                                   clean_test_loss=clean_loss, clean_test_accuracy=clean_accuracy,
                                   notes=self.notes + evaluation.notes, seconds=seconds,
                                   rejected=self.rejected + evaluation.rejected, per_client=evaluation.per_client)

    def unevaluated(self, seconds: float) -> RoundRecord:
        """Return this record as a round whose model is not evaluated (NaN test figures), with its duration."""
        return dataclasses.replace(self, test_loss=math.nan, test_accuracy=math.nan, clean_test_loss=None,
                                   clean_test_accuracy=None, per_client=(), seconds=seconds, model_evaluated=False)

    def to_dict(self) -> dict[str, Any]:
        """Return the row as written (the keys in the order of ``metrics.json``; absent parts left out)."""
        row: dict[str, Any] = {
            "round": self.round, "train_loss": self.train_loss, "train_accuracy": self.train_accuracy,
            "test_loss": self.test_loss, "test_accuracy": self.test_accuracy,
        }
        if not self.model_evaluated:
            row["model_evaluated"] = False
        row.update({
            "selected": list(self.selected), "dropped": list(self.dropped), "excluded": list(self.excluded),
            "aggregated": list(self.aggregated), "weights": list(self.weights),
            "client_epsilons": list(self.client_epsilons), "kept_previous_model": self.kept_previous_model,
            "notes": list(self.notes),
        })
        if self.omega is not None:
            row["omega"] = self.omega
        row["seconds"] = self.seconds
        if self.clean_test_loss is not None or self.clean_test_accuracy is not None:
            row["clean_test_loss"], row["clean_test_accuracy"] = self.clean_test_loss, self.clean_test_accuracy
        if self.lost is not None:
            row["lost"] = list(self.lost)
        row["rejected"] = [{"client": client, "reason": reason} for client, reason in self.rejected]
        if self.outliers is not None:
            row["outliers"] = self.outliers.to_dict()
        if self.per_client:
            row["per_client"] = [score.to_dict() for score in self.per_client]
        return row

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> RoundRecord:
        """Read a row written by :meth:`to_dict` (a checkpoint's history)."""
        lost = row.get("lost")
        return cls(
            round=int(row["round"]), train_loss=row["train_loss"], train_accuracy=row["train_accuracy"],
            test_loss=row["test_loss"], test_accuracy=row["test_accuracy"], selected=tuple(row["selected"]),
            dropped=tuple(row["dropped"]), excluded=tuple(row["excluded"]), aggregated=tuple(row["aggregated"]),
            weights=tuple(row["weights"]), client_epsilons=tuple(row["client_epsilons"]),
            kept_previous_model=bool(row["kept_previous_model"]), notes=tuple(str(n) for n in row["notes"]),
            seconds=row["seconds"], omega=row.get("omega"), clean_test_loss=row.get("clean_test_loss"),
            clean_test_accuracy=row.get("clean_test_accuracy"), lost=None if lost is None else tuple(lost),
            rejected=tuple((int(r["client"]), str(r["reason"])) for r in row.get("rejected", ())),
            per_client=tuple(ClientScore(int(p["client"]), p["test_loss"], p["test_accuracy"], int(p["test_rows"]))
                             for p in row.get("per_client", ())),
            model_evaluated=bool(row.get("model_evaluated", True)),
            outliers=None if row.get("outliers") is None else OutlierReport.from_dict(row["outliers"]))

    def warning(self) -> str | None:
        """Return one line on what went wrong in the round (clients excluded, no upload, model kept), if anything."""
        notes = list(self.notes)
        if self.kept_previous_model and not notes:
            notes.append("the previous global model is kept")
        return f"round {self.round}: {'; '.join(notes)}" if notes else None


def rows(records: Sequence[RoundRecord]) -> list[dict[str, Any]]:
    """Return the records as written rows (``metrics.csv``, ``metrics.json``, the checkpoint's history)."""
    return [r.to_dict() for r in records]
