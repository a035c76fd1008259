"""The server optimizer's interface: a step after the strategy's combination, with state kept across rounds.

Reddi et al. 2021 ("Adaptive Federated Optimization", ICLR), Algorithm 1 (FedOpt) splits the server's work in
two: the strategy combines the uploads into the next model W' (``strategies``, ``rounds.server_step``), and a
server optimizer treats the round's step Δ = W' − W as a pseudo-gradient and moves the global model W with it.
An optimizer holds state across rounds (FedAvgM's velocity, FedAdam's two moments): :meth:`ServerOptimizer.state`
returns it as named arrays, the checkpoint saves them (``checkpoint.Snapshot.server``) and
:meth:`ServerOptimizer.restore` puts them back, so a resumed run goes on as an uninterrupted one.

An optimizer reads its options from the run's configuration (:meth:`ServerOptimizer.from_config`): its
``PARAMETERS`` come from ``server_params`` (NAME=VALUE), each with its default and range, checked when the
configuration is built. This module imports numpy only (a configuration is checked before torch loads).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, TypeVar

import numpy as np

from ldpfl.common.errors import ParameterError
from ldpfl.common.registry import Registry

if TYPE_CHECKING:
    from ldpfl.stage2_federate.config import FederationConfig


@dataclass(frozen=True)
class Parameter:
    """A number a server optimizer takes in ``server_params``: its default and the interval it must lie in."""

    default: float
    low: float
    high: float = math.inf
    low_open: bool = False
    high_open: bool = True
    help: str = ""

    def interval(self) -> str:
        """Return the interval as text, e.g. ``[0, 1)``."""
        return f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"

    def contains(self, value: float) -> bool:
        """Tell whether ``value`` is a finite number in the interval."""
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below


class ServerOptimizer:
    """Base: the step W ← W' (the strategy's model unchanged), and no state."""

    NAME: ClassVar[str] = ""
    SOURCE: ClassVar[str] = ""
    SUMMARY: ClassVar[str] = ""
    PARAMETERS: ClassVar[Mapping[str, Parameter]] = {}
    """The ``server_params`` the optimizer takes, by name."""

    def __init__(self, **params: float) -> None:
        self.params = self.checked(params)

    @classmethod
    def checked(cls, params: Mapping[str, float]) -> dict[str, float]:
        """Return every parameter (the defaults filled in); ParameterError naming an unknown or out-of-range one."""
        unknown = sorted(set(params) - set(cls.PARAMETERS))
        if unknown:
            takes = ", ".join(cls.PARAMETERS) or "none"
            raise ParameterError(f"`server_params`: server optimizer {cls.NAME!r} takes no {', '.join(unknown)} "
                                 f"(it takes: {takes})")
        values = {name: params.get(name, spec.default) for name, spec in cls.PARAMETERS.items()}
        for name, value in values.items():
            spec = cls.PARAMETERS[name]
            if not spec.contains(value):
                raise ParameterError(f"`server_params`: {cls.NAME} {name} must lie in {spec.interval()}, "
                                     f"got {value!r}")
        return {name: float(value) for name, value in values.items()}

    @classmethod
    def from_config(cls, config: FederationConfig) -> ServerOptimizer:
        """Return the optimizer ``config`` describes (its ``server_params``)."""
        return cls(**config.server_params)

    def step(self, global_vector: np.ndarray, next_vector: np.ndarray, *, kept: bool = False) -> np.ndarray:
        """Return the next global vector from the round's W (``global_vector``) and the strategy's W'.

        ``kept``: the round kept the previous model (no upload survived, or a non-finite aggregate); the
        state is then left unchanged.
        """
        return next_vector

    def state(self) -> dict[str, np.ndarray]:
        """Return the state kept across rounds as named arrays (copies; empty: none yet)."""
        return {}

    def restore(self, state: Mapping[str, np.ndarray]) -> None:
        """Put back a :meth:`state` (from a checkpoint); a name the optimizer does not keep raises ValueError."""
        if state:
            raise ValueError(f"server optimizer {self.NAME!r} keeps no state, got {', '.join(sorted(state))}")


def restored_arrays(name: str, state: Mapping[str, np.ndarray], keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Return copies of ``state``'s arrays when its names are among ``keys``; ValueError naming the others."""
    unknown = sorted(set(state) - set(keys))
    if unknown:
        raise ValueError(f"server optimizer {name!r} keeps {', '.join(keys)}, not {', '.join(unknown)}")
    return {key: np.array(value, copy=True) for key, value in state.items()}


SERVER_OPTIMIZERS: Registry[type[ServerOptimizer]] = Registry("server optimizer")
O = TypeVar("O", bound=type[ServerOptimizer])


def register(cls: O) -> O:
    """Class decorator: add a server optimizer under its NAME; a second registration of a name fails."""
    SERVER_OPTIMIZERS.add(cls.NAME, cls)
    return cls
