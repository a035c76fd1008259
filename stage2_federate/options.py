"""The scalar options of a federation that stage 2 passes to the mechanisms perturbing its uploads.

Each is a ``FederationConfig`` field (and a field of ``ldpfl.api.fields.FederationFields``); the CLI's flag, its
check and its help text come from here. A mechanism says which it takes in its ``FederationWiring.options``
(``ldpfl.mechanisms.base``); :func:`check_wiring` refuses a wiring that names an option not registered here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ldpfl.mechanisms.base import FederationWiring


@dataclass(frozen=True)
class FederationOption:
    """A scalar federation option, passed by stage 2 to the mechanisms whose ``FederationWiring.options`` take it.

    It is a ``FederationConfig`` field; the CLI's flag, its check and its help text come from here.

    ``kind``: ``"positive"`` (a number > 0), ``"probability"`` (in (0, 1)) or ``"delta"`` (in (0, 1), or
    ``"1/n"``: δ_i = 1/|D_i| per client, WU 3.1).
    """

    name: str
    kind: str
    help: str


# The scalar federation options a real mechanism may take, registered once: a new one is an entry here, its
# field in ``FederationConfig`` (and ``ldpfl.api.fields.FederationFields``) and the wirings that take it.
FEDERATION_OPTIONS: Mapping[str, FederationOption] = MappingProxyType({option.name: option for option in (
    FederationOption("clip", "positive", "Element-wise clip c of the upload; with --dp-sgd, the per-record L2 clip "
                     "C of DP-SGD (default 0.1)."),
    FederationOption("delta", "delta", "δ of the upload's (ε, δ)-DP, or '1/n' for 1/|D_i| per client (Wu 3.1); "
                     "with --dp-sgd, δ of each silo's DP-SGD (default 1e-5)."),
    FederationOption("sensitivity", "positive", "L2 sensitivity of the upload."),
    FederationOption("sample_rate", "probability", "Client sampling rate q; with --dp-sgd, the Poisson rate q of "
                     "each DP-SGD step (default 0.1365)."),
)})


def check_wiring(name: str, wiring: FederationWiring) -> FederationWiring:
    """Return ``wiring`` (mechanism ``name``'s) when every option it takes is registered; ValueError naming them."""
    unknown = sorted(set(wiring.options) - set(FEDERATION_OPTIONS))
    if unknown:
        raise ValueError(f"mechanism {name!r} takes unknown federation options {', '.join(unknown)}; "
                         f"known: {', '.join(FEDERATION_OPTIONS)}")
    return wiring


__all__ = ["FEDERATION_OPTIONS", "FederationOption", "check_wiring"]
