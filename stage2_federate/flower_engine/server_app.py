"""The Flower ``ServerApp`` of ldpfl: the shared round loop (``loop.run_rounds``), with the Flower transport.

The ServerApp waits for the run's SuperNodes, learns which client each serves (``transport.describe``),
plans the run from their summaries (``server_side.plan_from_summaries``), and runs the rounds of the local
engine with :class:`~.transport.FlowerTransport` carrying each client step to its node; the outputs are
the local engine's (``run_outputs``), plus a status file for the command that started the run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from ..checkpoint import load_checkpoint
from ..loop import finite, restore, run_rounds
from ..model_file import summary_record
from ..round_record import RoundRecord
from ..run_outputs import RunWriter
from . import server_side as ss
from .protocol import ManifestEntry, read_config
from .transport import SUBMISSION, TIMELINE, FlowerTransport, describe, finish, wait_for_nodes

app = ServerApp()


def run(grid: Grid, run_config: Mapping[str, Any]) -> None:
    """Run the whole federation (see the module docstring); raise on failure.

    A deployed run (run config ``submission``) first checks that it sees the submitting command's
    output directory and holds it (``server_side.claim_out_dir``) until the process ends.
    """
    out_dir = Path(str(run_config["out-dir"]))
    TIMELINE.path = Path(str(run_config["timings-file"])) if run_config.get("timings-file") else None
    token = str(run_config.get("submission", ""))
    claim = ss.claim_out_dir(out_dir, token) if token else None
    SUBMISSION.out_dir, SUBMISSION.token = (out_dir, token) if token else (None, "")
    try:
        _run(grid, run_config, out_dir)
    finally:
        if claim is not None:
            claim.release()


def _run(grid: Grid, run_config: Mapping[str, Any], out_dir: Path) -> None:
    config = read_config(run_config)
    status = str(run_config.get("status-file", ""))
    startup, timeout = float(run_config["startup-timeout"]), float(run_config["round-timeout"])
    min_clients = int(run_config.get("min-clients", 0))
    ss.write_status(status, state="starting")
    nodes = wait_for_nodes(grid, int(run_config["num-clients"]), startup)
    summaries, node_of = describe(grid, nodes, startup)
    manifest = ManifestEntry.list_from_json(str(run_config.get("manifest-files", "")))
    if manifest:  # deployment: every node must serve the file the coordinator's manifest lists
        ss.check_manifest(summaries, manifest, str(run_config.get("plan-fingerprint", "")) or None)
    files = json.loads(str(run_config.get("client-files", "")) or "[]")
    run_dir = str(run_config.get("run-dir", "")) or (str(Path(files[0]).parent) if files else None)
    plan = ss.plan_from_summaries(config, summaries, run_dir=run_dir)
    inputs = {s.file: s.sha256 for s in plan.summaries}
    writer = RunWriter(out_dir, config, plan.record, plan.privacy, inputs, engine=ss.ENGINE)
    history: list[RoundRecord] = []
    start = 1
    if bool(run_config.get("resume", False)):
        payload = load_checkpoint(writer.checkpoint, config, engine=ss.ENGINE)
        history, start = restore(plan, payload, writer.checkpoint, inputs)
    writer.start()
    warnings = [w for w in (r.warning() for r in history) if w is not None]
    if history:  # resumed: the progress bar starts at the checkpoint's round, as the local engine's does
        ss.write_status(status, state="running", round=start - 1, rounds=config.rounds,
                        test_accuracy=finite(history[-1].test_accuracy), warnings=warnings)

    def kept(record: RoundRecord) -> None:
        """Report a completed round (its checkpoint and metrics are written): status, benchmark timeline."""
        if (warning := record.warning()) is not None:
            warnings.append(warning)
        ss.write_status(status, state="running", round=record.round, rounds=config.rounds,
                        test_accuracy=finite(record.test_accuracy), warnings=warnings)
        TIMELINE.write(event="round", round=record.round, time=time.time())

    transport = FlowerTransport(grid, plan, node_of, timeout=timeout, resume_round=start - 1, history=history,
                                min_clients=min_clients)
    run_rounds(plan, transport, writer, history, start=start, min_clients=min_clients, on_kept=kept)
    writer.finish(history, plan.model, lambda written: summary_record(plan.summaries, config, written),
                  title=f"{plan.summaries[0].dataset}: {config.aggregation}, perturbation {config.perturbation} "
                        "(Flower)", keep_checkpoint=bool(run_config.get("keep-checkpoint", False)))
    gone = set(history[-1].lost or ()) if history else set()  # lost in the last round: likely dead, not waited for
    finish(grid, {cid: node for cid, node in node_of.items() if cid not in gone}, timeout)
    ss.write_status(status, state="done", rounds_completed=len(history), warnings=warnings,
                    resumed_from_round=start - 1 if start > 1 else None)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the federation; on failure leave a one-line reason in the status file, then raise."""
    status = str(context.run_config.get("status-file", ""))
    try:
        run(grid, context.run_config)
    except Exception as error:
        reason = " ".join(str(error).split()) or type(error).__name__
        if not isinstance(error, ss.OutDirUnseen):  # its status file is in the directory it does not see
            ss.write_status(status, state="error", error=reason, kind=type(error).__name__)
        raise
