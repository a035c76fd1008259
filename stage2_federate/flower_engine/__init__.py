"""Stage 2 on Flower: the same federation as the local engine, through Flower's Message API.

* ``protocol``    - messages, record keys, the run configuration (no flwr, no torch);
* ``client_side`` - what a client does (open its own file, train, perturb, evaluate; its random streams
  and resume state), without flwr;
* ``server_side`` - the server's plan from the clients' summaries and the round loop's pieces, without flwr;
* ``client_app``  - the ``ClientApp`` (imports flwr);
* ``server_app``  - the ``ServerApp`` (imports flwr): seeded selection mapped to node ids, the local
  engine's round steps, the outputs;
* ``processes``   - starting Flower's daemons so that none is left behind;
* ``launch``      - :func:`~stage2_federate.flower_engine.launch.run_flower` (a simulation on this machine),
  following a run, and starting Flower's daemons (a SuperLink, one SuperNode per client file);
* ``control``     - a running SuperLink's Control API (submit, watch, stop a run; one-line errors);
* ``deployment``  - :func:`~stage2_federate.flower_engine.deployment.run_on_superlink` (real silos:
  ``ldpfl federate RUN_DIR --engine flower --superlink HOST:PORT``).

Importing this package imports neither flwr nor torch. :func:`require_flower` raises a one-line error
with the install command when Flower is missing.
"""

from __future__ import annotations

import importlib.util

from ldpfl.common.errors import LdpflError

from .protocol import FLOWER_REQUIREMENT, INSTALL_HINT


class FlowerMissingError(LdpflError, RuntimeError):
    """Flower (``flwr[simulation]``) is not installed."""


def require_flower(simulation: bool = True) -> None:
    """Raise :class:`FlowerMissingError` unless flwr (and Ray, for a simulation) can be imported."""
    missing = [name for name in ("flwr", *(("ray",) if simulation else ())) if importlib.util.find_spec(name) is None]
    if missing:
        raise FlowerMissingError(f"the Flower engine needs {FLOWER_REQUIREMENT} ({' and '.join(missing)} not "
                                 f"installed): {INSTALL_HINT}")


__all__ = ["FlowerMissingError", "require_flower"]
