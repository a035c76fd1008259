"""One silo's DP-SGD (``ldpfl federate --dp-sgd``): σ, C, q, steps, and its accountant over the run.

Torch-free (the CLI, the ledger and the Flower server read it): the training itself is ``dp_sgd``. A silo's
σ is given, or calibrated for its own Poisson rate q over every step the run may take (``rounds × local_steps``:
the worst case, in which it is selected every round), so its ε over the whole run is at most the target whatever
the selection. Its accountant is the run's history: ``local_steps`` per round in which it trained (selected and
not lost; a client dropped after training counts too: conservative), composed by the one accountant
(``ldpfl.mechanisms.accounting``) under both neighbouring relations (``dp_sgd_ledger``). A resumed run recomputes
it from the checkpoint's history, so it is restored exactly. :class:`DpSgdClient` is the component's
``SiloTraining``: its step, its reply bound σ·C/(q·n), its ledger and its guarantee.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from ldpfl.mechanisms import accounting
from ldpfl.stage2_federate.schedule import evaluations

from .dp_sgd_ledger import LIBRARY, dp_sgd_ledger, dp_sgd_silo
from .evaluation_noise import EvaluationNoise, calibrate, matched

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

KEY = "dp_sgd"
"""Its key in a silo's ``metrics.json`` privacy entry and in a Flower client's setup."""
UPLOAD_NOISE = "DP-SGD noise"
"""What the run's summary calls the noise :meth:`DpSgdClient.upload_noise` states (``outliers``' noise distance)."""


@dataclass(frozen=True)
class DpSgdClient:
    """One silo's DP-SGD: σ, clip C, Poisson rate q, steps per round, δ and what the accountant states.

    ``target_epsilon`` is None when σ was given (``noise_multiplier``) rather than calibrated. ``evaluation`` is
    the Gaussian noise of its evaluation replies on its test records (``evaluation_noise``); None when they leave
    in clear (``eval_epsilon`` ∞: the test records are then not protected).
    """

    client: int
    noise_multiplier: float
    clip: float
    sampling_probability: float
    local_steps: int
    delta: float
    neighbours: str
    records: int
    target_epsilon: float | None = None
    planned_steps: int = 0
    evaluation: EvaluationNoise | None = None

    own_accountant = True
    steps_grow_with_rows = False  # local_steps a round whatever the silo's size

    def local_step(self, model: FederatedMLP, split: ClientSplit | StreamedSplit, *, epochs: int, batch_size: int,
                   optimizer: torch.optim.Optimizer, generator: torch.Generator, rng: np.random.Generator,
                   label_noise: LabelNoise | None) -> TrainStats:
        """Take ``local_steps`` DP-SGD steps (``dp_sgd.train_dp_sgd``): its noise and batches from ``rng``."""
        from .dp_sgd import train_dp_sgd

        return train_dp_sgd(model, split, self, optimizer=optimizer, generator=generator, rng=rng,
                            label_noise=label_noise)

    def reply_noise(self, perturbation_noise: float | None) -> float | None:
        """Return σ·C / (q·n): the std of the noise on its mean clipped gradient (a small silo's is larger)."""
        return self.noise_multiplier * self.clip / max(self.sampling_probability * self.records, 1e-12)

    def upload_noise(self, *, lr: float, plain_sgd: bool) -> float | None:
        """Return s_i (:func:`upload_noise_scale`) with plain SGD steps; None with Adam (not a known multiple)."""
        if not plain_sgd:
            return None
        return upload_noise_scale(lr=lr, noise_multiplier=self.noise_multiplier, clip=self.clip,
                                  sampling_probability=self.sampling_probability, records=self.records,
                                  local_steps=self.local_steps)

    def upload_signal(self, *, lr: float, plain_sgd: bool) -> float | None:
        """Return lr·C·T·(1 + 4/√(q·n)) with plain SGD steps, else None (``upload_signal_bound``).

        Each step moves the weights by lr times the sum of clipped gradients (each of norm ≤ C) over the expected
        batch q·n, so by at most lr·C·|B_t|/(q·n); the Poisson batch |B_t| exceeds q·n·(1 + 4/√(q·n)) with
        probability < 1e-4.
        """
        if not plain_sgd:
            return None
        return lr * self.clip * self.local_steps * (1.0 + 4.0 / math.sqrt(self.sampling_probability * self.records))

    def wire_form(self) -> dict[str, Any]:
        """Return ``{KEY: to_dict()}``: how a Flower client's setup carries it (read by ``read_training``)."""
        return {KEY: self.to_dict()}

    def entry_json(self, *, local_only: bool) -> dict[str, Any]:
        """Return its keys in the silo's privacy entry: the budget, and whether its files are local-only."""
        return {KEY: self.to_dict(), "local_only": local_only}

    def run_ledger(self, rounds: Sequence[RoundRecord], privacy: Sequence[ClientPrivacy], *,
                   final: bool) -> LedgerSection | None:
        """Return the run's ledger: every silo's accountant (``dp_sgd_ledger.dp_sgd_ledger``)."""
        silos = []
        for p in privacy:
            if not isinstance(p.training, DpSgdClient):
                raise ValueError(f"client {p.client} has no DP-SGD budget in a DP-SGD run")
            silos.append(p.training)
        return dp_sgd_ledger(rounds, silos, final=final)

    def silo_guarantee(self, entry: ClientPrivacy, accounted: AnyLedgerRow | None,
                       relations: tuple[float, float] | None) -> tuple[SiloGuarantee, ReleaseGuarantee] | None:
        """Return the silo's row and guarantee from its ledger row (``dp_sgd_ledger.dp_sgd_silo``)."""
        return dp_sgd_silo(entry, self, accounted, relations)

    def event(self, rounds_trained: int) -> accounting.DpSgdEvent:
        """Return the accountant's event after ``rounds_trained`` rounds (``local_steps`` each)."""
        return accounting.DpSgdEvent(self.noise_multiplier, self.sampling_probability,
                                     int(rounds_trained) * self.local_steps)

    def epsilons(self, rounds_trained: int) -> dict[str, float]:
        """Return ε under replace-one and add-remove at δ after ``rounds_trained`` rounds."""
        return accounting.dp_sgd_epsilons(self.event(rounds_trained), self.delta)

    def evaluation_epsilon(self, releases: int) -> float:
        """Return the test records' ε at δ after ``releases`` evaluation replies (∞ when they leave in clear)."""
        return math.inf if self.evaluation is None else self.evaluation.epsilon(releases)

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form (``metrics.json``'s privacy entries, the Flower setup message)."""
        return {**asdict(self), "library": LIBRARY}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DpSgdClient:
        """Read :meth:`to_dict`'s form."""
        fields = {k: data[k] for k in ("client", "noise_multiplier", "clip", "sampling_probability", "local_steps",
                                      "delta", "neighbours", "records")}
        evaluation = data.get("evaluation")
        return cls(**fields, target_epsilon=data.get("target_epsilon"), planned_steps=int(data.get("planned_steps", 0)),
                   evaluation=None if evaluation is None else EvaluationNoise(**evaluation))


def plan_client(client: int, records: int, *, clip: float, delta: float, neighbours: str, rounds: int,
                local_steps: int, sample_rate: float | None, batch_size: int, noise_multiplier: float | None,
                target_epsilon: float | None, eval_epsilon: float | None = None, eval_every: int = 1) -> DpSgdClient:
    """Resolve one silo's DP-SGD: q (``sample_rate``, else ``batch_size``/n capped at 1) and σ (given or calibrated).

    Its evaluation noise is calibrated for one reply per evaluated round (⌈R / ``eval_every``⌉ over the run:
    ``schedule.evaluations``) to ``eval_epsilon`` (None: the target; ∞: no noise, the replies leave in clear); with
    neither, it is matched to one round of its DP-SGD (``evaluation_noise.matched``).

    Raises
    ------
    ValueError
        A silo without training records, or a target no σ reaches (from the accountant).
    """
    if records < 1:
        raise ValueError(f"client {client} has no training records for DP-SGD")
    q = float(sample_rate) if sample_rate is not None else min(1.0, batch_size / records)
    planned = int(rounds) * int(local_steps)
    if noise_multiplier is None:
        assert target_epsilon is not None
        sigma = accounting.calibrate_noise_multiplier(float(target_epsilon), float(delta), q, planned,
                                                      neighbours=neighbours)
    else:
        sigma = float(noise_multiplier)
    if eval_epsilon is None and target_epsilon is None:  # σ given: the run may go on, so no per-run calibration
        evaluation: EvaluationNoise | None = matched(sigma, q, int(local_steps), float(delta), neighbours=neighbours)
    else:
        budget = float(target_epsilon if eval_epsilon is None else eval_epsilon)  # type: ignore[arg-type]
        releases = evaluations(int(rounds), every=int(eval_every), rounds=int(rounds))
        evaluation = None if math.isinf(budget) else calibrate(budget, float(delta), releases, neighbours=neighbours)
    return DpSgdClient(client, sigma, float(clip), q, int(local_steps), float(delta), neighbours, int(records),
                       None if target_epsilon is None else float(target_epsilon), planned, evaluation)


def upload_noise_scale(*, lr: float, noise_multiplier: float, clip: float, sampling_probability: float,
                       records: int, local_steps: int) -> float:
    """Return s_i, the standard deviation per coordinate of the DP-SGD noise in a silo's upload (plain SGD steps).

    Each step (Abadi et al. 2016, Algorithm 1; ``dp_sgd.CsprngDPOptimizer``) adds N(0, σ²C²) per coordinate to the
    sum of the clipped gradients and divides by the expected batch q·n_i; SGD then moves the weights by −lr times
    that. Over T steps the upload is w − (lr / (q·n_i))·Σ_t (Σ clip(g) + ξ_t): the noise Σ_t ξ_t is N(0, T σ²C²)
    per coordinate whatever the gradients, so s_i = lr·σ·C·√T / (q·n_i). ``records`` is the plan's training-row
    count of the silo: the file's, checked against the manifest before the run (``contract.run_dir``), or the row
    count a Flower node reported, which the server bounds.
    """
    values = {"lr": lr, "noise_multiplier": noise_multiplier, "clip": clip,
              "sampling_probability": sampling_probability, "records": records, "local_steps": local_steps}
    for name, value in values.items():
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return lr * noise_multiplier * clip * math.sqrt(local_steps) / (sampling_probability * records)
