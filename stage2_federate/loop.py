"""The round loop of every engine: LDPFL Algorithm 1 lines 17-21, with the clients behind a :class:`Transport`.

A round, in the order of its random draws (the server's stream; each client's own streams are used only
by that client's step): ``strategy.select`` → the transport takes each selected client's step
(``rounds.client_step``: train, perturb) to it and brings the uploads back → the failure policy →
``draw_dropouts`` → ``server_step`` → the new global model is evaluated on the union of the clients'
test splits → the round's record, then its checkpoint and metrics (``run_outputs``).

Engines differ only in the transport: the local engine calls each client in this process
(``in_process``), the Flower engine sends it a message (``flower_engine.transport``). A *pipelined*
transport evaluates round t's model with round t + 1's training message (one message per client and
round: in a deployment each message starts a process), so round t's record is completed, and its
checkpoint written with the state as it was after round t, when round t + 1's replies are in; after the
last round one evaluation closes the run. Evaluation draws no random numbers, so the order of the draws,
and the result, do not depend on the transport.

Only the rounds of the schedule are evaluated (``eval_every`` K: ``schedule.is_evaluated``, every K-th round and
the last): another round's record is written as soon as it is trained, with NaN test figures
(``RoundRecord.unevaluated``), and no evaluation travels with the next round's message. The schedule depends on
the round and the run's ``rounds`` alone, so a resumed run keeps it.

The server trusts no silo: every training reply and every evaluation a transport brings back is checked here
(``reply_checks``; a stale, replayed or copied upload: ``upload_hashes``) before anything uses it. A refused
silo is named in the round's ``rejected`` with the server's reason, left out of the round, and does not count as
trained for the failure policy; the honest silos' updates are aggregated as usual. The evaluation is made from the
accepted silos' sums (``round_record.evaluation_of``): the union's figures and each silo's own.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ldpfl.common.errors import LdpflError
from ldpfl.mechanisms.gaussian_statistics import GaussianStatistics

from .checkpoint import Snapshot, check_inputs, server_state
from .config import SGD
from .model import parameter_count
from .plan import FederationPlan
from .reply_checks import ReplyLimits, check_evaluations, check_training, rejection_note
from .round_record import ClientEvaluation, Evaluation, Rejection, RoundRecord, evaluation_of
from .rounds import Broadcast, ClientResult, draw_dropouts, round_record, server_step
from .run_outputs import RunWriter
from .schedule import is_evaluated
from .silo_training import training_method, upload_noise_scales, upload_signal_bound
from .upload_hashes import UploadHistory

STATISTICS_RELEASE = GaussianStatistics.NAME
"""The mechanism of a ``stats:K`` file: its test split is empty, its clean test records stay on the silo."""


@dataclass(frozen=True)
class EvaluationReplies:
    """What a transport brings back from one evaluation: each answering silo's sums, and who was left out, why."""

    reports: tuple[ClientEvaluation, ...]
    notes: tuple[str, ...] = ()
    rejected: tuple[Rejection, ...] = ()  # silos whose evaluation reply the transport could not read


@dataclass(frozen=True)
class Training:
    """What a transport brings back from one round's training exchange.

    ``results``: the selected clients that replied, in selection order; ``lost``: those whose reply never
    came or failed under a failure policy, ``notes`` why; ``rejected``: those whose reply the transport could
    not read (a malformed message), with the server's reason; ``evaluation``: the previous global model's, when
    the loop asked a pipelined transport for it.
    """

    results: tuple[ClientResult, ...]
    lost: tuple[int, ...] = ()
    notes: tuple[str, ...] = ()
    evaluation: EvaluationReplies | None = None
    rejected: tuple[Rejection, ...] = ()


class Transport(Protocol):
    """How a client step reaches the clients and how the global model is evaluated on their test splits."""

    pipelined: bool  # round t's evaluation travels with round t + 1's training exchange
    can_lose: bool  # a client's reply may never come (its records then list ``lost``)

    def train(self, round_number: int, selected: Sequence[int], broadcast: Broadcast, *,
              evaluate_without: frozenset[int] | None) -> Training:
        """Run the selected clients' steps from ``broadcast``.

        A pipelined transport also evaluates ``broadcast`` (the previous round's model) when
        ``evaluate_without`` is given, on every client but those (lost in that round).
        """
        ...

    def evaluate(self, round_number: int, broadcast: Broadcast, *, without: frozenset[int]) -> EvaluationReplies:
        """Evaluate the global model after ``round_number`` on every client's test split but ``without``'s."""
        ...


def reply_limits(plan: FederationPlan) -> ReplyLimits:
    """Return what the server checks every reply against (``reply_checks``): the plan's sizes, noise and test rows.

    The noise scale of a silo is what its training component says of an honest reply, given its perturbation's
    σ_i (``SiloTraining.reply_noise``: σ_i itself, or e.g. σ·C / (q·n), the std of the noise on a mean clipped
    gradient: a small silo's update is noisier, and is not refused for it). Where a silo's local steps grow with
    its training rows, the default bound grows with them too. A silo whose file is a ``stats:K`` release
    (mechanism ``gaussian-stats``) shares no test row: the rows of its clean test file are unknown here.
    """
    silo = plan.training.silo
    noise = {cid: silo(cid).reply_noise(p.noise_scale) for cid, p in plan.perturbations.items()}
    train_rows = {c.index: int(c.train_rows) for c in plan.clients  # more rows, more local steps
                  if silo(c.index).steps_grow_with_rows}
    return ReplyLimits(dim=parameter_count(plan.model), target=plan.rule.target,
                       max_update_norm=plan.config.max_update_norm, noise_scales=noise,
                       test_rows={c.index: int(c.test_rows) for c in plan.clients}, train_rows=train_rows,
                       clean_rows={c.index: None for c in plan.clients if c.feature_mechanism == STATISTICS_RELEASE})


def checked_evaluation(replies: EvaluationReplies | None, limits: ReplyLimits, *, clean: bool) -> Evaluation | None:
    """Check each silo's evaluation sums (``reply_checks``) and return the evaluation of those accepted."""
    if replies is None:
        return None
    accepted, rejected = check_evaluations(replies.reports, limits, clean=clean)
    rejected = replies.rejected + rejected
    return evaluation_of(accepted, clean=clean, rejected=rejected,
                         notes=(*replies.notes, *(f"{rejection_note(r)}; its test split is left out"
                                                  for r in rejected)))


class TooFewClientsError(LdpflError, RuntimeError):
    """Fewer selected clients trained in a round than the failure policy (``min-clients``) requires."""


def check_policy(round_number: int, selected: Sequence[int], trained: int, notes: Sequence[str],
                 min_clients: int) -> None:
    """Raise :class:`TooFewClientsError` when fewer than ``min_clients`` of ``selected`` trained (``notes``: why)."""
    if min_clients and trained < min(min_clients, len(selected)):
        raise TooFewClientsError(f"round {round_number}: {trained} of the {len(selected)} selected clients trained, "
                                 f"fewer than the failure policy's {min_clients} (min-clients-per-round): "
                                 + "; ".join(notes))


def restore(plan: FederationPlan, payload: dict[str, Any], path: Path, inputs: dict[str, str]
            ) -> tuple[list[RoundRecord], int]:
    """Load a checked checkpoint (``checkpoint.load_checkpoint``) into ``plan``; return its history and next round.

    Refuses a checkpoint trained on other client files than ``inputs`` (``checkpoint.check_inputs``).
    """
    check_inputs(path, payload, inputs)
    training_method(plan.config).check_resume(plan.config, payload.get("config", {}))
    plan.model.load_state_dict(payload["model"])
    plan.streams.restore(payload["rng"])
    plan.server_optimizer.restore(server_state(path, payload))
    plan.relabel_randomness(payload["randomness"])
    return [RoundRecord.from_dict(row) for row in payload["history"]], int(payload["round"]) + 1


@dataclass(frozen=True)
class _Trained:
    """A round trained and aggregated, whose model is not evaluated yet."""

    record: RoundRecord
    state: Snapshot  # the server's model and streams after the round: its checkpoint
    started: float

    @property
    def lost(self) -> frozenset[int]:
        return frozenset(self.record.lost or ())

    def evaluated(self, evaluation: Evaluation | None) -> RoundRecord:
        if evaluation is None:
            raise RuntimeError(f"round {self.record.round}'s model was not evaluated")
        return self.record.evaluated(evaluation, time.perf_counter() - self.started)

    def unevaluated(self) -> RoundRecord:
        return self.record.unevaluated(time.perf_counter() - self.started)


def run_rounds(plan: FederationPlan, transport: Transport, writer: RunWriter, history: list[RoundRecord], *,
               start: int, min_clients: int = 0, on_kept: Callable[[RoundRecord], None] | None = None,
               uploads: UploadHistory | None = None) -> None:
    """Play rounds ``start`` to ``plan.config.rounds``, appending each completed record to ``history``.

    Each completed round is written (``writer.keep``: checkpoint, metrics), then given to ``on_kept``; only the
    rounds of the schedule (``schedule.is_evaluated``) are evaluated, the others written when trained.
    ``min_clients``: the failure policy (0: none); a round in which fewer selected clients trained ends
    the run with :class:`TooFewClientsError`. ``uploads``: the digests of the uploads of the rounds before
    ``start`` (a resumed run's, from its checkpoint); an upload seen before, or sent by two silos, is refused
    (``upload_hashes``).
    """
    uploads = UploadHistory() if uploads is None else uploads

    def keep(record: RoundRecord, state: Snapshot) -> None:
        history.append(record)
        writer.keep(history, state)
        if on_kept is not None:
            on_kept(record)

    epsilons = {cid: p.epsilon for cid, p in plan.perturbations.items()}
    lr, plain = plan.training.lr, plan.training.optimizer == SGD  # issue 42: named by noise and label mix
    plan.strategy.upload_noise = upload_noise_scales(plan.training.silos, lr=lr, plain_sgd=plain)
    plan.strategy.upload_signal = upload_signal_bound(plan.training.silos, lr=lr, plain_sgd=plain)
    limits, clean = reply_limits(plan), plan.config.eval_clean
    every, rounds = plan.config.eval_every, plan.config.rounds
    pending: _Trained | None = None
    for round_number in range(start, rounds + 1):
        started = time.perf_counter()
        selected = plan.strategy.select(round_number, plan.streams.server)
        broadcast = Broadcast.of(plan.model)
        training = transport.train(round_number, selected, broadcast,
                                   evaluate_without=None if pending is None else pending.lost)
        checked = check_training(training.results, broadcast.vector, limits)
        fresh, repeated = uploads.check(round_number, checked.results)
        rejected = training.rejected + checked.rejected + repeated
        notes = (*training.notes, *(rejection_note(r) for r in rejected))
        check_policy(round_number, selected, len(fresh), notes, min_clients)
        if pending is not None:
            keep(pending.evaluated(checked_evaluation(training.evaluation, limits, clean=clean)), pending.state)
        dropped = draw_dropouts(selected, plan.config.drop_per_round, plan.streams.server)  # after training (IV-E)
        surviving = {r.client: r.upload for r in fresh if r.upload is not None and r.client not in dropped}
        server = server_step(broadcast.vector, surviving, plan.strategy, plan.rule, rng=plan.streams.server)
        plan.set_vector(plan.server_optimizer.step(broadcast.vector, server.vector, kept=server.kept_previous))
        record = round_record(round_number, selected=selected, clients=fresh, dropped=dropped,
                              server=server, epsilons=epsilons, lost=training.lost if transport.can_lose else None,
                              notes=notes, rejected=rejected)
        state = Snapshot.of(plan.model, plan.streams, plan.server_optimizer.state(), uploads.state())
        pending = _Trained(record, state, started)
        if not is_evaluated(round_number, every=every, rounds=rounds):
            keep(pending.unevaluated(), pending.state)
            pending = None
        elif not transport.pipelined:
            replies = transport.evaluate(round_number, Broadcast.of(plan.model), without=frozenset())
            keep(pending.evaluated(checked_evaluation(replies, limits, clean=clean)), pending.state)
            pending = None
    if pending is not None:
        last = transport.evaluate(pending.record.round, Broadcast.of(plan.model), without=pending.lost)
        keep(pending.evaluated(checked_evaluation(last, limits, clean=clean)), pending.state)


def finite(value: float) -> float | None:
    """Return ``value``, or None when it is NaN or infinite (a status file's accuracy)."""
    return float(value) if math.isfinite(value) else None
