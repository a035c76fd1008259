"""The local engine's transport: every client step is a call in this process (``loop.Transport``).

The clients' data and random streams are all here (``plan.LocalPlan``); the model serves as every client's
scratch space (``rounds.client_step`` overwrites its weights) before the loop sets the new global model.
The global model is evaluated right after its round, on the union of the clients' randomized test splits
(as the LDPFL reference does), and with ``eval_clean`` on their clean test files.
"""

from __future__ import annotations

from collections.abc import Sequence

from .data import ClientSplit, evaluation_splits, load_clean_tests
from .loop import Training
from .model import evaluate
from .plan import LocalPlan
from .round_record import Evaluation
from .rounds import Broadcast, client_step


class InProcessTransport:
    """Client steps as calls in this process; not pipelined, and no client can be lost."""

    pipelined = False
    can_lose = False

    def __init__(self, plan: LocalPlan):
        self.plan = plan
        self.clients = {c.index: c for c in plan.data.clients}
        self.position = {c.index: k for k, c in enumerate(plan.data.clients)}
        self.eval_splits = evaluation_splits(plan.data)
        self.clean_splits: list[ClientSplit] | None = (load_clean_tests(plan.data, plan.device)
                                                       if plan.config.eval_clean else None)

    def train(self, round_number: int, selected: Sequence[int], broadcast: Broadcast, *,
              evaluate_without: frozenset[int] | None) -> Training:
        """Train and perturb each selected client from ``broadcast``, with its own streams."""
        plan, streams = self.plan, self.plan.streams
        return Training(tuple(
            client_step(plan.model, broadcast, self.clients[cid].train, plan.perturbations[cid], plan.training,
                        generator=streams.train[self.position[cid]], rng=streams.perturb[self.position[cid]])
            for cid in selected))

    def evaluate(self, round_number: int, broadcast: Broadcast, *, without: frozenset[int]) -> Evaluation:
        """Evaluate the global model (the plan's model holds it) on the union of the test splits."""
        batch = self.plan.config.eval_batch_size
        loss, accuracy = evaluate(self.plan.model, self.eval_splits, batch)
        clean = None if self.clean_splits is None else evaluate(self.plan.model, self.clean_splits, batch)
        return Evaluation(loss, accuracy, clean)
