"""One federation round as two steps pure of I/O, shared by every engine (the local loop, a Flower engine).

LDPFL Algorithm 1 lines 17-21, as Flower splits it between a ``ClientApp`` and a ``ServerApp``:

* :func:`client_step` (the client's ``fit``): load the global weights, train as the silo trains (line 19:
  ``local_epochs`` epochs, or its ``silo_training`` component's steps), perturb the parameters or the update with
  the client's own mechanism and budget (line 20; WU 3.1, PLDP Algorithm 1 line 19, DP-FedAW eq. 9); an upload
  that is not finite is excluded;
* :func:`server_step` (the strategy's ``aggregate_fit``): combine the surviving uploads (line 21, or WU
  eqs. 12-16, PLDP eq. 7, DP-FedAW eq. 10) and apply the server rule; with no upload, or a non-finite
  result, the previous model is kept.

Selection (``Strategy.select``) and dropouts (:func:`draw_dropouts`, LDPFL IV-E) draw from the server's
Generator between them; :func:`round_record` makes the round's metrics from the results. Nothing here
reads or writes a file, prints, or touches a global random state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ldpfl.mechanisms.base import require_generator

from .data import ClientSplit
from .label_noise import LabelNoise
from .model import FederatedMLP, evaluation_sums, get_vector, make_optimizer, set_vector
from .perturbation import ClientPerturbation, ServerRule
from .round_record import RoundRecord, SplitSums
from .silo_training import PLAIN, SiloTraining
from .silo_training.evaluation_noise import LOSS_BOUND, EvaluationNoise
from .strategies import Aggregate, Strategy
from .streaming import StreamedSplit


@dataclass(frozen=True)
class LocalTraining:
    """How every client trains in a round (LDPFL IV-E): optimizer, learning rate, epochs el, batch size.

    ``label_noise``: the files' k-RR label noise and its loss correction (``label_noise``), None: plain CE.
    ``silos``: how each client trains (``silo_training``; a client not listed trains plainly: :data:`PLAIN`).
    """

    optimizer: str
    lr: float
    epochs: int
    batch_size: int
    label_noise: LabelNoise | None = None
    silos: Mapping[int, SiloTraining] = field(default_factory=dict)

    def silo(self, client: int) -> SiloTraining:
        """Return how ``client`` trains."""
        return self.silos.get(client, PLAIN)


@dataclass(frozen=True)
class Broadcast:
    """The round's global weights: the tensor clients load (on the model's device) and its numpy copy."""

    weights: torch.Tensor
    vector: np.ndarray

    @classmethod
    def of(cls, model: torch.nn.Module) -> Broadcast:
        """Take the current parameters of ``model`` (LDPFL Algorithm 1 line 14: the server broadcasts them)."""
        weights = get_vector(model)
        return cls(weights, weights.cpu().numpy())


EXCLUDED_PARAMETERS = "excluded, its parameters are not finite after local training"
EXCLUDED_UPLOAD = "excluded, its perturbed upload is not finite"
EXCLUDED_REASONS = (EXCLUDED_PARAMETERS, EXCLUDED_UPLOAD)
"""Why :func:`client_step` excludes its own upload (its note: ``client i: <reason>``)."""


@dataclass(frozen=True)
class ClientResult:
    """What one selected client returns: its upload (None when excluded), its training loss and accuracy."""

    client: int
    upload: np.ndarray | None
    loss: float
    accuracy: float
    note: str | None = None  # why the upload was excluded


def client_step(model: FederatedMLP, broadcast: Broadcast, split: ClientSplit | StreamedSplit,
                perturbation: ClientPerturbation,
                training: LocalTraining, *, generator: torch.Generator, rng: np.random.Generator) -> ClientResult:
    """Train one client from the global weights and return its perturbed upload.

    Parameters
    ----------
    model : FederatedMLP
        A model of the run's architecture, used as scratch space: its weights are overwritten.
    broadcast : Broadcast
        The global weights of the round.
    split : ClientSplit or StreamedSplit
        The client's training split.
    perturbation : ClientPerturbation
        The client's mechanism, target and budget.
    training : LocalTraining
        The local training settings; the optimizer is created afresh (clients are stateless).
    generator : torch.Generator
        The client's training stream (shuffles, dropout masks).
    rng : numpy.random.Generator
        The client's perturbation stream.

    Returns
    -------
    ClientResult
        The upload, or None with a note when the parameters or the upload are not finite.
    """
    require_generator(rng)
    cid = perturbation.client
    set_vector(model, broadcast.weights)
    optimizer = make_optimizer(training.optimizer, model.parameters(), training.lr)
    stats = training.silo(cid).local_step(model, split, epochs=training.epochs, batch_size=training.batch_size,
                                          optimizer=optimizer, generator=generator, rng=rng,
                                          label_noise=training.label_noise)
    local = get_vector(model).cpu().numpy()
    if not np.all(np.isfinite(local)):
        return ClientResult(cid, None, stats.loss, stats.accuracy,
                            f"client {cid}: {EXCLUDED_PARAMETERS}")
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is caught just below, with a note
        upload = perturbation.perturb(local, broadcast.vector, rng=rng)
    if not np.all(np.isfinite(upload)):
        return ClientResult(cid, None, stats.loss, stats.accuracy,
                            f"client {cid}: {EXCLUDED_UPLOAD}")
    return ClientResult(cid, upload, stats.loss, stats.accuracy)


def silo_evaluation(model: FederatedMLP, splits: Sequence[ClientSplit | StreamedSplit], batch_size: int,
                    noise: EvaluationNoise | None, rng: Callable[[], np.random.Generator]) -> SplitSums:
    """Return what one silo reports of the global model on its test ``splits`` (both engines' silo side).

    With its training's evaluation ``noise`` (``SiloTraining.evaluation``) the sums are bounded and released by
    the Gaussian mechanism (``evaluation_noise``; ``rng`` makes the silo's stream for this round); otherwise they
    are exact.
    """
    if noise is None:
        return SplitSums(*evaluation_sums(model, splits, batch_size))
    return noise.release(*evaluation_sums(model, splits, batch_size, loss_bound=LOSS_BOUND), rng=rng())


def draw_dropouts(selected: Sequence[int], count: int, rng: np.random.Generator) -> list[int]:
    """LDPFL IV-E: ``count`` of the selected clients, uniformly without replacement, drop after training."""
    require_generator(rng)
    if count == 0:
        return []
    if count > len(selected):
        raise ValueError(f"drop per round ({count}) exceeds the clients selected per round ({len(selected)})")
    return sorted(int(c) for c in rng.choice(np.asarray(selected), size=count, replace=False))


@dataclass(frozen=True)
class ServerResult:
    """The server's step: the next global vector, the strategy's combination, and what happened."""

    vector: np.ndarray
    aggregate: Aggregate
    kept_previous: bool
    notes: tuple[str, ...] = ()


def server_step(global_vector: np.ndarray, uploads: Mapping[int, np.ndarray], strategy: Strategy, rule: ServerRule,
                *, rng: np.random.Generator) -> ServerResult:
    """Aggregate the uploads that reached the server and apply the server rule.

    Parameters
    ----------
    global_vector : numpy.ndarray
        The round's global weights.
    uploads : mapping of int to numpy.ndarray
        Client index → upload, for the clients whose upload survived.
    strategy : Strategy
        The aggregation rule (wrapped in ``SignAggregation`` for sign uploads).
    rule : ServerRule
        How the aggregate becomes the next model (W ← aggregate, or W ← W + s·aggregate).
    rng : numpy.random.Generator
        The server's stream (ω of WU 4.2).

    Returns
    -------
    ServerResult
        With ``kept_previous`` and a note when no upload survived or the result is not finite.
    """
    with np.errstate(over="ignore", invalid="ignore"):  # a non-finite result is caught below, with a note
        result = strategy.aggregate(global_vector, uploads, rng=rng)
        if result.vector is None:
            return ServerResult(global_vector, result, True,
                                ("no upload survived (dropped or excluded): the previous global model is kept",))
        new_global = rule.apply(global_vector, result.vector)
    if not np.all(np.isfinite(new_global)):
        return ServerResult(global_vector, result, True,
                            ("the aggregate is not finite: the previous global model is kept",))
    return ServerResult(new_global, result, False)


def _nanmean(values: Sequence[float]) -> float:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


def round_record(round_number: int, *, selected: Sequence[int], clients: Sequence[ClientResult],
                 dropped: Sequence[int], server: ServerResult, epsilons: Mapping[int, float | None],
                 lost: Sequence[int] | None = None, notes: Sequence[str] = (),
                 rejected: Sequence[tuple[int, str]] = ()) -> RoundRecord:
    """Make the round's record, before the evaluation of its model (test loss and accuracy NaN until then).

    Train loss and accuracy are the last local epoch's running values, averaged over the clients that
    trained in the round (dropped clients trained too; their upload was lost afterwards). ``lost``: the
    selected clients whose reply never came (None for a transport that cannot lose one); ``notes``: why;
    ``rejected``: the silos whose reply the server refused (``reply_checks``), absent from ``clients``.
    """
    info = server.aggregate.info
    return RoundRecord(
        round=round_number,
        train_loss=_nanmean([c.loss for c in clients]), train_accuracy=_nanmean([c.accuracy for c in clients]),
        test_loss=math.nan, test_accuracy=math.nan,
        selected=tuple(selected), dropped=tuple(dropped),
        excluded=tuple(c.client for c in clients if c.upload is None),
        aggregated=tuple(server.aggregate.used), weights=tuple(server.aggregate.weights),
        client_epsilons=tuple(epsilons[c] for c in selected),
        kept_previous_model=server.kept_previous,
        notes=(*notes, *(c.note for c in clients if c.note), *server.notes),
        seconds=math.nan, omega=info.get("omega"), lost=None if lost is None else tuple(lost),
        rejected=tuple(rejected), outliers=server.aggregate.outliers,
    )
