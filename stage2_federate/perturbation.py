"""Model perturbation per client: one mechanism instance per client, with its own ε (and τ for PDPM).

Each selected client flattens its trained model into one vector of d = ``dim`` parameters and uploads
``mechanism.randomize(vector)`` drawn from its own child Generator. The vector is either the parameters
themselves or the update (local − global); which one each mechanism perturbs, and why:

============== ========== ==========================================================================
mechanism      target     reason
============== ========== ==========================================================================
none           parameters LDPFL Algorithm 1 line 20: clients send their parameters M_u,i; the privacy
                          of LDPFL lies in the randomized input features, not here.
gaussian-wu    parameters WU 3.1: clip the local model parameters Ĝ_i, add N(0, σ_i²) with σ_i of eq. 4.
gaussian       parameters WU 3.1 with the classic σ (eq. 7).
ldpsign        update     WU eqs. 6-7 applied to the update, the server steps W ← W + η_s·sign(mean)
                          (signSGD with majority vote, WU ref. [19]). Literal eq. 10 (``sign_mode =
                          literal``) perturbs the parameters and sets W to the ±1 vector itself.
pdpm           parameters PLDP Algorithm 1 line 19: Personalized(w_i,t) perturbs the local weights,
                          whose range the paper takes as τ_i around [-1, 1].
fedaw-gaussian update     DP-FedAW eq. 9 perturbs the locally updated weights; clipping the L2 norm of
                          the whole parameter vector to S_f/2 would destroy the model, so the clip and
                          the noise apply to the round's update, as DP-FedAvg does.
============== ========== ==========================================================================

``perturb_target`` in the configuration can override the target of every mechanism but ldpsign,
whose target follows its sign mode.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import mechanisms as mech
from mechanisms.base import require_generator
from mechanisms.calibration import pdpm_variance_bound

PARAMETERS = "parameters"
UPDATE = "update"
AUTO = "auto"
TARGETS = (AUTO, PARAMETERS, UPDATE)

SIGN_UPDATE = "update"
SIGN_LITERAL = "literal"
SIGN_MODES = (SIGN_UPDATE, SIGN_LITERAL)


@dataclass(frozen=True)
class PerturbationSpec:
    """How the federation wires one mechanism: its default target and which options it takes."""

    name: str
    default_target: str
    options: tuple[str, ...]
    summary: str


# Options: the FederationConfig knobs a mechanism accepts (anything else given is refused).
PERTURBATIONS: dict[str, PerturbationSpec] = {
    spec.name: spec for spec in (
        PerturbationSpec("none", PARAMETERS, (), "no model perturbation (LDPFL: privacy is in the features)"),
        PerturbationSpec("gaussian-wu", PARAMETERS, ("clip", "delta", "sample_rate"),
                         "clip to [-c, c], Gaussian noise with Wu eq. 4 sigma (R = rounds)"),
        PerturbationSpec("gaussian", PARAMETERS, ("clip", "delta", "sensitivity"),
                         "clip to [-c, c], classic Gaussian sigma (Wu eq. 7)"),
        PerturbationSpec("ldpsign", UPDATE, ("clip", "delta", "sensitivity"),
                         "randomized sign of the update (Wu eqs. 6-7), sign aggregation (eqs. 10/13/16)"),
        PerturbationSpec("pdpm", PARAMETERS, ("ranges",),
                         "PLDP-FL PDPM over each client's safe range tau_i = [c_i - L_i/2, c_i + L_i/2]"),
        PerturbationSpec("fedaw-gaussian", UPDATE, ("delta", "sensitivity"),
                         "L2 clip of the update to S_f/2, Gaussian noise (DP-FedAW eq. 9)"),
    )
}


def perturbation_names() -> list[str]:
    """The names ``--perturbation`` accepts (a subset of the mechanism registry)."""
    return list(PERTURBATIONS)


def perturbation_spec(name: str) -> PerturbationSpec:
    try:
        return PERTURBATIONS[name]
    except KeyError:
        raise ValueError(f"unknown perturbation {name!r}; valid names: {', '.join(PERTURBATIONS)}") from None


def resolve_target(name: str, requested: str = AUTO, sign_mode: str = SIGN_UPDATE) -> str:
    """The vector a mechanism perturbs: ``parameters`` or ``update`` (see the module table)."""
    spec = perturbation_spec(name)
    if requested not in TARGETS:
        raise ValueError(f"perturbation target must be one of {', '.join(TARGETS)}, got {requested!r}")
    if sign_mode not in SIGN_MODES:
        raise ValueError(f"sign mode must be one of {', '.join(SIGN_MODES)}, got {sign_mode!r}")
    if name == "ldpsign":
        implied = UPDATE if sign_mode == SIGN_UPDATE else PARAMETERS
        if requested not in (AUTO, implied):
            raise ValueError(f"ldpsign with sign mode {sign_mode!r} perturbs the {implied}; "
                             f"perturbation target {requested!r} contradicts it")
        return implied
    return spec.default_target if requested == AUTO else requested


# --------------------------------------------------------------------------------------------------
# Noise scale σ_i of each mechanism, for WU eqs. 11 and 14 (ρ_i = 1/σ_i).


def noise_scale(mechanism: Any) -> float | None:
    """σ_i of a mechanism for the weighted and probability aggregations; None when it adds no noise.

    Gaussian mechanisms and ldpsign: their σ (eq. 4 or eq. 7 / DP-FedAW Theorem 1). PDPM: the standard
    deviation implied by its variance bound (``pdpm_variance_bound``).
    """
    if mechanism.NAME == "none":
        return None
    if mechanism.NAME == "pdpm":
        return math.sqrt(pdpm_variance_bound(mechanism.epsilon, mechanism.safe_range_length))
    sigma = getattr(mechanism, "sigma", None)
    return None if sigma is None else float(sigma)


# --------------------------------------------------------------------------------------------------
# One perturbation per client.


@dataclass(frozen=True)
class ClientPerturbation:
    """Client ``client``'s mechanism, the vector it perturbs, and its noise scale."""

    client: int
    mechanism: Any
    target: str

    @property
    def noise_scale(self) -> float | None:
        return noise_scale(self.mechanism)

    @property
    def epsilon(self) -> float | None:
        return getattr(self.mechanism, "epsilon", None)

    def perturb(self, local: np.ndarray, global_vector: np.ndarray, *, rng: np.random.Generator) -> np.ndarray:
        """The upload: M(local) or M(local − global), drawn from the client's own Generator."""
        require_generator(rng)
        vector = local - global_vector if self.target == UPDATE else local
        return self.mechanism.randomize(vector, rng=rng)

    def report(self, randomness_mode: str) -> dict[str, Any]:
        """The mechanism's privacy report (``PrivacyReport.to_dict``), plus the client and the target."""
        report = self.mechanism.report().with_randomness(randomness_mode).to_dict()
        report.update(client=self.client, target=self.target, noise_scale=self.noise_scale,
                      release="one upload per round the client is selected; composition over rounds is not "
                              "included")
        return report


def build_client_perturbations(
    name: str, *, dim: int, epsilons: Sequence[float], target: str,
    ranges: Sequence[float] | None = None, centres: Sequence[float] | None = None,
    train_sizes: Sequence[int] | None = None, clip: float | None = None, delta: float | str | None = None,
    sensitivity: float | None = None, sample_rate: float | None = None, rounds: int | None = None,
) -> list[ClientPerturbation]:
    """One mechanism per client, with its own ε_i (and L_i, c_i for PDPM), ``dim`` = model parameters.

    ``delta`` may be a number, None (the mechanism's default) or ``"1/n"``: δ_i = 1/|D_i| per client
    (WU 3.1: "δ_i = 1/|D_i|", from ``train_sizes``). Options the mechanism does not take raise
    ``ValueError`` naming them.
    """
    spec = perturbation_spec(name)
    count = len(epsilons)
    given = {"clip": clip, "delta": delta, "sensitivity": sensitivity, "sample_rate": sample_rate}
    refused = ["--" + k.replace("_", "-") for k, v in given.items() if v is not None and k not in spec.options]
    if name != "pdpm" and (ranges is not None or centres is not None):
        refused.append("--client-ranges/--client-centres")
    if refused:
        accepted = ", ".join("--" + o.replace("_", "-") for o in spec.options if o != "ranges")
        raise ValueError(f"perturbation {name!r} takes no {', '.join(refused)}; it takes "
                         f"{accepted or 'no such options'}")
    if target not in (PARAMETERS, UPDATE):
        raise ValueError(f"target must be {PARAMETERS!r} or {UPDATE!r}, got {target!r}")
    for what, values in (("ranges", ranges), ("centres", centres), ("train sizes", train_sizes)):
        if values is not None and len(values) != count:
            raise ValueError(f"{what} list has {len(values)} values but there are {count} clients")
    out = []
    for i, epsilon in enumerate(epsilons):
        params: dict[str, Any] = {}
        if name != "none":
            params.update(epsilon=float(epsilon), dim=int(dim))
        if clip is not None:
            params["clip"] = float(clip)
        if delta is not None:
            params["delta"] = _client_delta(delta, None if train_sizes is None else train_sizes[i])
        if sample_rate is not None:
            params["sample_rate"] = float(sample_rate)
        if sensitivity is not None:
            params["l2_sensitivity" if name == "ldpsign" else "sensitivity"] = float(sensitivity)
        if name == "gaussian-wu" and rounds is not None:
            params["rounds"] = int(rounds)  # R of eq. 4 is the number of federation rounds
        if name == "pdpm":
            if ranges is not None:
                params["safe_range_length"] = float(ranges[i])
            if centres is not None:
                params["center"] = float(centres[i])
        out.append(ClientPerturbation(i, mech.create_mechanism(name, **params), target))
    return out


def _client_delta(delta: float | str, train_size: int | None) -> float:
    if isinstance(delta, str):
        if delta != "1/n":
            raise ValueError(f"delta must be a number in (0, 1) or '1/n' (1/|D_i| per client), got {delta!r}")
        if train_size is None or train_size < 2:
            raise ValueError(f"delta '1/n' needs a training split of at least 2 rows, got {train_size!r}")
        return 1.0 / float(train_size)
    return float(delta)


def noise_scales(perturbations: Sequence[ClientPerturbation]) -> list[float | None]:
    return [p.noise_scale for p in perturbations]


def describe(perturbations: Sequence[ClientPerturbation]) -> Mapping[str, Any]:
    """A short summary: mechanism, target, ε and σ per client."""
    return {
        "mechanism": perturbations[0].mechanism.NAME if perturbations else None,
        "target": perturbations[0].target if perturbations else None,
        "epsilons": [p.epsilon for p in perturbations],
        "noise_scales": noise_scales(perturbations),
    }
