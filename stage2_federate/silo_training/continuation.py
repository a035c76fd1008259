"""More steps of a silo's noisy training after its federation, on its continued accountant (torch).

Personalization's DP fine-tuning: ``steps`` more DP-SGD steps (``dp_sgd.train_dp_sgd``: Poisson batches at the
federation's rate q, per-record clipping to its C, N(0, σ²C²) noise from the silo's numpy stream) over the same
records, so the silo's guarantee is that of one run of every step (``accountant.SiloAccountant.after``).
"""

from __future__ import annotations

import numpy as np
import torch

from ldpfl.stage2_federate.data import ClientSplit
from ldpfl.stage2_federate.model import FederatedMLP

from .accountant import AccountantError, SiloAccountant
from .dp_sgd import train_dp_sgd
from .dp_sgd_budget import DpSgdClient

__all__ = ["continue_training"]


def continue_training(model: FederatedMLP, split: ClientSplit, accountant: SiloAccountant, steps: int, *,
                      optimizer: torch.optim.Optimizer, generator: torch.Generator,
                      rng: np.random.Generator) -> SiloAccountant:
    """Take ``steps`` steps on ``model`` in place with the accountant's σ, q and C; return the accountant after them.

    Raises
    ------
    AccountantError
        The split does not hold the accountant's records (its count differs).
    """
    if len(split) != accountant.records:
        raise AccountantError(f"the silo holds {len(split)} training records, its accountant covers "
                              f"{accountant.records}: not the records the federation trained on")
    budget = DpSgdClient(accountant.client, accountant.noise_multiplier, accountant.clip,
                         accountant.sampling_probability, steps, accountant.delta, accountant.neighbours,
                         accountant.records)
    train_dp_sgd(model, split, budget, optimizer=optimizer, generator=generator, rng=rng)
    return accountant.after(steps)
