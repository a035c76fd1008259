"""A silo's DP-SGD accountant, continued after its federation (personalization's DP fine-tuning). Torch-free.

The federation's ``metrics.json`` records each silo's DP-SGD (σ, clip C, Poisson rate q over its n training
records, δ, the neighbouring relation: ``privacy[i].dp_sgd``) and the steps it took (``privacy_ledger``). DP
fine-tuning takes T more steps with the same σ, q and C over the same records, so the silo's guarantee is that of
one DP-SGD run of ``federation steps + T`` steps (Abadi et al. 2016; composed by ``ldpfl.mechanisms.accounting``,
dp-accounting's PLD). A later fine-tuning of the same silo continues from the accountant an earlier one wrote
(``personalization.json``); another silo's accountant is refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ldpfl.common.errors import ParameterError
from ldpfl.mechanisms import accounting

from .dp_sgd_method import DpSgdMethod

__all__ = ["CONTINUED_LR", "AccountantError", "SiloAccountant", "check_budget", "from_federation", "resumed_accountant"]


CONTINUED_LR = DpSgdMethod.default_lr
"""SGD's learning rate of continued training by default: the federation's."""


class AccountantError(ParameterError):
    """An accountant that cannot be continued (a ``ValueError``: the CLI's exit code 2, one line)."""


@dataclass(frozen=True)
class SiloAccountant:
    """One silo's DP-SGD over its federation and its fine-tunings: σ, q, C, δ, n and the steps of each part."""

    client: int
    file_sha256: str
    noise_multiplier: float
    sampling_probability: float
    clip: float
    delta: float
    neighbours: str
    records: int
    federation_steps: int
    fine_tuning_steps: tuple[int, ...] = field(default=())

    @property
    def steps(self) -> int:
        """Return every DP-SGD step the silo took over its records so far."""
        return self.federation_steps + sum(self.fine_tuning_steps)

    def event(self, more: int = 0) -> accounting.DpSgdEvent:
        """Return the accountant's event after ``more`` further steps."""
        return accounting.DpSgdEvent(self.noise_multiplier, self.sampling_probability, self.steps + int(more))

    def epsilons(self, more: int = 0) -> dict[str, float]:
        """Return ε at δ under replace-one and add-remove after ``more`` further steps."""
        return accounting.dp_sgd_epsilons(self.event(more), self.delta)

    def after(self, steps: int) -> SiloAccountant:
        """Return the accountant once ``steps`` fine-tuning steps are taken."""
        return SiloAccountant(self.client, self.file_sha256, self.noise_multiplier, self.sampling_probability,
                              self.clip, self.delta, self.neighbours, self.records, self.federation_steps,
                              (*self.fine_tuning_steps, int(steps)))

    def note(self) -> str:
        """Return what the silo's guarantee covers, in words (a personalized model's mark)."""
        epsilon = self.epsilons()[self.neighbours]
        return (f"DP-SGD over the federation and the fine-tuning: ({epsilon:.6g}, {self.delta:g})-DP "
                f"({self.neighbours}) in each of client {self.client}'s training records")

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form (``personalization.json``'s ``accountant``), with ε under both relations."""
        epsilons = self.epsilons()
        return {"client": self.client, "file_sha256": self.file_sha256, "noise_multiplier": self.noise_multiplier,
                "sampling_probability": self.sampling_probability, "clip": self.clip, "delta": self.delta,
                "neighbours": self.neighbours, "records": self.records, "federation_steps": self.federation_steps,
                "fine_tuning_steps": list(self.fine_tuning_steps), "steps": self.steps,
                "epsilon": epsilons[self.neighbours], "epsilon_replace_one": epsilons[accounting.REPLACE_ONE],
                "epsilon_add_remove": epsilons[accounting.ADD_REMOVE], "method": accounting.METHOD}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SiloAccountant:
        """Read :meth:`to_json`'s form (``KeyError``/``ValueError`` when malformed)."""
        return cls(int(data["client"]), str(data["file_sha256"]), float(data["noise_multiplier"]),
                   float(data["sampling_probability"]), float(data["clip"]), float(data["delta"]),
                   accounting.require_neighbours(str(data["neighbours"])), int(data["records"]),
                   int(data["federation_steps"]), tuple(int(s) for s in data["fine_tuning_steps"]))


def from_federation(metrics: Mapping[str, Any], where: str | Path, *, client: int, file_sha256: str,
                    records: int) -> SiloAccountant:
    """Return client ``client``'s accountant as its federation left it (``metrics.json`` at ``where``).

    Raises
    ------
    AccountantError
        The federation did not train with DP-SGD, records no accountant of this silo, or one over another number
        of training records than the silo's file holds.
    """
    config: Mapping[str, Any] = metrics["config"] if isinstance(metrics.get("config"), Mapping) else {}
    if not config.get("dp_sgd"):
        raise AccountantError(f"DP fine-tuning continues the silo's DP-SGD accountant, but the federation of {where} "
                               "did not train with DP-SGD (ldpfl federate --dp-sgd); use `method` clear or "
                               "interpolate (local-only models)")
    entries = [p for p in metrics.get("privacy") or () if isinstance(p, Mapping) and p.get("client") == client]
    steps_taken = metrics.get("privacy_ledger")  # each silo's steps so far
    listed = steps_taken.get("clients") if isinstance(steps_taken, Mapping) else None
    rows = [r for r in listed or () if isinstance(r, Mapping) and r.get("client") == client]
    dp = entries[0].get("dp_sgd") if entries else None
    if not isinstance(dp, Mapping) or not rows or "steps" not in rows[0]:
        raise AccountantError(f"{where} records no DP-SGD accountant of client {client}; check `client_index`")
    if int(dp["client"]) != client or int(dp["records"]) != records:
        raise AccountantError(f"the accountant in {where} is client {dp['client']}'s over {dp['records']} training "
                               f"records, not client {client}'s over its {records}: another silo's accountant")
    return SiloAccountant(client, file_sha256, float(dp["noise_multiplier"]), float(dp["sampling_probability"]),
                          float(dp["clip"]), float(dp["delta"]), accounting.require_neighbours(str(dp["neighbours"])),
                          records, int(rows[0]["steps"]))


def resumed_accountant(record: Mapping[str, Any], where: str | Path, *, client: int, file_sha256: str,
                       records: int) -> SiloAccountant:
    """Return the accountant an earlier DP personalization wrote, refusing another silo's.

    Raises
    ------
    AccountantError
        No accountant in the record, or one of another silo, client file or number of records.
    """
    data = record.get("accountant")
    try:
        accountant = SiloAccountant.from_json(data) if isinstance(data, Mapping) else None
    except (KeyError, TypeError, ValueError):
        accountant = None
    if accountant is None:
        raise AccountantError(f"{where} records no DP-SGD accountant (`resume` continues a DP personalization)")
    if accountant.client != client or accountant.file_sha256 != file_sha256 or accountant.records != records:
        raise AccountantError(f"`resume` {where} holds client {accountant.client}'s accountant (file sha256 "
                               f"{accountant.file_sha256[:12]}..., {accountant.records} records), not client "
                               f"{client}'s (sha256 {file_sha256[:12]}..., {records} records): another silo's "
                               "accountant")
    return accountant


def check_budget(accountant: SiloAccountant, steps: int, max_epsilon: float | None) -> float:
    """Return the silo's ε (its relation) after ``steps`` more steps; refuse it above ``max_epsilon``, before training.

    Raises
    ------
    AccountantError
        The total would pass ``max_epsilon``.
    """
    total = accountant.epsilons(steps)[accountant.neighbours]
    if max_epsilon is not None and not total <= max_epsilon:
        before = accountant.epsilons()[accountant.neighbours]
        raise AccountantError(f"{steps} DP fine-tuning steps would take client {accountant.client} from epsilon "
                               f"{before:.4g} ({accountant.steps} steps) to {total:.4g} ({accountant.neighbours}, "
                               f"delta {accountant.delta:g}), past `max_epsilon` {max_epsilon:g}; take fewer "
                               "`steps`")
    if not math.isfinite(total):
        raise AccountantError(f"client {accountant.client}'s epsilon after {steps} more steps is not finite")
    return total
