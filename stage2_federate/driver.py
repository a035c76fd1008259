"""The driver above the round loop, one for both engines: restore, play the rounds left, write the outputs.

The engines differ below it (how a run is planned: from the files here or from the silos' summaries on Flower;
how a client step travels: ``in_process`` or ``flower_engine.transport``) and around it (a progress bar and
printed warnings here; a status file on Flower). From a plan, a writer and a transport on, a run is the same:
the checkpoint's history restored (``loop.restore``), ``config.json`` written, the rounds played
(``loop.run_rounds``), the steps after the last round (:data:`AfterRounds`), the final metrics, model and plot
written (``run_outputs.RunWriter.finish``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ldpfl.contract.federation_privacy import LedgerSection

from .loop import Transport, restore, run_rounds
from .plan import FederationPlan
from .round_record import RoundRecord
from .run_outputs import RunWriter, TrainedOn
from .upload_hashes import UploadHistory

AfterRounds = Callable[[FederationPlan, Sequence[RoundRecord]], None]
"""A step after the last round, on the server: called once with the plan and the run's whole history (a resumed
run's included), after the last round's record and checkpoint are written and before the final outputs
(``model.pt``, the plot, ``metrics.json`` with its ledger) are, so that ``model.pt`` is what it leaves in
``plan.model``. It runs on every engine (the driver is the same); it draws nothing from the run's streams (their
state is the last round's checkpoint). A step of a silo's own (personalization, ``predict``) belongs with the
silo, not here."""


@dataclass
class RunDriver:
    """One run's rounds between its checkpoint and its final outputs; ``warnings``: one line per bad round."""

    plan: FederationPlan
    writer: RunWriter
    history: list[RoundRecord] = field(default_factory=list)
    start: int = 1
    warnings: list[str] = field(default_factory=list)
    uploads: UploadHistory = field(default_factory=UploadHistory)  # the digests of the uploads so far

    @classmethod
    def restored(cls, plan: FederationPlan, writer: RunWriter, payload: dict[str, Any] | None,
                 inputs: dict[str, str]) -> RunDriver:
        """Return the driver of a new run (``payload`` None) or of one resumed from a loaded checkpoint."""
        if payload is None:
            return cls(plan, writer)
        history, start = restore(plan, payload, writer.checkpoint, inputs)
        writer = dataclasses.replace(writer, record=plan.record, privacy=plan.privacy)  # relabelled by the restore
        return cls(plan, writer, history, start, [w for w in (r.warning() for r in history) if w is not None],
                   UploadHistory.from_state(payload.get("uploads")))

    def run(self, transport: Transport, *, min_clients: int, trained_on: TrainedOn, title: str,
            keep_checkpoint: bool, on_kept: Callable[[RoundRecord, str | None], None] | None = None,
            after_rounds: Sequence[AfterRounds] = ()) -> LedgerSection:
        """Write ``config.json``, play rounds ``start`` to the last, write the final outputs; return the ledger.

        ``on_kept`` is called after each round is written, with its record and its warning (or None);
        ``after_rounds``, in order, after the last round (:data:`AfterRounds`).
        """
        self.writer.start()

        def kept(record: RoundRecord) -> None:
            warning = record.warning()
            if warning is not None:
                self.warnings.append(warning)
            if on_kept is not None:
                on_kept(record, warning)

        run_rounds(self.plan, transport, self.writer, self.history, start=self.start, min_clients=min_clients,
                   on_kept=kept, uploads=self.uploads)
        for step in after_rounds:
            step(self.plan, tuple(self.history))
        return self.writer.finish(self.history, self.plan.model, trained_on, title=title,
                                  keep_checkpoint=keep_checkpoint)
