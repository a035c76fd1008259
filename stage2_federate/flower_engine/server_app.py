"""The Flower ``ServerApp`` of ldpfl: the shared round loop (``loop.run_rounds``), with the Flower transport.

The ServerApp waits for the run's SuperNodes, learns which client each serves (``transport.describe``),
plans the run from their summaries (``server_side.plan_from_summaries``), and drives the rounds as the local
engine does (``driver.RunDriver``) with :class:`~.transport.FlowerTransport` carrying each client step to its
node; the outputs are the local engine's (``run_outputs``), plus a status file for the command that started the
run. The run configuration is read once, into :class:`~.protocol.AppRunConfig`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from ldpfl.stage2_federate.checkpoint import load_checkpoint
from ldpfl.stage2_federate.driver import RunDriver
from ldpfl.stage2_federate.loop import finite
from ldpfl.stage2_federate.model_file import summary_record
from ldpfl.stage2_federate.round_record import RoundRecord
from ldpfl.stage2_federate.run_outputs import RunWriter

from . import server_side as ss
from .protocol import AppRunConfig
from .transport import SUBMISSION, TIMELINE, FlowerTransport, describe, finish, wait_for_nodes

app = ServerApp()


def run(grid: Grid, run_config: Mapping[str, Any]) -> None:
    """Run the whole federation (see the module docstring); raise on failure.

    A deployed run (run config ``submission``) first checks that it sees the submitting command's
    output directory and holds it (``server_side.claim_out_dir``) until the process ends.
    """
    settings = AppRunConfig.read(run_config)
    out_dir = Path(settings.out_dir)
    TIMELINE.path = Path(settings.timings_file) if settings.timings_file else None
    token = settings.submission
    claim = ss.claim_out_dir(out_dir, token) if token else None
    SUBMISSION.out_dir, SUBMISSION.token = (out_dir, token) if token else (None, "")
    try:
        _run(grid, settings, out_dir)
    finally:
        if claim is not None:
            claim.release()


def _run(grid: Grid, settings: AppRunConfig, out_dir: Path) -> None:
    config = settings.federation
    status = settings.status_file
    ss.write_status(status, state="starting")
    nodes = wait_for_nodes(grid, settings.num_clients, settings.startup_timeout)
    # every node must serve the file the manifest lists, with claims that add up; a silo that does not is left
    # out and named beside those the launcher left out (a simulation's files that do not verify), and the run
    # goes on while enough of every listed silo remain (server_side.screen_nodes)
    summaries, node_of, left_out = ss.screen_nodes(describe(grid, nodes, settings.startup_timeout), settings)
    plan = ss.plan_from_summaries(config, summaries, run_dir=settings.run_dir or None, left_out=left_out,
                                  entries=list(settings.manifest))
    inputs = {s.file: s.sha256 for s in plan.clients}
    writer = RunWriter(out_dir, config, plan.record, plan.privacy, inputs, engine=ss.ENGINE)
    payload = load_checkpoint(writer.checkpoint, config, engine=ss.ENGINE) if settings.resume else None
    driver = RunDriver.restored(plan, writer, payload, inputs)
    driver.warnings[:0] = [x.line() for x in left_out]  # printed by the command, kept in its result
    if left_out:
        ss.write_status(status, state="starting", warnings=driver.warnings)
    if driver.history:  # resumed: the progress bar starts at the checkpoint's round, as the local engine's does
        ss.write_status(status, state="running", round=driver.start - 1, rounds=config.rounds,
                        test_accuracy=finite(driver.history[-1].test_accuracy), warnings=driver.warnings)

    def kept(record: RoundRecord, _warning: str | None) -> None:
        """Report a completed round (its checkpoint and metrics are written): status, benchmark timeline."""
        ss.write_status(status, state="running", round=record.round, rounds=config.rounds,
                        test_accuracy=finite(record.test_accuracy), warnings=driver.warnings)
        TIMELINE.write(event="round", round=record.round, time=time.time())

    transport = FlowerTransport(grid, plan, node_of, timeout=settings.round_timeout,
                                resume_round=driver.start - 1, history=driver.history,
                                min_clients=settings.min_clients)
    driver.run(transport, min_clients=settings.min_clients,
               trained_on=lambda written: summary_record(plan.clients, config, written),
               title=f"{plan.clients[0].dataset}: {config.aggregation}, perturbation {config.perturbation} "
                     "(Flower)", keep_checkpoint=settings.keep_checkpoint, on_kept=kept)
    history = driver.history
    gone = set(history[-1].lost or ()) if history else set()  # lost in the last round: likely dead, not waited for
    finish(grid, {cid: node for cid, node in node_of.items() if cid not in gone}, settings.round_timeout)
    ss.write_status(status, state="done", rounds_completed=len(history), warnings=driver.warnings,
                    resumed_from_round=driver.start - 1 if driver.start > 1 else None)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the federation; on failure leave a one-line reason in the status file, then raise."""
    status = str(context.run_config.get("status-file", ""))  # even where the rest does not parse
    try:
        run(grid, context.run_config)
    except Exception as error:
        reason = " ".join(str(error).split()) or type(error).__name__
        if not isinstance(error, ss.OutDirUnseen):  # its status file is in the directory it does not see
            ss.write_status(status, state="error", error=reason, kind=type(error).__name__)
        raise
