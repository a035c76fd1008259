"""What every way a silo trains answers: plan it, take a local step, say what it released, bound its reply, resume.

A way of training is two objects. :class:`SiloTraining` is one silo's, as the plan fixed it (its settings and its
accountant together): the round's client step asks it to train (:meth:`SiloTraining.local_step`), the server's
reply checks ask it how noisy an honest reply may be (:meth:`SiloTraining.reply_noise`), the evaluation asks it
what its test sums leave with (:attr:`SiloTraining.evaluation`), and the ledger and the release guarantee ask it
what its steps released (:meth:`SiloTraining.run_ledger`, :meth:`SiloTraining.silo_guarantee`), in the package's
one vocabulary of privacy events (``ldpfl.mechanisms.privacy_events``). :class:`TrainingMethod` is the run's:
it plans every silo (:meth:`TrainingMethod.plan`), gives the default learning rate and says what resuming a run
requires (:meth:`TrainingMethod.check_resume`). Torch-free: the training itself loads torch when it runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np
    import torch

    from ldpfl.contract.federation_privacy import AnyLedgerRow, LedgerSection, SiloGuarantee
    from ldpfl.contract.release_guarantee import ReleaseGuarantee
    from ldpfl.stage2_federate.client_privacy import ClientPrivacy
    from ldpfl.stage2_federate.config import FederationConfig
    from ldpfl.stage2_federate.data import ClientSplit
    from ldpfl.stage2_federate.label_noise import LabelNoise
    from ldpfl.stage2_federate.model import FederatedMLP, TrainStats
    from ldpfl.stage2_federate.round_record import RoundRecord
    from ldpfl.stage2_federate.streaming import StreamedSplit

    from .evaluation_noise import EvaluationNoise


@runtime_checkable
class SiloTraining(Protocol):
    """One silo's way of training as the plan fixed it: its step, what it releases, its reply bound."""

    @property
    def own_accountant(self) -> bool:
        """Whether its steps release what an accountant of their own states (else only the upload's perturbation)."""

    @property
    def steps_grow_with_rows(self) -> bool:
        """Whether more training rows mean more local steps (the default reply bound then grows with them)."""

    @property
    def evaluation(self) -> EvaluationNoise | None:
        """The noise its evaluation replies leave with (None: in clear)."""

    def local_step(self, model: FederatedMLP, split: ClientSplit | StreamedSplit, *, epochs: int, batch_size: int,
                   optimizer: torch.optim.Optimizer, generator: torch.Generator, rng: np.random.Generator,
                   label_noise: LabelNoise | None) -> TrainStats:
        """Train ``model`` in place from the broadcast weights it holds (one round of the silo's training)."""

    def reply_noise(self, perturbation_noise: float | None) -> float | None:
        """Return the noise scale of an honest upload, given its perturbation's σ_i (``reply_checks``' bound)."""

    def upload_noise(self, *, lr: float, plain_sgd: bool) -> float | None:
        """Return the per-coordinate std its training alone puts in its upload, where known (``outliers``)."""

    def upload_signal(self, *, lr: float, plain_sgd: bool) -> float | None:
        """Return a bound on the norm of the gradient part of its honest upload, where known (``outliers``)."""

    def wire_form(self) -> dict[str, Any]:
        """Return its settings keyed by its kind, as a Flower client's setup carries them (``read_training``)."""

    def entry_json(self, *, local_only: bool) -> dict[str, Any]:
        """Return its keys in the silo's ``metrics.json`` ``privacy`` entry (none when it releases nothing itself)."""

    def run_ledger(self, rounds: Sequence[RoundRecord], privacy: Sequence[ClientPrivacy], *,
                   final: bool) -> LedgerSection | None:
        """Return the run's ``privacy_ledger`` when its silos train like this one under their own accountant."""

    def silo_guarantee(self, entry: ClientPrivacy, accounted: AnyLedgerRow | None,
                       relations: tuple[float, float] | None) -> tuple[SiloGuarantee, ReleaseGuarantee] | None:
        """Return the silo's row and guarantee from its accountant's ledger row (None: its file's, as it is)."""


class TrainingMethod(Protocol):
    """The run's way of training: plans every silo's :class:`SiloTraining` and says what resuming requires."""

    @property
    def default_lr(self) -> float:
        """The local learning rate when the configuration gives none."""

    def plan(self, config: FederationConfig, sizes: Sequence[tuple[int, int]]) -> Mapping[int, SiloTraining]:
        """Return each silo's training from (client index, training rows) (``ParameterError`` when it cannot)."""

    def check_resume(self, config: FederationConfig, started: Mapping[str, Any]) -> None:
        """Refuse to resume a run whose configuration ``started`` (the checkpoint's) this one cannot continue."""
