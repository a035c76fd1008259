"""The local engine: one federation run over the client files of an export run, with checkpoint and resume.

The protocol is LDPFL Algorithm 1 lines 11-25:

1. the server initializes the model (line 13) and broadcasts it (line 14);
2. each round (line 17) the strategy selects k of the N clients (or γ·N, PLDP-FL Algorithm 1 line 4);
3. each selected client loads the global model, trains ``local_epochs`` epochs (line 19), and uploads its
   parameters (line 20), perturbed by its own mechanism with its own budget (Wu 3.1, PLDP Algorithm 1
   line 19, DP-FedAW eq. 9);
4. ``drop_per_round`` of the selected clients drop out after training (LDPFL IV-E: their uploads are lost);
5. uploads that are not finite are excluded (and logged); the server aggregates the rest (line 21, or
   Wu eqs. 12-16, PLDP eq. 7, DP-FedAW eq. 10); with no surviving upload the previous model is kept;
6. the global model is evaluated on the union of the clients' randomized test splits (as the LDPFL
   reference does), and the round's metrics and a checkpoint are written.

The set-up is ``plan``; the driver ``driver``, the round loop ``loop``, the steps of a round ``rounds`` and the
result ``result`` are shared with the Flower engine; the in-process transport ``in_process``, the random streams
``streams``, the outputs ``run_outputs`` and the checkpoint ``checkpoint``; this module runs the local engine
in this process. The seed itself is never written anywhere.

Decisions:

* Clients are stateless between rounds: the optimizer is created afresh at each local training (the
  paper does not say whether Adam's moments survive a round; keeping them would make the checkpoint hold
  N optimizer states).
* ``local_epochs`` defaults to 2, not the paper's 20 (IV-E), to keep CPU runs short; pass 20 to match.
* Per-client lists (ε, safe-range lengths, centres) are given in client-index order.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ldpfl.common.errors import ParameterError
from ldpfl.contract.layout import FEDERATION_DIR

from . import outdir
from .checkpoint import check_inputs, check_silos, client_digests, load_checkpoint
from .closed_form import run_closed_form
from .config import FederationConfig
from .console import print_warning
from .driver import RunDriver
from .in_process import InProcessTransport
from .model_file import run_record
from .plan import plan_federation
from .result import FederationResult
from .round_record import RoundRecord, rows
from .run_outputs import RunWriter, output_paths
from .streams import Streams

__all__ = ["FederationConfig", "FederationResult", "Streams", "default_out_dir", "run_federation"]


def default_out_dir(run_dir: str | Path) -> Path:
    """``RUN_DIR/federation``."""
    return Path(run_dir) / FEDERATION_DIR


def run_federation(run_dir: str | Path, config: FederationConfig, *, out_dir: str | Path | None = None,
                   resume: bool = False, progress: bool = True, overwrite: bool = False,
                   keep_checkpoint: bool = False,
                   on_warning: Callable[[str], None] | None = print_warning,
                   on_round: Callable[[Mapping[str, Any]], None] | None = None,
                   min_clients: int | None = None) -> FederationResult:
    """Run (or resume) a federation over the client files in ``run_dir``; write the outputs to ``out_dir``.

    Parameters
    ----------
    run_dir
        An export run directory (``manifest.json`` + ``client_XXX.h5``).
    config
        The run's configuration.
    out_dir
        Where to write ``metrics.csv``, ``metrics.json``, ``accuracy.png``, ``model.pt``, ``config.json``
        and ``checkpoint.pt``; default ``RUN_DIR/federation``.
    resume
        Continue from ``out_dir/checkpoint.pt``; the configuration must match the checkpoint's (only
        ``rounds``, ``device``, ``threads`` and ``eval_batch_size`` may change).
    progress
        Show a tqdm bar over rounds on stderr with the current test accuracy.
    overwrite
        Start afresh even if ``out_dir`` already holds a run.
    keep_checkpoint
        Keep ``checkpoint.pt`` once the run completes (it allows ``resume`` with more rounds). Off by
        default: it holds the state of every generator, from which each client's perturbation noise can
        be recomputed (it holds each generator's key or seed), so it is seed-equivalent and, like a seed, is not
        left among the outputs. An interrupted run always keeps its last checkpoint for ``resume``.
    on_warning
        Called with one line for each round in which clients were excluded or no upload survived (the
        lines are also in ``FederationResult.warnings``); by default printed to stderr as ``Warning: ...``.
        ``None``: not printed.
    on_round
        Called with each round's record once its metrics and checkpoint are written.
    min_clients
        The failure policy, as on Flower: a round in which fewer selected clients trained (a silo whose reply the
        server rejected did not) ends the run with ``loop.TooFewClientsError`` (one line naming each rejected
        silo and why); ``None``: the round goes on with whoever trained, and keeps the model when nobody did.

    With ``config.head`` lda no round is played: ``closed_form.run_closed_form`` fits the head on the files' pooled
    released statistics and writes the same outputs (no checkpoint; ``resume`` is refused).

    The run holds a lock on ``out_dir`` (a second run into it is refused) and removes the outputs'
    temporary files there when it starts and when it completes (``ldpfl.stage2_federate.outdir``). The
    checkpoint records the sha256 of every client file; ``resume`` refuses one made on other files.

    Returns
    -------
    FederationResult
        The per-round metrics, the final test accuracy and the output paths.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"run directory {run_dir} does not exist or is not a directory")
    target_dir = default_out_dir(run_dir) if out_dir is None else Path(out_dir)
    if config.closed_form:  # no round: the head is fitted on the files' pooled released statistics
        if resume:
            raise ParameterError(f"`resume`: `head` {config.head} has no rounds to resume")
        return run_closed_form(run_dir, config, target_dir, overwrite=overwrite, on_round=on_round)
    paths = output_paths(target_dir)
    with outdir.locked(target_dir):
        return _run_locked(run_dir, config, target_dir, paths, resume=resume, progress=progress,
                           overwrite=overwrite, keep_checkpoint=keep_checkpoint, on_warning=on_warning,
                           on_round=on_round, min_clients=min_clients)


def _run_locked(run_dir: Path, config: FederationConfig, target_dir: Path, paths: dict[str, Path], *,
                resume: bool, progress: bool, overwrite: bool, keep_checkpoint: bool,
                on_warning: Callable[[str], None] | None,
                on_round: Callable[[Mapping[str, Any]], None] | None, min_clients: int | None) -> FederationResult:
    """Run the body of :func:`run_federation`, holding the lock on ``target_dir``."""
    outdir.remove_temporaries(target_dir)  # left by a process killed mid-write
    checkpoint_path = paths["checkpoint"]
    outdir.check_out_dir(target_dir, resume=resume, overwrite=overwrite)
    payload = load_checkpoint(checkpoint_path, config) if resume else None
    plan = plan_federation(run_dir, config, min_clients=min_clients)  # leaves out a silo whose claim is refused
    inputs = client_digests(plan.data)
    if payload is not None:  # other files first, then a silo left out now that the checkpoint's rounds trained
        check_inputs(checkpoint_path, payload, inputs)
        check_silos(checkpoint_path, payload, [c.index for c in plan.data.clients],
                    plan.record["run"].get("left_out", []))
    writer = RunWriter(target_dir, config, plan.record, plan.privacy, inputs)
    driver = RunDriver.restored(plan, writer, payload, inputs)
    if payload is None and overwrite:
        outdir.clear_outputs(target_dir)  # nothing of the previous run may mix with this one's
    left_out = plan.record["run"].get("left_out", [])
    notes = [f"left out before round 1: {x['reason']}" for x in left_out]  # as the Flower engine words it
    listed, expected = len(plan.data.clients) + len(left_out), plan.data.first.client_count
    if listed < expected and driver.start == 1:
        notes.append(f"the run lists {listed} client file(s) but its files say "
                     f"client_count {expected}: federating {len(plan.data.clients)} client(s) only")
    driver.warnings[:0] = notes
    if on_warning is not None:
        for note in notes:
            on_warning(note)

    from tqdm.auto import tqdm

    bar = tqdm(total=config.rounds, initial=driver.start - 1, desc="federate", unit="round", file=sys.stderr,
               disable=not progress, dynamic_ncols=True, leave=True)

    def kept(record: RoundRecord, warning: str | None) -> None:
        if warning is not None and on_warning is not None:
            on_warning(warning)
        bar.update(1)
        bar.set_postfix(test_acc=_fmt(record.test_accuracy))
        if on_round is not None:
            on_round(record.to_dict())

    try:
        if driver.history:
            bar.set_postfix(test_acc=_fmt(driver.history[-1].test_accuracy))
        ledger = driver.run(InProcessTransport(plan), min_clients=min_clients or 0,
                            trained_on=lambda written: run_record(plan.data, config, written),
                            title=f"{plan.data.dataset}: {config.aggregation}, perturbation {config.perturbation}",
                            keep_checkpoint=keep_checkpoint, on_kept=kept)
    finally:
        bar.close()
    if not keep_checkpoint:
        del paths["checkpoint"]
    outdir.remove_temporaries(target_dir)
    history = driver.history
    final = history[-1].test_accuracy if history else None
    return FederationResult(rows(history), final, paths, plan.record, plan.privacy,
                            None if payload is None else int(payload["round"]), tuple(driver.warnings), ledger)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.4f}"
