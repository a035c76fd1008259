"""Record-level DP-SGD of a silo's local training (``ldpfl federate --dp-sgd``), with Opacus.

Each local step (Abadi et al. 2016, Algorithm 1) draws a Poisson batch (every training record of the silo
independently with probability q), computes every record's gradient (Opacus' ``GradSampleModule``), clips each
to L2 norm C, sums them, adds N(0, σ²C²) noise and divides by the expected batch q·n (Opacus' ``DPOptimizer``
with ``loss_reduction="mean"``), then takes the optimizer's step. Only the model after the round's steps leaves
the silo; everything else is post-processing of it. The batches' loss and accuracy are not reported (they are
computed from clear records).

Decisions:

* **The noise and the batches come from the silo's own numpy Generator** (its perturbation stream: the OS-keyed
  CSPRNG by default, PCG64 with ``--seed``), never from torch's global state. Opacus' ``secure_mode`` needs
  torchcsprng, which is not built for current torch; :class:`CsprngDPOptimizer` overrides only the noise draw.
* **σ is per silo**: with ``target_epsilon`` each silo's σ is calibrated for its own q over every step the run
  may take (``rounds × local_steps``: the worst case, in which it is selected every round), so each silo's ε over
  the whole run is at most the target whatever the selection (``ldpfl.mechanisms.accounting``).
* **The accountant is the run's history**: a silo's steps are ``local_steps`` per round in which it trained
  (selected and not lost; dropped after training counts too: conservative). A resumed run recomputes it
  from the checkpoint's history, so it is restored exactly; a run extended past its planned rounds is refused
  when it would exceed the target.
* Dropout layers draw their masks from the silo's torch Generator, as without DP; they act per record, so
  per-record clipping still bounds each record's influence.

Opacus and torch load with this module (stage 2 only).
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ldpfl.mechanisms.base import require_generator
from ldpfl.stage2_federate.data import ClientSplit
from ldpfl.stage2_federate.label_noise import LabelNoise, label_loss
from ldpfl.stage2_federate.model import FederatedMLP, TrainStats
from ldpfl.stage2_federate.streaming import StreamedSplit

if TYPE_CHECKING:
    from .dp_sgd_budget import DpSgdClient



@functools.cache
def _optimizer_class() -> type:
    from opacus.optimizers import DPOptimizerFastGradientClipping

    class CsprngDPOptimizer(DPOptimizerFastGradientClipping):
        """Opacus' ghost-clipping optimizer whose Gaussian noise comes from a numpy Generator (the silo's stream)."""

        def __init__(self, *args: Any, rng: np.random.Generator, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.rng = rng

        def add_noise(self) -> None:
            """p.grad = Σ clip(g_i) + N(0, σ²C²) per coordinate (Abadi et al. 2016, Algorithm 1, 'Add noise')."""
            std = self.noise_multiplier * self.max_grad_norm
            for p in self.params:
                summed = p.summed_grad
                draw = self.rng.standard_normal(summed.numel(), dtype=np.float32)
                noise = torch.from_numpy(draw).to(summed.device).view_as(summed)
                p.grad = (summed + std * noise).view_as(p)

        def scale_grad(self) -> None:
            """Divide the noisy sum by the expected batch q·n (Algorithm 1; the per-record losses are summed)."""
            for p in self.params:
                p.grad /= self.expected_batch_size

    return CsprngDPOptimizer


def _rows(split: ClientSplit | StreamedSplit, index: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(split, ClientSplit):
        raise ValueError("DP-SGD samples rows at random: the client's training split must fit in memory (it is "
                         "streamed from its file here); use fewer or smaller client files")
    rows = torch.from_numpy(index).to(split.features.device)
    return split.inputs(rows), split.labels[rows]


def train_dp_sgd(model: FederatedMLP, split: ClientSplit | StreamedSplit, dp: DpSgdClient, *,
                 optimizer: torch.optim.Optimizer, generator: torch.Generator, rng: np.random.Generator,
                 label_noise: LabelNoise | None = None) -> TrainStats:
    """Take ``dp.local_steps`` DP-SGD steps on ``split`` from the model's current weights (trained in place).

    Parameters
    ----------
    model : FederatedMLP
        The silo's scratch model, holding the broadcast weights.
    split : ClientSplit
        The silo's training records (in memory).
    dp : DpSgdClient
        σ, C, q and the steps per round.
    optimizer : torch.optim.Optimizer
        Over ``model.parameters()`` (SGD or Adam, fresh each round).
    generator : torch.Generator
        The silo's dropout masks.
    rng : numpy.random.Generator
        The silo's Poisson batches and Gaussian noise.
    label_noise : LabelNoise, optional
        The files' k-RR label noise (corrected loss).

    Returns
    -------
    TrainStats
        NaN loss and accuracy, and the records the steps drew: the batches' loss and accuracy are computed from
        clear training records, which the DP-SGD guarantee covers only through the noisy model, so they stay
        on the silo (never reported; the round record's train_* are NaN).
    """
    from opacus.grad_sample import GradSampleModuleFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPTensorFastGradientClipping

    require_generator(rng)
    n = len(split)
    model.train()
    model.set_generator(generator)
    with warnings.catch_warnings():  # Opacus' hooks on a model whose inputs need no gradient: expected, harmless
        warnings.simplefilter("ignore", UserWarning)
        wrapped = GradSampleModuleFastGradientClipping(model, loss_reduction="sum", max_grad_norm=dp.clip,
                                                       use_ghost_clipping=True)
    # 'sum' throughout: each record's own loss and gradient; the optimizer divides the noisy sum by q·n
    dp_optimizer = _optimizer_class()(optimizer, noise_multiplier=dp.noise_multiplier, max_grad_norm=dp.clip,
                                      expected_batch_size=max(dp.sampling_probability * n, 1e-12),
                                      loss_reduction="sum", rng=rng)
    seen = 0
    try:
        for _step in range(dp.local_steps):
            index = np.flatnonzero(rng.random(n) < dp.sampling_probability)  # Poisson sampling, rate q
            inputs, labels = _rows(split, index)
            dp_optimizer.zero_grad(set_to_none=True)
            logits = wrapped(inputs)
            per_record = label_loss(logits, labels, label_noise, reduction="none")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                # ghost clipping (Li et al. 2022; Bu et al. 2023): per-record norms without per-record
                # gradients, then the gradient of Σ_i min(1, C/‖g_i‖)·loss_i = Σ_i clip_C(g_i)
                DPTensorFastGradientClipping(wrapped, dp_optimizer, per_record, "sum").backward()
            dp_optimizer.step()
            seen += int(labels.shape[0])
    finally:
        wrapped._close()  # remove Opacus' hooks: the model is the run's scratch space  # noqa: SLF001
    return TrainStats(math.nan, math.nan, seen)
