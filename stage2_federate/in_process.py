"""The local engine's transport: every client step is a call in this process (``loop.Transport``).

The clients' data and random streams are all here (``plan.LocalPlan``); the model serves as every client's
scratch space (``rounds.client_step`` overwrites its weights) before the loop sets the new global model.
The global model is evaluated right after its round on each client's randomized test split (the loop sums
them into the union, as the LDPFL reference evaluates, and keeps each client's own figures), and with
``eval_clean`` on their clean test files. Each silo's test sums leave with the noise its training component
gives them (``SiloTraining.evaluation``, ``rounds.silo_evaluation``) from its own stream for that round, as on a
Flower node. The sums go through the
server's checks (``reply_checks``) as a Flower silo's do.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from .data import ClientSplit, load_clean_test
from .loop import EvaluationReplies, Training
from .model import evaluation_sums
from .plan import LocalPlan
from .round_record import ClientEvaluation, SplitSums
from .rounds import Broadcast, client_step, silo_evaluation
from .streams import evaluation_generator


class InProcessTransport:
    """Client steps as calls in this process; not pipelined, and no client can be lost."""

    pipelined = False
    can_lose = False

    def __init__(self, plan: LocalPlan):
        self.plan = plan
        self.clients = {c.index: c for c in plan.data.clients}
        self.position = {c.index: k for k, c in enumerate(plan.data.clients)}
        self.clean_splits: dict[int, ClientSplit] | None = (
            {c.index: load_clean_test(c, plan.device) for c in plan.data.clients} if plan.config.eval_clean else None)

    def train(self, round_number: int, selected: Sequence[int], broadcast: Broadcast, *,
              evaluate_without: frozenset[int] | None) -> Training:
        """Train and perturb each selected client from ``broadcast``, with its own streams."""
        plan, streams = self.plan, self.plan.streams
        return Training(tuple(
            client_step(plan.model, broadcast, self.clients[cid].train, plan.perturbations[cid], plan.training,
                        generator=streams.train[self.position[cid]], rng=streams.perturb[self.position[cid]])
            for cid in selected))

    def evaluate(self, round_number: int, broadcast: Broadcast, *, without: frozenset[int]) -> EvaluationReplies:
        """Evaluate the global model (the plan's model holds it) on each client's test split: its sums."""
        plan = self.plan
        batch, model = plan.config.eval_batch_size, plan.model
        reports = []
        for cid, client in self.clients.items():
            test = silo_evaluation(model, [client.test], batch, plan.training.silo(cid).evaluation,
                                   functools.partial(evaluation_generator, plan.randomness,
                                                     self.position[cid], round_number))
            clean = None if self.clean_splits is None else \
                SplitSums(*evaluation_sums(model, [self.clean_splits[cid]], batch))
            reports.append(ClientEvaluation(cid, test, clean))
        return EvaluationReplies(tuple(reports))
