"""One silo's DP-SGD budget (``ldpfl federate --dp-sgd``): σ, C, q, steps, and its accountant over the run.

Torch-free (the CLI, the ledger and the Flower server read it): the training itself is ``dp_sgd``. A silo's
σ is given, or calibrated for its own Poisson rate q over every step the run may take (``rounds × local_steps``:
the worst case, in which it is selected every round), so its ε over the whole run is at most the target whatever
the selection. Its accountant is the run's history: ``local_steps`` per round in which it trained (selected and
not lost; a client dropped after training counts too: conservative), composed by the one accountant
(``ldpfl.mechanisms.accounting``) under both neighbouring relations. A resumed run recomputes it from the
checkpoint's history, so it is restored exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ldpfl.mechanisms import accounting

from .evaluation_noise import EvaluationNoise, calibrate, matched
from .round_record import RoundRecord
from .schedule import evaluations

LIBRARY = "opacus"


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


def rounds_trained(rounds: Iterable[RoundRecord], client: int) -> int:
    """Count the ``rounds`` in which ``client`` trained.

    Selected and not lost (its reply never came, or it failed): a client that trained and was dropped after
    training counts, since its noisy model may have left it (conservative).
    """
    return sum(client in record.selected and client not in (record.lost or ()) for record in rounds)
