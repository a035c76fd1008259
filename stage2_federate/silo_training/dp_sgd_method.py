"""The run's DP-SGD (``ldpfl federate --dp-sgd``): every silo's budget planned, its learning rate, its resume rule.

Each silo's σ is calibrated for its own q over every step the run may take (``dp_sgd_budget.plan_client``), so a
resumed run may not take other rounds than the ones it was calibrated for (:meth:`DpSgdMethod.check_resume`).
Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ldpfl.common.errors import LdpflError, ParameterError
from ldpfl.stage2_federate.config import DP_SGD_LR, FederationConfig

from .dp_sgd_budget import DpSgdClient, plan_client


class DpSgdTargetError(LdpflError, ValueError):
    """A resumed DP-SGD run asks for more rounds than its σ was calibrated for (its target would be exceeded)."""


@dataclass(frozen=True)
class DpSgdMethod:
    """Record-level DP-SGD of every silo (``TrainingMethod``): SGD's :data:`~.config.DP_SGD_LR` by default."""

    default_lr: float = DP_SGD_LR

    def plan(self, config: FederationConfig, sizes: Sequence[tuple[int, int]]) -> Mapping[int, DpSgdClient]:
        """Each client's DP-SGD from (index, training rows): σ calibrated for its own q over every step of the run.

        Calibrations are cached by (target, δ, q, steps): silos of one size share one.
        """
        try:
            return {index: plan_client(index, rows, clip=config.dp_clip, delta=config.dp_delta,
                                       neighbours=config.neighbours, rounds=config.rounds,
                                       local_steps=config.local_steps, sample_rate=config.dp_sample_rate,
                                       batch_size=config.batch_size, noise_multiplier=config.noise_multiplier,
                                       target_epsilon=config.target_epsilon, eval_epsilon=config.eval_epsilon,
                                       eval_every=config.eval_every)
                    for index, rows in sizes}
        except ValueError as error:
            raise ParameterError(f"`dp_sgd`: {error}") from None

    def check_resume(self, config: FederationConfig, started: Mapping[str, Any]) -> None:
        """Refuse to extend a DP-SGD run with a target ε past the rounds its σ was calibrated for.

        σ of each silo was calibrated for ``rounds × local_steps`` steps of the run as it started (``started``: the
        checkpoint's configuration); more rounds would spend more than ``target_epsilon``; likewise its evaluation
        noise for the replies of the run's evaluated rounds (``schedule.evaluations``) at ``eval_epsilon``.
        (With a given ``noise_multiplier`` and no ``eval_epsilon`` the run may go on: the ledger reports what it
        spends.)
        """
        if int(started.get("rounds", config.rounds)) == config.rounds:
            return
        if config.target_epsilon is None and config.eval_epsilon is not None and math.isfinite(config.eval_epsilon):
            raise DpSgdTargetError(f"`rounds` {config.rounds}: this DP-SGD run's evaluation noise was calibrated for "
                                   f"{started.get('rounds')} rounds at eval epsilon {config.eval_epsilon:g} per silo; "
                                   "other rounds would exceed it. Start a new run")
        if config.target_epsilon is None:
            return
        raise DpSgdTargetError(f"`rounds` {config.rounds}: this DP-SGD run was calibrated for {started.get('rounds')} "
                               f"rounds at target epsilon {config.target_epsilon:g} per silo; other rounds would "
                               "change sigma or exceed the target. Start a new run (its silos' records are then spent "
                               "again: the two runs' epsilons add up)")
