"""The Flower ``ServerApp`` of ldpfl: the local engine's rounds, with the clients behind Flower's Grid.

Flower's own strategies sample nodes with Python's ``random`` over node ids drawn from ``os.urandom``,
so seeding cannot reproduce them. Here the ldpfl strategy selects client *indices* with the run's
seeded server Generator, and each index is mapped to the node that holds that client's file (every node
reports its client index once, :data:`~.protocol.DESCRIBE`). Messages go only to the selected nodes.

A round (LDPFL Algorithm 1 lines 17-21), in the local engine's order of random draws:
``strategy.select`` → the selected clients train and perturb on their nodes (:data:`~.protocol.TRAIN`)
→ ``draw_dropouts`` → ``server_step`` → every node evaluates the new model on its test split
(:data:`~.protocol.EVALUATE`; the sums give the local engine's evaluation on the union of the splits)
→ ``round_record``, metrics, checkpoint, status.

Failures: a client's error reply (its code raised) ends the run with that client's one-line reason; a
node that does not answer within ``round-timeout`` or is unavailable (a dead SuperNode: Flower replies
for it with code NODE_UNAVAILABLE) is logged in the round's ``lost`` and ``notes``, and the round goes on
without it (it is not asked to evaluate that round, nor to finish after a last round it was lost in).
Replies are matched to clients by message id: Flower's replies for an unavailable node come from the
SuperLink (``src_node_id`` 1), not from the node.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
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
    FINISH,
    GLOBAL,
    INFO,
    METRICS,
    TRAIN,
    UPLOAD,
    ClientSummary,
    EvaluateInstruction,
    MessageError,
    TrainInstruction,
    TrainReply,
    read_config,
)

app = ServerApp()


class ClientFailedError(RuntimeError):
    """A client's own code failed (its error reply)."""


def exchange(grid: Grid, messages: Mapping[int, Message], timeout: float, poll: float = 0.2) -> dict[int, Message]:
    """Send one message per key and collect the replies by key until all came or ``timeout`` seconds passed.

    Polls with a back-off from 5 ms to ``poll`` (Flower's own ``send_and_receive`` sleeps 3 s between
    pulls on a deployed SuperLink).
    """
    keys = list(messages)
    ids = list(grid.push_messages([messages[k] for k in keys]))
    key_of = dict(zip(ids, keys, strict=True))
    pending, replies = set(ids), {}
    deadline = time.monotonic() + timeout
    wait = 0.005
    while pending:
        for reply in grid.pull_messages(list(pending)):
            mid = reply.metadata.reply_to_message_id
            if mid in pending:
                pending.discard(mid)
                replies[key_of[mid]] = reply
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(wait)
        wait = min(2 * wait, poll)
    return replies


def wait_for_nodes(grid: Grid, count: int, timeout: float) -> list[int]:
    """Wait until ``count`` nodes are connected; refuse more (another federation's nodes) or too few in time."""
    deadline = time.monotonic() + timeout
    while len(nodes := sorted(grid.get_node_ids())) < count:
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


def _failure(reply: Message, client: int, what: str) -> str:
    reason = " ".join(str(reply.error.reason).split())
    if int(reply.error.code) == CLIENT_FAILED:
        raise ClientFailedError(f"client {client} failed {what}: {reason}")
    return f"client {client}: no {what.split()[0]} reply ({reason[:200]}); lost"


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


def play_round(grid: Grid, plan: ss.ServerPlan, node_of: dict[int, int], round_number: int, *, timeout: float,
               resume_round: int, trained: set[int]) -> dict[str, Any]:
    """One round through Flower: select, train on the nodes, drop, aggregate, evaluate on the nodes."""
    started = time.perf_counter()
    config = plan.config
    selected = plan.strategy.select(round_number, plan.streams.server)
    vector = plan.vector
    messages = {
        cid: _message({GLOBAL: ArrayRecord([vector]), INFO: _info(TrainInstruction(
            round=round_number, setup=plan.setups[cid], resume_round=resume_round,
            trained_before=cid in trained).to_json())}, node_of[cid], TRAIN, round_number)
        for cid in selected}
    replies = exchange(grid, messages, timeout)
    results, lost, notes = [], [], []
    for cid in selected:
        reply = replies.get(cid)
        if reply is None:
            lost.append(cid)
            notes.append(f"client {cid}: no training reply within {timeout:.0f} s; lost")
        elif reply.has_error():
            lost.append(cid)
            notes.append(_failure(reply, cid, f"training in round {round_number}"))
        else:
            metrics = _numbers(reply.content.metric_records[METRICS])
            try:
                note = TrainReply.from_json(str(reply.content.config_records[INFO]["json"])).note
            except MessageError as error:
                raise MessageError(f"client {cid} answered training in round {round_number} with an {error}") from None
            upload = (reply.content.array_records[UPLOAD].to_numpy_ndarrays()[0]
                      if UPLOAD in reply.content.array_records else None)
            results.append(ClientResult(cid, upload, float(metrics["loss"]), float(metrics["accuracy"]), note))
    dropped = draw_dropouts(selected, config.drop_per_round, plan.streams.server)  # after training (IV-E)
    surviving = {r.client: r.upload for r in results if r.upload is not None and r.client not in dropped}
    server = server_step(vector, surviving, plan.strategy, plan.rule, rng=plan.streams.server)
    plan.set_vector(server.vector)
    evaluation, eval_notes = evaluate(grid, plan, node_of, round_number, timeout, skip=set(lost))
    test_loss, test_accuracy = evaluation["test"]
    epsilons = {cid: p.epsilon for cid, p in plan.perturbations.items()}
    record = round_record(round_number, selected=selected, clients=results, dropped=dropped, server=server,
                          test_loss=test_loss, test_accuracy=test_accuracy, epsilons=epsilons, started=started)
    if "clean" in evaluation:  # eval_clean: each client's local-only clean test file, evaluated on the client
        record["clean_test_loss"], record["clean_test_accuracy"] = evaluation["clean"]
    record["lost"] = lost
    record["notes"] = notes + record["notes"] + eval_notes
    return record


def evaluate(grid: Grid, plan: ss.ServerPlan, node_of: dict[int, int], round_number: int,
             timeout: float, skip: set[int] | frozenset[int] = frozenset()) -> tuple[dict[str, tuple[float, float]],
                                                                                  list[str]]:
    """Every node evaluates the global vector; return the unions' mean loss and accuracy per split, and notes.

    ``skip``: clients lost in this round's training (no reply in time, or unavailable); they are not asked
    (a dead node would cost another ``timeout``), and their test splits are left out of this round's union.
    """
    vector = plan.vector
    messages = {cid: _message({GLOBAL: ArrayRecord([vector]),
                               INFO: _info(EvaluateInstruction(plan.setups[cid]).to_json())},
                              node, EVALUATE, round_number) for cid, node in node_of.items() if cid not in skip}
    replies = exchange(grid, messages, timeout)
    splits = ("test", "clean") if plan.config.eval_clean else ("test",)
    sums: dict[str, list[tuple[float, int, int]]] = {name: [] for name in splits}
    notes = []
    for cid in sorted(node_of):
        reply = replies.get(cid)
        if cid in skip:
            notes.append(f"client {cid}: lost in training, not asked to evaluate; its test split is left out")
        elif reply is None:
            notes.append(f"client {cid}: no evaluation reply within {timeout:.0f} s; its test split is left out")
        elif reply.has_error():
            notes.append(_failure(reply, cid, f"evaluation in round {round_number}"))
        else:
            m = _numbers(reply.content.metric_records[METRICS])
            for name in splits:
                sums[name].append((m[f"{name}_loss_sum"], int(m[f"{name}_correct"]), int(m[f"{name}_rows"])))
    return {name: ss.union_evaluation(values) for name, values in sums.items()}, notes


def finish(grid: Grid, node_of: dict[int, int], timeout: float) -> None:
    """Tell every node that the run is over (clients delete their resume state unless it is kept)."""
    exchange(grid, {cid: _message({INFO: _info()}, node, FINISH, 0) for cid, node in node_of.items()},
             min(timeout, 60.0))


def run(grid: Grid, run_config: Mapping[str, Any]) -> None:
    """Run the whole federation (see the module docstring); raise on failure."""
    config = read_config(run_config)
    out_dir = Path(str(run_config["out-dir"]))
    status = str(run_config.get("status-file", ""))
    startup, timeout = float(run_config["startup-timeout"]), float(run_config["round-timeout"])
    ss.write_status(status, state="starting")
    nodes = wait_for_nodes(grid, int(run_config["num-clients"]), startup)
    summaries, node_of = describe(grid, nodes, startup)
    files = json.loads(str(run_config.get("client-files", "")) or "[]")
    plan = ss.plan_from_summaries(config, summaries, run_dir=str(Path(files[0]).parent) if files else None)
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
    trained = {c for record in history for c in record["selected"] if c not in record.get("lost", [])}
    for round_number in range(start, config.rounds + 1):
        record = play_round(grid, plan, node_of, round_number, timeout=timeout, resume_round=start - 1,
                            trained=trained)
        trained |= set(record["selected"]) - set(record["lost"])
        history.append(record)
        ss.save_checkpoint(paths["checkpoint"], round_number=round_number, plan=plan, history=history,
                           inputs=inputs)
        if (warning := round_warning(record)) is not None:
            warnings.append(warning)
        out.write_metrics_csv(paths["metrics_csv"], history)
        out.write_metrics_json(paths["metrics_json"], config=plan.record, privacy=plan.privacy, rounds=history)
        ss.write_status(status, state="running", round=round_number, rounds=config.rounds,
                        test_accuracy=_finite(record["test_accuracy"]), warnings=warnings)
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
        ss.write_status(status, state="error", error=reason, kind=type(error).__name__)
        raise
