"""Server optimizers: what the server does with each round's step W' − W, with state kept across rounds.

One algorithm per module, registered under its name (the ``server_optimizer`` choices): ``fedavgm`` (server
momentum, the default; β = 0 is plain FedAvg) and ``fedadam`` (Adam on the server, Reddi et al. 2021). The
interface, the registry and the parameters' checks are in ``base``, with Reddi et al.'s framing (FedOpt).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import SERVER_OPTIMIZERS, Parameter, ServerOptimizer, register
from .fedadam import FedAdam
from .fedavgm import FedAvgM

if TYPE_CHECKING:
    from ldpfl.stage2_federate.config import FederationConfig

DEFAULT_SERVER_OPTIMIZER = FedAvgM.NAME


def server_optimizer_names() -> list[str]:
    """Return the registered server optimizers (``server_optimizer`` choices), in registration order."""
    return SERVER_OPTIMIZERS.names()


def server_optimizer_class(name: str) -> type[ServerOptimizer]:
    """Return the server optimizer registered as ``name``; an unknown name lists the valid ones."""
    return SERVER_OPTIMIZERS.get(name)


def create_server_optimizer(config: FederationConfig) -> ServerOptimizer:
    """Return a fresh optimizer (no state yet) of ``config.server_optimizer``, with its options from ``config``."""
    return server_optimizer_class(config.server_optimizer).from_config(config)


__all__ = ["DEFAULT_SERVER_OPTIMIZER", "FedAdam", "FedAvgM", "Parameter", "SERVER_OPTIMIZERS", "ServerOptimizer",
           "create_server_optimizer", "register", "server_optimizer_class", "server_optimizer_names"]
