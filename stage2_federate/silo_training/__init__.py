"""How a silo trains, as one component: its method and its accountant together (issue 43).

Each way a silo trains is a :class:`~.base.SiloTraining` (one silo's, as the plan fixed it) and a
:class:`~.base.TrainingMethod` (the run's); the round loop, the reply checks, the ledger, the release guarantee,
the resume rules and the Flower client ask them and never branch on a flag:

* ``plain``: ``local_epochs`` epochs in clear; the upload's perturbation (``perturbation``: the papers' rules)
  is all a silo releases;
* record-level DP-SGD: ``dp_sgd_method`` (the run's: plan, learning rate, resume rule), ``dp_sgd_budget`` (a
  silo's σ, C, q and steps: its step, reply bound and accountant), ``dp_sgd`` (the steps, Opacus; torch),
  ``dp_sgd_ledger`` (its ledger rows and guarantee), ``evaluation_noise`` (the Gaussian noise of its evaluation
  replies).

A new way of training (say, distributed noise under secure aggregation) is one more pair here, its events in
``ldpfl.mechanisms.privacy_events``. Importing this package imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .base import SiloTraining, TrainingMethod
from .dp_sgd_budget import KEY as DP_SGD_KEY
from .dp_sgd_budget import UPLOAD_NOISE as DP_SGD_UPLOAD_NOISE
from .dp_sgd_budget import DpSgdClient
from .dp_sgd_ledger import SCOPES as DP_SGD_SCOPES
from .dp_sgd_method import DpSgdMethod, DpSgdTargetError
from .plain import PLAIN, PlainMethod, PlainTraining

if TYPE_CHECKING:
    from ldpfl.contract.federation_privacy import LedgerSection
    from ldpfl.stage2_federate.client_privacy import ClientPrivacy
    from ldpfl.stage2_federate.config import FederationConfig
    from ldpfl.stage2_federate.round_record import RoundRecord

TRAINING_SCOPES = DP_SGD_SCOPES
"""The scopes that a silo's training states of its own guarantee (a run's weakest guarantee keeps them)."""
ENTRY_KEYS = (DP_SGD_KEY, "local_only")
"""The keys the components add to a silo's privacy entry (``SiloTraining.entry_json``)."""
UPLOAD_NOISE = DP_SGD_UPLOAD_NOISE
"""What the run's summary calls the noise :func:`upload_noise_scales` gives (only DP-SGD's training states one)."""


def training_method(config: FederationConfig) -> TrainingMethod:
    """Return the run's way of training as ``config`` asks for it."""
    return DpSgdMethod() if config.dp_sgd else PlainMethod()


def read_training(data: Mapping[str, Any]) -> SiloTraining:
    """Read a silo's training from its privacy entry or its Flower setup (``entry_json``, ``wire_form``)."""
    budget = data.get(DP_SGD_KEY)
    if budget is None:
        return PLAIN
    if not isinstance(budget, Mapping):
        raise ValueError(f"{DP_SGD_KEY} must be a JSON object, got {budget!r}")
    return DpSgdClient.from_dict(budget)


def training_ledger(rounds: Sequence[RoundRecord], privacy: Sequence[ClientPrivacy], *,
                    final: bool) -> LedgerSection | None:
    """Return the run's ledger as its silos' own accountants state it; None where the uploads' perturbations do."""
    for entry in privacy:
        section = entry.training.run_ledger(rounds, privacy, final=final)
        if section is not None:
            return section
    return None


def upload_noise_scales(silos: Mapping[int, SiloTraining], *, lr: float, plain_sgd: bool) -> dict[int, float] | None:
    """Return each silo's per-coordinate training noise in its upload (``outliers``), or None unless all know it.

    None unless every silo's training adds noise of a known scale: DP-SGD with ``plain_sgd`` steps (Adam divides by
    a running root mean square of the noisy gradients, so its upload is not the noise times a known constant, and
    the run's report names silos by the raw distance instead).
    """
    scales = {int(cid): silo.upload_noise(lr=lr, plain_sgd=plain_sgd) for cid, silo in silos.items()}
    if not scales or any(s is None for s in scales.values()):
        return None
    return {cid: float(s) for cid, s in scales.items() if s is not None}


def upload_signal_bound(silos: Mapping[int, SiloTraining], *, lr: float, plain_sgd: bool) -> float | None:
    """Return B, a bound on the norm of the gradient part of any honest upload (the largest silo's), else None.

    None unless every silo's training states one (``SiloTraining.upload_signal``: DP-SGD with plain SGD steps,
    B = max_i lr·C·T·(1 + 4/√(q·n_i))). Two classes' mean gradients then differ by at most 2B, which bounds the
    label-mix model's class variances (``label_mix_reference``).
    """
    bounds = [silo.upload_signal(lr=lr, plain_sgd=plain_sgd) for silo in silos.values()]
    if not bounds or any(b is None for b in bounds):
        return None
    return max(b for b in bounds if b is not None)


__all__ = ["ENTRY_KEYS", "PLAIN", "TRAINING_SCOPES", "UPLOAD_NOISE", "DpSgdClient", "DpSgdMethod", "DpSgdTargetError",
           "PlainMethod", "PlainTraining", "SiloTraining", "TrainingMethod", "read_training", "training_ledger",
           "training_method", "upload_noise_scales", "upload_signal_bound"]
