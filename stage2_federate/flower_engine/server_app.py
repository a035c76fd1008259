"""The Flower ``ServerApp`` of ldpfl: the local engine's rounds, with the clients behind Flower's Grid.

Flower's own strategies sample nodes with Python's ``random`` over node ids drawn from ``os.urandom``,
so seeding cannot reproduce them. Here the ldpfl strategy selects client *indices* with the run's
seeded server Generator, and each index is mapped to the node that holds that client's file (every node
reports its client index once, :data:`~.protocol.DESCRIBE`). Messages go only to the selected nodes.

A round (LDPFL Algorithm 1 lines 17-21), in the local engine's order of random draws:
``strategy.select`` → the selected clients train and perturb on their nodes (:data:`~.protocol.TRAIN`)
→ ``draw_dropouts`` → ``server_step`` → every node evaluates the new model on its test split (the sums
give the local engine's evaluation on the union of the splits) → ``round_record``, metrics, checkpoint,
status.

**One message per node and round.** In a deployment every message starts a ClientApp process on its
node, so the evaluation of round t's model travels with round t + 1's message: a selected client first
evaluates the global model it receives, then trains from it; the others get an evaluation-only message
(:data:`~.protocol.EVALUATE`) in the same exchange. After the last round one evaluation-only exchange
closes the run. Round t's record (and its checkpoint, with the server's model and streams as they were
after round t) is therefore written when round t + 1's replies are in. Evaluation draws no random numbers,
so the order of every draw, and the result, are the local engine's.

Failures: a client's error reply (its code raised: an unreadable file, a file replaced since the run
started) ends the run with that client's index and one-line reason; a node that does not answer within
``round-timeout`` or is unavailable (a dead SuperNode: Flower replies for it with code NODE_UNAVAILABLE)
is logged in the round's ``lost`` and ``notes``, and the round goes on without it (it is not asked to
evaluate that round, nor to finish after a last round it was lost in). With a failure policy (run config
``min-clients``, ``--min-clients-per-round``: Flower's ``min_fit_clients``) a client's own failure is
logged the same way, and a round in which fewer selected clients trained than the policy asks (all of
them when fewer are selected) ends the run, naming every lost client and its reason.
Replies are matched to clients by message id: Flower's replies for an unavailable node come from the
SuperLink (``src_node_id`` 1), not from the node.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from .. import outputs as out
from ..federation import round_warning
from ..rounds import ClientResult, draw_dropouts, round_record, server_step
from . import server_side as ss
from .protocol import (
    CLIENT_FAILED,
    DESCRIBE,
    EVALUATE,
    EVALUATION,
    FINISH,
    GLOBAL,
    INFO,
    METRICS,
    TIMINGS,
    TRAIN,
    UPLOAD,
    ClientSummary,
    EvaluateInstruction,
    ManifestEntry,
    MessageError,
    TrainInstruction,
    TrainReply,
    read_config,
)

app = ServerApp()


class ClientFailedError(RuntimeError):
    """A client's own code failed (its error reply)."""


class Timeline:
    """Benchmarks (run config ``timings-file``): one JSON line per reply and per completed round.

    A reply's line holds its message type and round, when the message was pushed and its reply arrived,
    and the ClientApp's own timeline (process start, module ready, handler start, file ready, handler done).
    """

    path: Path | None = None

    def write(self, **row: Any) -> None:
        """Append ``row`` as one JSON line (nothing without a timings file)."""
        if self.path is not None:
            with open(self.path, "a") as handle:
                handle.write(json.dumps(row) + "\n")


TIMELINE = Timeline()


class Submission:
    """A deployed run's output directory and token: the run goes on while its submission record allows it."""

    out_dir: Path | None = None
    token = ""

    def check(self) -> None:
        """Raise ``StopRequested`` when the submitting command asked the run to stop (``ss.stop_requested``)."""
        if self.out_dir is not None and ss.stop_requested(self.out_dir, self.token):
            raise ss.StopRequested("the command that submitted this run asked it to stop (it was interrupted, or "
                                   "a newer ldpfl federate into the output directory took over)")


SUBMISSION = Submission()


def exchange(grid: Grid, messages: Mapping[int, Message], timeout: float, poll: float = 0.1) -> dict[int, Message]:
    """Send one message per key and collect the replies by key until all came or ``timeout`` seconds passed.

    Polls with a back-off from 5 ms to ``poll`` (Flower's own ``send_and_receive`` sleeps 3 s between
    pulls on a deployed SuperLink; a pull is one request to the SuperLink on this machine).
    """
    SUBMISSION.check()  # between exchanges: nothing in flight
    keys = list(messages)
    ids = list(grid.push_messages([messages[k] for k in keys]))
    pushed = time.time()
    key_of = dict(zip(ids, keys, strict=True))
    pending, replies, arrived = set(ids), {}, {}
    deadline = time.monotonic() + timeout
    wait = 0.005
    while pending:
        for reply in grid.pull_messages(list(pending)):
            mid = reply.metadata.reply_to_message_id
            if mid in pending:
                pending.discard(mid)
                replies[key_of[mid]], arrived[key_of[mid]] = reply, time.time()
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(wait)
        wait = min(2 * wait, poll)
    for key, reply in replies.items():
        timeline = {} if reply.has_error() or TIMINGS not in reply.content.config_records else \
            json.loads(str(reply.content.config_records[TIMINGS]["json"]))
        TIMELINE.write(kind=messages[key].metadata.message_type, round=messages[key].metadata.group_id, key=key,
                       pushed=pushed, arrived=arrived[key], **timeline)
    return replies


def wait_for_nodes(grid: Grid, count: int, timeout: float) -> list[int]:
    """Wait until ``count`` nodes are connected; refuse more (another federation's nodes) or too few in time."""
    deadline = time.monotonic() + timeout
    while len(nodes := sorted(grid.get_node_ids())) < count:
        SUBMISSION.check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(nodes)} of {count} SuperNodes connected within {timeout:.0f} s")
        time.sleep(0.2)
    if len(nodes) > count:
        raise RuntimeError(f"{len(nodes)} SuperNodes are connected but the run has {count} clients")
    return nodes


def _message(content: dict[str, Any], node: int, kind: str, round_number: int) -> Message:
    return Message(RecordDict(content), dst_node_id=node, message_type=kind, group_id=str(round_number))


def _info(text: str = "{}") -> ConfigRecord:
    """Return a message's INFO record: JSON text (a record's ``to_json``; ``{}`` when the message needs none)."""
    return ConfigRecord({"json": text})


def _numbers(record: Mapping[str, Any]) -> dict[str, float]:
    """Return a MetricRecord's scalar values as floats (ldpfl's records hold no lists)."""
    return {key: float(value) for key, value in record.items()}


def _failure(reply: Message, client: int, what: str, *, tolerated: bool = False) -> str:
    """Return the note of a failed reply; a client's own failure ends the run unless ``tolerated`` (a policy)."""
    reason = " ".join(str(reply.error.reason).split())
    if int(reply.error.code) == CLIENT_FAILED:
        if not tolerated:
            raise ClientFailedError(f"client {client} failed {what}: {reason}")
        return f"client {client}: failed {what}: {reason[:300]}; lost"
    return f"client {client}: no {what.split()[0]} reply ({reason[:200]}); lost"


class TooFewClientsError(RuntimeError):
    """Fewer selected clients trained in a round than the failure policy (``min-clients``) requires."""


def check_policy(round_number: int, selected: list[int], trained: int, notes: list[str], min_clients: int) -> None:
    """Raise :class:`TooFewClientsError` when fewer than ``min_clients`` of ``selected`` trained (``notes``: why)."""
    if min_clients and trained < min(min_clients, len(selected)):
        raise TooFewClientsError(f"round {round_number}: {trained} of the {len(selected)} selected clients trained, "
                                 f"fewer than the failure policy's {min_clients} (min-clients-per-round): "
                                 + "; ".join(notes))


def describe(grid: Grid, nodes: list[int], timeout: float) -> tuple[list[ClientSummary], dict[int, int]]:
    """Ask every node for its client summary; return the summaries and client index → node id."""
    replies = exchange(grid, {n: _message({INFO: _info()}, n, DESCRIBE, 0) for n in nodes}, timeout)
    summaries, node_of = [], {}
    for node in nodes:
        reply = replies.get(node)
        if reply is None:
            raise RuntimeError(f"SuperNode {node} did not describe its client file within {timeout:.0f} s")
        if reply.has_error():
            raise ClientFailedError(f"SuperNode {node} could not open its client file: "
                                    f"{' '.join(str(reply.error.reason).split())}")
        try:
            summary = ClientSummary.from_json(str(reply.content.config_records[INFO]["json"]))
        except MessageError as error:
            raise MessageError(f"SuperNode {node} described its client file with an {error}") from None
        if summary.index in node_of:
            raise RuntimeError(f"two SuperNodes hold client index {summary.index} ({summary.file})")
        summaries.append(summary)
        node_of[summary.index] = node
    return summaries, node_of


@dataclass
class PendingRound:
    """A round trained and aggregated, whose model the next exchange evaluates; then its record is complete."""

    record: dict[str, Any]
    lost: list[int]
    state: ss.Snapshot  # the server's model and streams after this round: its checkpoint
    started: float


def play_round(grid: Grid, plan: ss.ServerPlan, node_of: dict[int, int], round_number: int, *, timeout: float,
               resume_round: int, trained: set[int], pending: PendingRound | None, min_clients: int = 0
               ) -> tuple[PendingRound, dict[str, Any] | None]:
    """One exchange: the selected train (first evaluating the global model for ``pending``), the others evaluate.

    Returns this round, trained and aggregated (its evaluation comes with the next exchange), and
    ``pending``'s record completed with the evaluation of its model (``None`` without ``pending``).
    """
    started = time.perf_counter()
    config = plan.config
    selected = plan.strategy.select(round_number, plan.streams.server)
    vector = plan.vector
    asked = set() if pending is None else set(node_of) - set(pending.lost)  # lost last round: not asked
    messages = {
        cid: _message({GLOBAL: ArrayRecord([vector]), INFO: _info(TrainInstruction(
            round=round_number, setup=plan.setups[cid], resume_round=resume_round,
            trained_before=cid in trained, evaluate=cid in asked).to_json())}, node_of[cid], TRAIN, round_number)
        for cid in selected}
    messages.update({cid: _evaluate_message(plan, cid, node_of[cid], vector, round_number)
                     for cid in sorted(asked - set(selected))})
    replies = exchange(grid, messages, timeout)
    results, lost, notes = [], [], []
    for cid in selected:
        reply = replies.get(cid)
        if reply is None:
            lost.append(cid)
            notes.append(f"client {cid}: no training reply within {timeout:.0f} s; lost")
        elif reply.has_error():
            lost.append(cid)
            notes.append(_failure(reply, cid, f"training in round {round_number}", tolerated=min_clients > 0))
        else:
            metrics = _numbers(reply.content.metric_records[METRICS])
            try:
                note = TrainReply.from_json(str(reply.content.config_records[INFO]["json"])).note
            except MessageError as error:
                raise MessageError(f"client {cid} answered training in round {round_number} with an {error}") from None
            upload = (reply.content.array_records[UPLOAD].to_numpy_ndarrays()[0]
                      if UPLOAD in reply.content.array_records else None)
            results.append(ClientResult(cid, upload, float(metrics["loss"]), float(metrics["accuracy"]), note))
    check_policy(round_number, selected, len(results), notes, min_clients)
    completed = None if pending is None else complete(pending, plan, replies, asked, node_of, timeout,
                                                      tolerated=min_clients > 0)
    dropped = draw_dropouts(selected, config.drop_per_round, plan.streams.server)  # after training (IV-E)
    surviving = {r.client: r.upload for r in results if r.upload is not None and r.client not in dropped}
    server = server_step(vector, surviving, plan.strategy, plan.rule, rng=plan.streams.server)
    plan.set_vector(server.vector)
    epsilons = {cid: p.epsilon for cid, p in plan.perturbations.items()}
    record = round_record(round_number, selected=selected, clients=results, dropped=dropped, server=server,
                          test_loss=math.nan, test_accuracy=math.nan, epsilons=epsilons, started=started)
    record["notes"] = notes + record["notes"]
    return PendingRound(record, lost, ss.snapshot(plan), started), completed


def _evaluate_message(plan: ss.ServerPlan, cid: int, node: int, vector: np.ndarray, round_number: int) -> Message:
    return _message({GLOBAL: ArrayRecord([vector]), INFO: _info(EvaluateInstruction(plan.setups[cid]).to_json())},
                    node,
                    EVALUATE, round_number)


def complete(pending: PendingRound, plan: ss.ServerPlan, replies: Mapping[int, Message], asked: set[int],
             node_of: dict[int, int], timeout: float, *, tolerated: bool = False) -> dict[str, Any]:
    """Return ``pending``'s record with the evaluation of its model: the unions' mean loss and accuracy per split.

    Clients not ``asked`` (lost in that round's training: no reply in time, or unavailable) are not asked
    again (a dead node would cost another ``timeout``), and their test splits are left out of the union.
    """
    round_number = pending.record["round"]
    splits = ("test", "clean") if plan.config.eval_clean else ("test",)
    sums: dict[str, list[tuple[float, int, int]]] = {name: [] for name in splits}
    notes = []
    for cid in sorted(node_of):
        reply = replies.get(cid)
        if cid not in asked:
            notes.append(f"client {cid}: lost in training, not asked to evaluate; its test split is left out")
        elif reply is None:
            notes.append(f"client {cid}: no evaluation reply within {timeout:.0f} s; its test split is left out")
        elif reply.has_error():
            notes.append(_failure(reply, cid, f"evaluation of round {round_number}'s model", tolerated=tolerated))
        else:
            m = _numbers(reply.content.metric_records[EVALUATION])
            for name in splits:
                sums[name].append((m[f"{name}_loss_sum"], int(m[f"{name}_correct"]), int(m[f"{name}_rows"])))
    evaluation = {name: ss.union_evaluation(values) for name, values in sums.items()}
    record = dict(pending.record)
    record["test_loss"], record["test_accuracy"] = evaluation["test"]
    if "clean" in evaluation:  # eval_clean: each client's local-only clean test file, evaluated on the client
        record["clean_test_loss"], record["clean_test_accuracy"] = evaluation["clean"]
    record["lost"] = list(pending.lost)
    record["notes"] = list(record["notes"]) + notes
    record["seconds"] = time.perf_counter() - pending.started
    return record


def evaluate_last(grid: Grid, plan: ss.ServerPlan, node_of: dict[int, int], pending: PendingRound,
                  timeout: float, *, tolerated: bool = False) -> dict[str, Any]:
    """Close the run with one exchange: every node not lost in the last round evaluates the final model."""
    asked = set(node_of) - set(pending.lost)
    vector = plan.vector
    round_number = pending.record["round"] + 1
    replies = exchange(grid, {cid: _evaluate_message(plan, cid, node_of[cid], vector, round_number)
                              for cid in sorted(asked)}, timeout)
    return complete(pending, plan, replies, asked, node_of, timeout, tolerated=tolerated)


def finish(grid: Grid, node_of: dict[int, int], timeout: float) -> None:
    """Tell every node that the run is over (clients delete their resume state unless it is kept)."""
    exchange(grid, {cid: _message({INFO: _info()}, node, FINISH, 0) for cid, node in node_of.items()},
             min(timeout, 60.0))


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
            claim.close()


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
    paths = ss.output_paths(out_dir)
    inputs = {s.file: s.sha256 for s in plan.summaries}
    history: list[dict[str, Any]] = []
    start = 1
    if bool(run_config.get("resume", False)):
        payload = ss.load_server_checkpoint(paths["checkpoint"], config, inputs)
        history = ss.restore(plan, payload)
        start = int(payload["round"]) + 1
    out_dir.mkdir(parents=True, exist_ok=True)
    out.write_json(paths["config"], plan.record)
    warnings = [w for w in map(round_warning, history) if w is not None]
    if history:  # resumed: the progress bar starts at the checkpoint's round, as the local engine's does
        ss.write_status(status, state="running", round=start - 1, rounds=config.rounds,
                        test_accuracy=_finite(history[-1]["test_accuracy"]), warnings=warnings)
    trained = {c for record in history for c in record["selected"] if c not in record.get("lost", [])}

    def keep(record: dict[str, Any], state: ss.Snapshot) -> None:
        """Keep a completed round: history, checkpoint (the state after that round), metrics, status."""
        history.append(record)
        ss.save_checkpoint(paths["checkpoint"], round_number=record["round"], plan=plan, history=history,
                           inputs=inputs, state=state)
        if (warning := round_warning(record)) is not None:
            warnings.append(warning)
        out.write_metrics_csv(paths["metrics_csv"], history)
        out.write_metrics_json(paths["metrics_json"], config=plan.record, privacy=plan.privacy, rounds=history)
        ss.write_status(status, state="running", round=record["round"], rounds=config.rounds,
                        test_accuracy=_finite(record["test_accuracy"]), warnings=warnings)
        TIMELINE.write(event="round", round=record["round"], time=time.time())

    pending: PendingRound | None = None
    for round_number in range(start, config.rounds + 1):
        previous = pending
        pending, completed = play_round(grid, plan, node_of, round_number, timeout=timeout, resume_round=start - 1,
                                        trained=trained, pending=previous, min_clients=min_clients)
        trained |= set(pending.record["selected"]) - set(pending.lost)
        if previous is not None and completed is not None:
            keep(completed, previous.state)
    if pending is not None:
        keep(evaluate_last(grid, plan, node_of, pending, timeout, tolerated=min_clients > 0), pending.state)
    ss.finish_outputs(paths, plan, history, keep_checkpoint=bool(run_config.get("keep-checkpoint", False)))
    gone = set(history[-1]["lost"]) if history else set()  # lost in the last round: likely dead, not waited for
    finish(grid, {cid: node for cid, node in node_of.items() if cid not in gone}, timeout)
    ss.write_status(status, state="done", rounds_completed=len(history), warnings=warnings,
                    resumed_from_round=start - 1 if start > 1 else None)


def _finite(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


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
