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

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ldpfl.mechanisms import accounting

from .round_record import RoundRecord

LIBRARY = "opacus"


@dataclass(frozen=True)
class DpSgdClient:
    """One silo's DP-SGD: σ, clip C, Poisson rate q, steps per round, δ and what the accountant states.

    ``target_epsilon`` is None when σ was given (``noise_multiplier``) rather than calibrated.
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

    def event(self, rounds_trained: int) -> accounting.DpSgdEvent:
        """Return the accountant's event after ``rounds_trained`` rounds (``local_steps`` each)."""
        return accounting.DpSgdEvent(self.noise_multiplier, self.sampling_probability,
                                     int(rounds_trained) * self.local_steps)

    def epsilons(self, rounds_trained: int) -> dict[str, float]:
        """Return ε under replace-one and add-remove at δ after ``rounds_trained`` rounds."""
        return accounting.dp_sgd_epsilons(self.event(rounds_trained), self.delta)

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form (``metrics.json``'s privacy entries, the Flower setup message)."""
        return {**asdict(self), "library": LIBRARY}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DpSgdClient:
        """Read :meth:`to_dict`'s form."""
        fields = {k: data[k] for k in ("client", "noise_multiplier", "clip", "sampling_probability", "local_steps",
                                      "delta", "neighbours", "records")}
        return cls(**fields, target_epsilon=data.get("target_epsilon"), planned_steps=int(data.get("planned_steps", 0)))


def plan_client(client: int, records: int, *, clip: float, delta: float, neighbours: str, rounds: int,
                local_steps: int, sample_rate: float | None, batch_size: int, noise_multiplier: float | None,
                target_epsilon: float | None) -> DpSgdClient:
    """Resolve one silo's DP-SGD: q (``sample_rate``, else ``batch_size``/n capped at 1) and σ (given or calibrated).

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
    return DpSgdClient(client, sigma, float(clip), q, int(local_steps), float(delta), neighbours, int(records),
                       None if target_epsilon is None else float(target_epsilon), planned)


def rounds_trained(rounds: Iterable[RoundRecord], client: int) -> int:
    """Count the ``rounds`` in which ``client`` trained.

    Selected and not lost (its reply never came, or it failed): a client that trained and was dropped after
    training counts, since its noisy model may have left it (conservative).
    """
    return sum(client in record.selected and client not in (record.lost or ()) for record in rounds)
