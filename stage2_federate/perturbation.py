"""Model perturbation per client: one mechanism instance per client, with its own ε (and τ for PDPM).

Each selected client flattens its trained model into one vector of d = ``dim`` parameters and uploads
``mechanism.randomize(vector)`` drawn from its own child Generator. The vector is either the parameters
themselves or the update (local − global).

Every choice here is read from the mechanism's declared :class:`ldpfl.mechanisms.FederationWiring` (its
``FEDERATION`` class attribute, next to its registration): which vector it perturbs by default, which
federation options it takes and which constructor parameter each one reaches, whether ε_i and d reach it,
where each client's safe range goes, whether its σ depends on the number of rounds, and whether its
uploads are signs to aggregate by sign. Its σ_i for the weighted aggregations is ``noise_scale()``. So a
new real mechanism is wired here by its own module alone; ``mechanisms/{gaussian,gaussian_wu,ldpsign,
pdpm,fedaw,identity}.py`` say why each one perturbs what it does.

``perturb_target`` in the configuration can override the target of every mechanism but those with sign
aggregation, whose target follows the sign mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ldpfl import mechanisms as mech
from ldpfl.common.errors import ParameterError
from ldpfl.mechanisms.base import PARAMETERS, UPDATE, FederationWiring, require_generator
from ldpfl.mechanisms.randomness import UNRECORDED
from ldpfl.mechanisms.report import PrivacyReport

from . import aggregation as agg
from .options import FEDERATION_OPTIONS, check_wiring

AUTO = "auto"
TARGETS = (AUTO, PARAMETERS, UPDATE)

SIGN_UPDATE = "update"
SIGN_LITERAL = "literal"
SIGN_MODES = (SIGN_UPDATE, SIGN_LITERAL)

RANGE_OPTIONS = ("client_ranges", "client_centres")  # the configuration's names for the per-client τ_i


def perturbation_names() -> list[str]:
    """Return the names ``perturbation`` accepts: the registered mechanisms that declare a federation wiring."""
    return mech.federation_names()


def perturbation_wiring(name: str) -> FederationWiring:
    """Return the federation wiring that mechanism ``name`` declares; an unknown name lists the valid ones."""
    wiring = mech.mechanism_class(name).FEDERATION if name in mech.mechanism_names() else None
    if wiring is None:
        raise ValueError(f"unknown perturbation {name!r}; valid names: {', '.join(perturbation_names())}")
    return check_wiring(name, wiring)


def accepted_options(name: str) -> list[str]:
    """Return the configuration options perturbation ``name`` takes (scalar options, then ``client_ranges`` ...)."""
    wiring = perturbation_wiring(name)
    return [*wiring.options, *(RANGE_OPTIONS if wiring.ranges is not None else ())]


def option_help(option: str) -> str:
    """Return the help text of federation option ``option``, generated from the registries.

    What the option is, then each mechanism that takes it with that mechanism's own description and default.
    """
    takers = []
    for name in perturbation_names():
        parameter = perturbation_wiring(name).options.get(option)
        if parameter is None:
            continue
        spec = next(s for s in mech.mechanism_class(name).parameter_specs() if s.name == parameter)
        default = "" if spec.default is None or "default" in spec.help else f", default {spec.default:g}"
        takers.append(f"{name}: {spec.help}{default}")
    return f"{FEDERATION_OPTIONS[option].help} " + ("; ".join(takers) or "taken by no registered mechanism") + "."


def resolve_target(name: str, requested: str = AUTO, sign_mode: str = SIGN_UPDATE) -> str:
    """Return the vector a mechanism perturbs: ``parameters`` or ``update`` (its wiring's, unless overridden)."""
    wiring = perturbation_wiring(name)
    if requested not in TARGETS:
        raise ValueError(f"perturbation target must be one of {', '.join(TARGETS)}, got {requested!r}")
    if sign_mode not in SIGN_MODES:
        raise ValueError(f"sign mode must be one of {', '.join(SIGN_MODES)}, got {sign_mode!r}")
    if wiring.sign_aggregation:
        implied = UPDATE if sign_mode == SIGN_UPDATE else PARAMETERS
        if requested not in (AUTO, implied):
            raise ParameterError(f"{name} with `sign_mode` {sign_mode!r} perturbs the {implied}; "
                                 f"`perturb_target` {requested!r} contradicts it")
        return implied
    return wiring.target if requested == AUTO else requested


# --------------------------------------------------------------------------------------------------
# How the server turns a round's aggregate into the next global model.


@dataclass(frozen=True)
class ServerRule:
    """W ← aggregate (parameters), W ← W + s·aggregate (updates); s = η_s for sign steps (signSGD), else 1.

    Sign aggregation (WU eqs. 10, 13, 16) with an update target is signSGD with majority vote (WU ref.
    [19]): W ← W + η_s·sign(·); with a parameters target it is literal eq. 10: W ← sign(·).
    """

    target: str
    signed: bool = False
    server_lr: float = 1.0

    @classmethod
    def for_perturbation(cls, name: str, target: str, server_lr: float) -> ServerRule:
        """Return the rule of perturbation ``name`` perturbing ``target``."""
        signed = perturbation_wiring(name).sign_aggregation
        return cls(target, signed, float(server_lr) if signed else 1.0)

    def apply(self, global_vector: np.ndarray, aggregate: np.ndarray) -> np.ndarray:
        """Return the next global vector (same dtype as ``global_vector``)."""
        if self.target == PARAMETERS:
            return aggregate
        return agg.apply_update(global_vector, aggregate * np.float32(self.server_lr))

    def describe(self) -> str:
        """Describe the rule in one line for ``config.json``."""
        if self.signed:
            return "W <- W + server_lr * sign(aggregate)" if self.target != PARAMETERS else "W <- sign(aggregate)"
        return "W <- W + aggregate" if self.target != PARAMETERS else "W <- aggregate"


# --------------------------------------------------------------------------------------------------
# One perturbation per client.


@dataclass(frozen=True)
class ClientPerturbation:
    """Client ``client``'s mechanism, the vector it perturbs, and its budget ε_i (None: not budgeted)."""

    client: int
    mechanism: Any
    target: str
    epsilon: float | None = None

    @property
    def noise_scale(self) -> float | None:
        """σ_i of the mechanism (WU eqs. 11, 14); None when it adds no noise."""
        return self.mechanism.noise_scale()

    def perturb(self, local: np.ndarray, global_vector: np.ndarray, *, rng: np.random.Generator) -> np.ndarray:
        """Return the upload, M(local) or M(local − global), drawn from the client's own Generator."""
        require_generator(rng)
        vector = local - global_vector if self.target == UPDATE else local
        return self.mechanism.randomize(vector, rng=rng)

    def report(self, randomness_mode: str, generator: str = UNRECORDED) -> PrivacyReport:
        """Return the mechanism's privacy report, labelled with the run's randomness ``mode`` and ``generator``.

        The run's ``ClientPrivacy`` adds the client, the target and σ_i (``metrics.json``'s ``privacy`` entry).
        """
        report: PrivacyReport = self.mechanism.report().with_randomness(randomness_mode, generator)
        return report


def build_client_perturbations(
    name: str, *, dim: int, epsilons: Sequence[float], target: str,
    ranges: Sequence[float] | None = None, centres: Sequence[float] | None = None,
    train_sizes: Sequence[int] | None = None, rounds: int | None = None, clients: Sequence[int] | None = None,
    **options: float | str | None,
) -> list[ClientPerturbation]:
    """One mechanism per client, with its own ε_i (and L_i, c_i when it takes ranges), ``dim`` = model parameters.

    ``delta`` may be a number, None (the mechanism's default) or ``"1/n"``: δ_i = 1/|D_i| per client
    (WU 3.1: "δ_i = 1/|D_i|", from ``train_sizes``). ``rounds`` reaches mechanisms whose σ depends on R
    and is ignored by the others. ``clients`` are the client indices (default 0, 1, ...). ``options`` are
    the federation options (``FEDERATION_OPTIONS``: ``clip``, ``delta`` …; None: the mechanism's default).
    Options the mechanism does not take raise :class:`~ldpfl.common.errors.ParameterError` naming them.
    """
    unknown = sorted(set(options) - set(FEDERATION_OPTIONS))
    if unknown:
        raise TypeError(f"unknown federation options {', '.join(unknown)}; known: {', '.join(FEDERATION_OPTIONS)}")
    wiring = perturbation_wiring(name)
    count = len(epsilons)
    given = {option: options.get(option) for option in FEDERATION_OPTIONS}
    refused = [f"`{k}`" for k, v in given.items() if v is not None and k not in wiring.options]
    if wiring.ranges is None and (ranges is not None or centres is not None):
        refused.append("/".join(f"`{k}`" for k in RANGE_OPTIONS))
    if refused:
        accepted = [f"`{k}`" for k in accepted_options(name)]
        raise ParameterError(f"perturbation {name!r} takes no {', '.join(refused)}; it takes "
                             f"{', '.join(accepted) or 'none of these options'}")
    if target not in (PARAMETERS, UPDATE):
        raise ValueError(f"target must be {PARAMETERS!r} or {UPDATE!r}, got {target!r}")
    ids = list(range(count)) if clients is None else list(clients)
    for what, values in (("ranges", ranges), ("centres", centres), ("train sizes", train_sizes), ("clients", ids)):
        if values is not None and len(values) != count:
            raise ValueError(f"{what} list has {len(values)} values but there are {count} clients")
    out = []
    for i, epsilon in enumerate(epsilons):
        params: dict[str, Any] = {}
        if wiring.budget:
            params.update(epsilon=float(epsilon), dim=int(dim))
        for option, value in given.items():
            if value is None:
                continue
            if FEDERATION_OPTIONS[option].kind == "delta":  # a number, or '1/n' per client
                params[wiring.options[option]] = _client_delta(value, None if train_sizes is None else train_sizes[i])
            else:
                params[wiring.options[option]] = float(value)
        if wiring.rounds is not None and rounds is not None:
            params[wiring.rounds] = int(rounds)  # e.g. R of Wu eq. 4 is the number of federation rounds
        if wiring.ranges is not None:
            length_param, centre_param = wiring.ranges
            if ranges is not None:
                params[length_param] = float(ranges[i])
            if centres is not None:
                params[centre_param] = float(centres[i])
        mechanism = mech.create_mechanism(name, **params)
        out.append(ClientPerturbation(ids[i], mechanism, target, float(epsilon) if wiring.budget else None))
    return out


def _client_delta(delta: float | str, train_size: int | None) -> float:
    if isinstance(delta, str):
        if delta != "1/n":
            raise ParameterError(f"`delta` must be a number in (0, 1) or '1/n' (1/|D_i| per client), got {delta!r}")
        if train_size is None or train_size < 2:
            raise ParameterError(f"`delta` '1/n' needs a training split of at least 2 rows, got {train_size!r}")
        return 1.0 / float(train_size)
    return float(delta)

