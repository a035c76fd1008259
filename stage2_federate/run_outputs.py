"""A federation's outputs, written the same way by every engine: config, metrics, checkpoint, model, plot.

``config.json`` is written when the run starts; after each completed round the checkpoint (the state
after that round) and then the metrics; at the end the metrics again, ``model.pt``, ``accuracy.png``, and
the checkpoint is deleted unless kept (it is seed-equivalent: ``checkpoint``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ldpfl.contract.federation_privacy import LedgerSection

from . import outputs as out
from .checkpoint import LOCAL_ENGINE, Snapshot, save_checkpoint
from .client_privacy import ClientPrivacy
from .config import FederationConfig
from .ledger import ledger_caption, ledger_section
from .model_file import save_model
from .round_record import RoundRecord, rows


def output_paths(out_dir: Path) -> dict[str, Path]:
    """Return the output paths of a run in ``out_dir``, by name (``FederationResult.paths``)."""
    return {
        "metrics_csv": out_dir / out.METRICS_CSV, "metrics_json": out_dir / out.METRICS_JSON,
        "accuracy_png": out_dir / out.PLOT_PNG, "model": out_dir / out.MODEL_PT,
        "config": out_dir / out.CONFIG_JSON, "checkpoint": out_dir / out.CHECKPOINT_PT,
    }


TrainedOn = Callable[[Sequence[RoundRecord]], Mapping[str, Any]]
"""Makes ``model.pt``'s ``trained_on`` record from the rounds (``model_file.run_record`` and kin)."""


@dataclass(frozen=True)
class RunWriter:
    """Writes one run's outputs into ``out_dir``.

    ``record`` is ``config.json`` (and ``metrics.json``'s ``config``), ``privacy`` the clients' privacy
    reports, ``inputs`` each client file's name → sha256 (recorded in the checkpoint), ``engine`` the
    engine that writes the checkpoint.
    """

    out_dir: Path
    config: FederationConfig
    record: Mapping[str, Any]
    privacy: Sequence[ClientPrivacy]
    inputs: Mapping[str, str]
    engine: str = LOCAL_ENGINE

    @property
    def paths(self) -> dict[str, Path]:
        """The output paths (:func:`output_paths`)."""
        return output_paths(self.out_dir)

    @property
    def checkpoint(self) -> Path:
        """The checkpoint's path."""
        return self.out_dir / out.CHECKPOINT_PT

    def start(self) -> None:
        """Write ``config.json``."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        out.write_json(self.out_dir / out.CONFIG_JSON, dict(self.record))

    def keep(self, history: Sequence[RoundRecord], state: Snapshot) -> None:
        """Write the checkpoint of the last round in ``history`` (``state``: the state after it), then the metrics."""
        save_checkpoint(self.checkpoint, round_number=history[-1].round, state=state, config=self.config,
                        randomness=str(self.record["randomness"]), history=history, inputs=self.inputs,
                        engine=self.engine)
        self.write_metrics(history, final=False)

    def write_metrics(self, history: Sequence[RoundRecord], *, final: bool = True) -> LedgerSection:
        """Write ``metrics.csv`` and ``metrics.json``; return the ledger written.

        ``final``: the run's last write, its ledger exact to the end.
        """
        written = rows(history)
        ledger = ledger_section(history, self.privacy, final=final)
        out.write_metrics_csv(self.out_dir / out.METRICS_CSV, written)
        out.write_metrics_json(self.out_dir / out.METRICS_JSON, config=dict(self.record), privacy=self.privacy,
                               rounds=written, ledger=ledger)
        return ledger

    def finish(self, history: Sequence[RoundRecord], model: torch.nn.Module, trained_on: TrainedOn, *,
               title: str, keep_checkpoint: bool) -> LedgerSection:
        """Write the metrics, ``model.pt`` and the plot; delete the checkpoint unless kept; return the ledger.

        ``title``: the plot's title; ``trained_on`` makes ``model.pt``'s record of what it was trained on.
        """
        ledger = self.write_metrics(history)
        save_model(self.out_dir / out.MODEL_PT, model, trained_on(history))
        if history:
            out.plot_history(self.out_dir / out.PLOT_PNG, history, title=title, caption=ledger_caption(ledger))
        if not keep_checkpoint:
            self.checkpoint.unlink(missing_ok=True)
        return ledger
