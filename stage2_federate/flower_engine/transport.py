"""The Flower engine's transport (``loop.Transport``): each client step is a message to the node of that client.

Flower's own strategies sample nodes with Python's ``random`` over node ids drawn from ``os.urandom``,
so seeding cannot reproduce them. Here the shared loop selects client *indices* with the run's seeded
server Generator, and each index is mapped to the node that holds that client's file (every node
reports its client index once, :data:`~.protocol.DESCRIBE`). Messages go only to the selected nodes.

**One message per node and round** (pipelined): in a deployment every message starts a ClientApp
process on its node, so the evaluation of round t's model travels with round t + 1's message: a selected
client first evaluates the global model it receives, then trains from it; the others get an
evaluation-only message (:data:`~.protocol.EVALUATE`) in the same exchange. After the last round one
evaluation-only exchange closes the run.

Failures: a client's error reply (its code raised: an unreadable file, a file replaced since the run
started) ends the run with that client's index and one-line reason; a node that does not answer within
``round-timeout`` or is unavailable (a dead SuperNode: Flower replies for it with code NODE_UNAVAILABLE)
is logged in the round's ``lost`` and ``notes``, and the round goes on without it (it is not asked to
evaluate that round, nor to finish after a last round it was lost in). With a failure policy (run config
``min-clients``, ``--min-clients-per-round``: Flower's ``min_fit_clients``) a client's own failure is
logged the same way, and the loop's policy check ends a round in which too few selected clients trained.
Replies are matched to clients by message id: Flower's replies for an unavailable node come from the
SuperLink (``src_node_id`` 1), not from the node.

A reply is read defensively: one whose records are missing or malformed (no metrics, an INFO record that is not
a :class:`~.protocol.TrainReply` of this client, evaluation sums that are not numbers) is refused with the
server's reason and the silo named (``Training.rejected``), never ending the run; what a well-formed reply holds
is then checked by the round loop (``reply_checks``). A silo's own text (``TrainReply.note``) is never printed
or stored: the server writes its own note.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from ldpfl.common.errors import LdpflError
from ldpfl.stage2_federate.client_description import ClientDescription
from ldpfl.stage2_federate.loop import EvaluationReplies, Training
from ldpfl.stage2_federate.round_record import ClientEvaluation, RoundRecord, SplitSums
from ldpfl.stage2_federate.rounds import Broadcast, ClientResult

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
    EvaluateInstruction,
    MessageError,
    TrainInstruction,
    TrainReply,
    description_from_json,
)


class ClientFailedError(LdpflError, RuntimeError):
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


def describe(grid: Grid, nodes: list[int], timeout: float) -> list[tuple[int, ClientDescription]]:
    """Ask every node for its client's description; return (node id, description) for each, in ``nodes`` order.

    Two nodes may claim one client index: the server's ``server_side.screen`` tells the impostor (or leaves out
    every claimant), so the run is never stopped by one silo's claim.
    """
    replies = exchange(grid, {n: _message({INFO: _info()}, n, DESCRIBE, 0) for n in nodes}, timeout)
    described = []
    for node in nodes:
        reply = replies.get(node)
        if reply is None:
            raise RuntimeError(f"SuperNode {node} did not describe its client file within {timeout:.0f} s")
        if reply.has_error():
            raise ClientFailedError(f"SuperNode {node} could not open its client file: "
                                    f"{' '.join(str(reply.error.reason).split())}")
        try:
            summary = description_from_json(str(reply.content.config_records[INFO]["json"]))
        except MessageError as error:
            raise MessageError(f"SuperNode {node} described its client file with an {error}") from None
        described.append((node, summary))
    return described


class FlowerTransport:
    """Client steps as Flower messages through ``grid`` to the node of each client (``node_of``)."""

    pipelined = True
    can_lose = True

    def __init__(self, grid: Grid, plan: ss.ServerPlan, node_of: dict[int, int], *, timeout: float,
                 resume_round: int, history: Sequence[RoundRecord], min_clients: int = 0):
        self.grid, self.plan, self.node_of, self.timeout = grid, plan, node_of, timeout
        self.resume_round, self.tolerated = resume_round, min_clients > 0
        self.trained = {c for r in history for c in r.selected if c not in (r.lost or ())}  # for resume

    def train(self, round_number: int, selected: Sequence[int], broadcast: Broadcast, *,
              evaluate_without: frozenset[int] | None) -> Training:
        """One exchange: the selected train (first evaluating ``broadcast`` when asked), the others evaluate it."""
        vector, timeout = broadcast.vector, self.timeout
        asked = set() if evaluate_without is None else set(self.node_of) - evaluate_without  # lost: not asked
        messages = {
            cid: _message({GLOBAL: ArrayRecord([vector]), INFO: _info(TrainInstruction(
                round=round_number, setup=self.plan.setups[cid], resume_round=self.resume_round,
                trained_before=cid in self.trained, evaluate=cid in asked).to_json())},
                self.node_of[cid], TRAIN, round_number)
            for cid in selected}
        messages.update({cid: self._evaluate_message(cid, vector, round_number)
                         for cid in sorted(asked - set(selected))})
        replies = exchange(self.grid, messages, timeout)
        results, lost, notes, rejected = [], [], [], []
        for cid in selected:
            reply = replies.get(cid)
            if reply is None:
                lost.append(cid)
                notes.append(f"client {cid}: no training reply within {timeout:.0f} s; lost")
            elif reply.has_error():
                lost.append(cid)
                notes.append(_failure(reply, cid, f"training in round {round_number}", tolerated=self.tolerated))
            else:
                read = self._result(cid, reply)
                if isinstance(read, ClientResult):
                    results.append(read)
                else:
                    rejected.append((cid, read))
        self.trained |= set(selected) - set(lost)
        evaluation = None if evaluate_without is None else self._evaluation(round_number - 1, replies, asked)
        return Training(tuple(results), tuple(lost), tuple(notes), evaluation, tuple(rejected))

    def evaluate(self, round_number: int, broadcast: Broadcast, *, without: frozenset[int]) -> EvaluationReplies:
        """Close the run with one exchange: every node not ``without`` (lost in the last round) evaluates."""
        asked = set(self.node_of) - without
        replies = exchange(self.grid, {cid: self._evaluate_message(cid, broadcast.vector, round_number + 1)
                                       for cid in sorted(asked)}, self.timeout)
        return self._evaluation(round_number, replies, asked)

    def _result(self, cid: int, reply: Message) -> ClientResult | str:
        """Read client ``cid``'s training reply; return why it cannot be read instead (the server's words)."""
        content = reply.content
        try:
            info = TrainReply.from_json(str(content.config_records[INFO]["json"]))
            metrics = _numbers(content.metric_records[METRICS])
            loss, accuracy = metrics["loss"], metrics["accuracy"]
            arrays = content.array_records[UPLOAD].to_numpy_ndarrays() if UPLOAD in content.array_records else None
        except (KeyError, TypeError, ValueError):  # MessageError is a ValueError
            return "its training reply is malformed (a record missing or not of its fields)"
        if info.client != cid:
            return f"its training reply names client {info.client}"
        if arrays is not None and len(arrays) != 1:
            return f"its upload holds {len(arrays)} arrays, not one"
        upload = None if arrays is None else arrays[0]
        note = None if upload is not None else f"client {cid}: excluded, it sent no upload"
        return ClientResult(cid, upload, loss, accuracy, note)

    def _evaluate_message(self, cid: int, vector: Any, round_number: int) -> Message:
        return _message({GLOBAL: ArrayRecord([vector]),
                         INFO: _info(EvaluateInstruction(self.plan.setups[cid]).to_json())},
                        self.node_of[cid], EVALUATE, round_number)

    def _evaluation(self, round_number: int, replies: Mapping[int, Message], asked: set[int]) -> EvaluationReplies:
        """Return the silos' sums of round ``round_number``'s model (the loop checks them and sums the union).

        Clients not ``asked`` (lost in that round's training: no reply in time, or unavailable) are not
        asked again (a dead node would cost another ``timeout``), and their test splits are left out.
        """
        splits = ("test", "clean") if self.plan.config.eval_clean else ("test",)
        reports, notes, rejected = [], [], []
        for cid in sorted(self.node_of):
            reply = replies.get(cid)
            if cid not in asked:
                notes.append(f"client {cid}: lost in training, not asked to evaluate; its test split is left out")
            elif reply is None:
                notes.append(f"client {cid}: no evaluation reply within {self.timeout:.0f} s; its test split is "
                             "left out")
            elif reply.has_error():
                notes.append(_failure(reply, cid, f"evaluation of round {round_number}'s model",
                                      tolerated=self.tolerated))
            else:
                read = _sums(reply, splits)
                if read is None:
                    rejected.append((cid, "its evaluation reply is malformed (sums missing or not numbers)"))
                else:
                    reports.append(ClientEvaluation(cid, read["test"], read.get("clean")))
        return EvaluationReplies(tuple(reports), tuple(notes), tuple(rejected))


def _sums(reply: Message, splits: Sequence[str]) -> dict[str, SplitSums] | None:
    """Return a reply's evaluation sums per split (counts kept as sent), or None when they cannot be read."""
    try:
        m = dict(reply.content.metric_records[EVALUATION])
        out = {}
        for name in splits:
            loss_sum, correct, rows = (m[f"{name}_{key}"] for key in ("loss_sum", "correct", "rows"))
            if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (loss_sum, correct, rows)):
                return None
            out[name] = SplitSums(float(loss_sum), correct, rows)  # a float count is refused by the checks
        return out
    except (KeyError, TypeError, ValueError):
        return None


def finish(grid: Grid, node_of: dict[int, int], timeout: float) -> None:
    """Tell every node that the run is over (clients delete their resume state unless it is kept)."""
    exchange(grid, {cid: _message({INFO: _info()}, node, FINISH, 0) for cid, node in node_of.items()},
             min(timeout, 60.0))
