"""Plain local training: ``local_epochs`` epochs of mini-batches, nothing released but the perturbed upload.

LDPFL Algorithm 1 line 19 (and the update perturbations of Wu et al., PLDP-FL and DP-FedAW, which act on the
upload after it: ``perturbation``). Its steps add no noise, so the ledger is the upload perturbation's, the reply
bound is the perturbation's σ_i (growing with the silo's training rows: more rows, more local steps), the
evaluation replies leave in clear and a resumed run may take any number of rounds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ldpfl.stage2_federate.config import DEFAULT_LR, FederationConfig

if TYPE_CHECKING:
    import numpy as np
    import torch

    from ldpfl.contract.federation_privacy import AnyLedgerRow, LedgerSection, SiloGuarantee
    from ldpfl.contract.release_guarantee import ReleaseGuarantee
    from ldpfl.stage2_federate.client_privacy import ClientPrivacy
    from ldpfl.stage2_federate.data import ClientSplit
    from ldpfl.stage2_federate.label_noise import LabelNoise
    from ldpfl.stage2_federate.model import FederatedMLP, TrainStats
    from ldpfl.stage2_federate.round_record import RoundRecord
    from ldpfl.stage2_federate.streaming import StreamedSplit

    from .evaluation_noise import EvaluationNoise


@dataclass(frozen=True)
class PlainTraining:
    """A silo that trains its epochs in clear (``SiloTraining``): the upload's perturbation is all it releases."""

    own_accountant = False
    steps_grow_with_rows = True

    @property
    def evaluation(self) -> EvaluationNoise | None:
        """None: the evaluation replies leave in clear."""
        return None

    def local_step(self, model: FederatedMLP, split: ClientSplit | StreamedSplit, *, epochs: int, batch_size: int,
                   optimizer: torch.optim.Optimizer, generator: torch.Generator, rng: np.random.Generator,
                   label_noise: LabelNoise | None) -> TrainStats:
        """Train ``epochs`` epochs of shuffled mini-batches (``model.train_local``; ``rng`` is the upload's)."""
        from ldpfl.stage2_federate.model import train_local

        return train_local(model, split, epochs=epochs, batch_size=batch_size, optimizer=optimizer,
                           generator=generator, label_noise=label_noise)

    def reply_noise(self, perturbation_noise: float | None) -> float | None:
        """Return the perturbation's σ_i: the training adds none."""
        return perturbation_noise

    def upload_noise(self, *, lr: float, plain_sgd: bool) -> float | None:
        """None: the upload's noise is the perturbation's, not a known multiple of the training's."""
        return None

    def upload_signal(self, *, lr: float, plain_sgd: bool) -> float | None:
        """None: epochs of unclipped gradients have no such bound."""
        return None

    def wire_form(self) -> dict[str, Any]:
        """No keys: a Flower client's setup carries nothing for it (``read_training`` gives :data:`PLAIN`)."""
        return {}

    def entry_json(self, *, local_only: bool) -> dict[str, Any]:
        """No keys: the entry's upload report says everything."""
        return {}

    def run_ledger(self, rounds: Sequence[RoundRecord], privacy: Sequence[ClientPrivacy], *,
                   final: bool) -> LedgerSection | None:
        """None: the ledger composes the uploads' perturbations."""
        return None

    def silo_guarantee(self, entry: ClientPrivacy, accounted: AnyLedgerRow | None,
                       relations: tuple[float, float] | None) -> tuple[SiloGuarantee, ReleaseGuarantee] | None:
        """None: the silo's guarantee is its file's (and its upload's ledger row)."""
        return None


PLAIN = PlainTraining()
"""Every plain silo's training (it holds no setting of its own)."""


@dataclass(frozen=True)
class PlainMethod:
    """The run's plain training (``TrainingMethod``): every silo :data:`PLAIN`, LDPFL's learning rate."""

    default_lr: float = DEFAULT_LR

    def plan(self, config: FederationConfig, sizes: Sequence[tuple[int, int]]) -> Mapping[int, PlainTraining]:
        """Return :data:`PLAIN` for every silo."""
        return {index: PLAIN for index, _rows in sizes}

    def check_resume(self, config: FederationConfig, started: Mapping[str, Any]) -> None:
        """Accept any number of rounds: nothing was calibrated for the run's length."""
