"""The one accountant: typed DP events composed by dp-accounting's privacy-loss-distribution (PLD) accountant.

Every part the project releases is described by a small frozen event (as dp-accounting's ``dp_event`` does;
the events are defined in :mod:`ldpfl.mechanisms.privacy_events`, the package's one vocabulary of them), and
:func:`epsilon` composes any sequence of them under one neighbouring relation:

* :class:`DpSgdEvent`: T steps of DP-SGD (Abadi et al. 2016, Algorithm 1): each step uses a record with
  probability q (Poisson sampling), clips every per-record gradient to L2 norm C and adds N(0, σ²C²) noise to
  their sum: ``SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(σ)), T)``;
* :class:`GaussianEvent`: k releases of the Gaussian mechanism with noise multiplier σ/Δ₂, no sampling;
* :class:`RandomizedResponseEvent`: k-ary randomized response at ε (the labels, a predicted class);
* :class:`PureEvent`: any other pure ε-DP part, accounted as binary randomized response at ε, which dominates
  every ε-DP mechanism (Kairouz, Oh, Viswanath 2015, Theorem 4);
* :class:`ZcdpEvent`: a ρ-zCDP part (the discrete Gaussian, Canonne, Kamath, Steinke 2020), RDP only.

Two methods (``method``): dp-accounting's PLD accountant (the default: tight, with a pessimistic discretization)
and its RDP accountant (Mironov 2017; the ledger's default for the Gaussian perturbations of updates, and the
only one for zCDP parts), converted to (ε, δ) by dp-accounting's conversion (CKS 2020, Proposition 12).

Neighbouring relations (:data:`NEIGHBOURS`): ``replace-one`` (the project's convention, and local DP's: one
record replaced by any other, n public) and ``add-remove`` (one record added or removed: the DP-SGD
literature's, e.g. Abadi et al. 2016, Tramèr & Boneh 2021). A replacement is a removal and an addition, so a
figure under replace-one is larger (at most twice, at a larger δ); the PLD accountant computes each directly.
Randomized response is defined under replace-one only (a removed record's own release is simply absent):
:func:`epsilon` refuses it under add/remove.

Gaussian releases alone (one :class:`GaussianEvent`, under PLD) are computed exactly instead: k releases at noise
multiplier σ are one Gaussian at σ/√k (Dong, Roth & Su 2019, Corollary 3.3, as dp-accounting's PLD accountant
composes them), whose δ(ε) is the analytic Gaussian's (Balle & Wang 2018, Theorem 8: dp-accounting's
``GaussianPrivacyLoss``), inverted by dp-accounting's bisection to the smallest ε within 1e-9 above the true one.
The PLD accountant's discretized figure lies within 1e-5 (relative) above it and took up to a minute for small σ.

:func:`calibrate_noise_multiplier` finds the smallest σ whose T Poisson-sampled steps stay within a target ε
(dp-accounting's ``calibrate_dp_mechanism``, a bisection over the same accountant).

dp-accounting loads on first use (about 1 s); accountants are cached per event sequence (and each prefix of it) in
this process. :mod:`ldpfl.mechanisms.accounting_bounds` brackets the PLD figure in numpy alone, for checks that
must not wait for it (``ldpfl inspect``).
This module is the package's only composition code: stage 1, stage 2, the release guarantee and the mechanisms'
reports call it.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .privacy_events import DpSgdEvent, Event, GaussianEvent, PureEvent, RandomizedResponseEvent, ZcdpEvent
from .validation import require_finite_positive

if TYPE_CHECKING:
    from dp_accounting import DpEvent

REPLACE_ONE = "replace-one"
ADD_REMOVE = "add-remove"
NEIGHBOURS = (REPLACE_ONE, ADD_REMOVE)
NEIGHBOURS_TEXT = {REPLACE_ONE: "replace one record (its values and its label) by any other; n is public",
                   ADD_REMOVE: "add or remove one record"}
PLD = "pld"
RDP = "rdp"
METHODS = (PLD, RDP)
METHOD_NAMES = {PLD: "dp-accounting PLD", RDP: "dp-accounting RDP"}
"""How a figure's ``method`` names each accountant (the one spelling)."""
METHOD = METHOD_NAMES[PLD]
"""The default method's name."""
METHOD_BASIC = "basic composition"
"""The ``method`` of a figure composed by :func:`basic_composition`."""
LIBRARY_RELATIONS = {REPLACE_ONE: "REPLACE_ONE", ADD_REMOVE: "ADD_OR_REMOVE_ONE"}
"""dp-accounting's name of each neighbouring relation (``NeighboringRelation``)."""
VALUE_DISCRETIZATION = 1e-4
"""dp-accounting's default PLD discretization (a pessimistic rounding: the ε it reports is an upper bound)."""
MAX_NOISE_MULTIPLIER = 1e4




def method_name(method: str, *, neighbours: str | None = None) -> str:
    """Return how a figure names ``method`` (:data:`METHOD_NAMES`), with dp-accounting's relation when given.

    ``method_name(PLD, neighbours=REPLACE_ONE)`` is ``"dp-accounting PLD (REPLACE_ONE)"``.
    """
    if method not in METHOD_NAMES:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    name = METHOD_NAMES[method]
    return name if neighbours is None else f"{name} ({LIBRARY_RELATIONS[require_neighbours(neighbours)]})"


def require_neighbours(neighbours: str) -> str:
    """Return ``neighbours`` when it is one of :data:`NEIGHBOURS`, else raise ``ValueError`` listing them."""
    if neighbours not in NEIGHBOURS:
        raise ValueError(f"neighbours must be one of {', '.join(NEIGHBOURS)}, got {neighbours!r}")
    return neighbours


def _library_event(event: Event) -> DpEvent:
    import dp_accounting

    if isinstance(event, DpSgdEvent):
        step = dp_accounting.PoissonSampledDpEvent(event.sampling_probability,
                                                   dp_accounting.GaussianDpEvent(event.noise_multiplier))
        return dp_accounting.SelfComposedDpEvent(step, event.steps)
    if isinstance(event, GaussianEvent):
        return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(event.noise_multiplier), event.count)
    if isinstance(event, RandomizedResponseEvent):  # keep the truth w.p. (1 − p) + p/k: p = k/(e^ε + k − 1)
        k = event.categories
        return dp_accounting.RandomizedResponseDpEvent(k / (math.exp(event.epsilon) + k - 1), k)
    if isinstance(event, PureEvent):
        return dp_accounting.RandomizedResponseDpEvent(2 / (math.exp(event.epsilon) + 1), 2)
    if isinstance(event, ZcdpEvent):
        return dp_accounting.ZCDpEvent(event.rho)
    raise TypeError(f"not an accounting event: {type(event).__name__}")


def _accountant(neighbours: str, method: str = PLD) -> Any:
    import dp_accounting
    from dp_accounting import pld, rdp

    relation = (dp_accounting.NeighboringRelation.REPLACE_ONE if neighbours == REPLACE_ONE
                else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    if method == RDP:
        return rdp.RdpAccountant(neighboring_relation=relation)
    return pld.PLDAccountant(relation, value_discretization_interval=VALUE_DISCRETIZATION)


def _empty(event: Event) -> bool:
    """Return whether ``event`` releases nothing: no step, no Gaussian release, or a pure part at ε = 0."""
    return (isinstance(event, DpSgdEvent) and event.steps == 0 or isinstance(event, GaussianEvent) and not event.count
            or isinstance(event, PureEvent) and event.epsilon == 0)


def _open(events: tuple[Event, ...]) -> bool:
    """Return whether a pure part is not private (ε = ∞): then the composition promises nothing."""
    return any(isinstance(e, PureEvent) and math.isinf(e.epsilon) for e in events)


@functools.lru_cache(maxsize=512)
def _composed(events: tuple[Event, ...], neighbours: str, method: str) -> Any:
    """Return the accountant of ``events`` composed in order: its prefix's (memoised), copied, with the last added.

    A DP-SGD run composed alone and then with a file's other parts is composed once, as are identical runs.
    """
    if not events:
        return _accountant(neighbours, method)
    accountant = copy.deepcopy(_composed(events[:-1], neighbours, method))
    if not _empty(events[-1]):
        accountant.compose(_library_event(events[-1]))
    return accountant


def _checked(events: Iterable[Event], neighbours: str, method: str) -> tuple[Event, ...]:
    require_neighbours(neighbours)
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    events = tuple(events)
    if neighbours == ADD_REMOVE and any(isinstance(e, RandomizedResponseEvent | PureEvent) for e in events):
        raise ValueError("randomized response (a pure LDP part) has no add-remove figure: a removed record's own "
                         "release is absent, not randomized; use neighbours 'replace-one'")
    if method == PLD and any(isinstance(e, ZcdpEvent) for e in events):
        raise ValueError("a zCDP part is composed by the RDP accountant: use method 'rdp'")
    return events


def basic_composition(parts: Iterable[tuple[float, float]]) -> tuple[float, float]:
    """Return (ε, δ) of ``parts`` (ε, δ) composed by basic composition (Dwork & Roth 2014, Theorem 3.16): both add.

    A part at ε = ∞ makes the whole ∞ (δ 0: nothing is promised). Valid for any parts, adaptively; the PLD
    accountant (:func:`epsilon`) is tighter where it applies.
    """
    parts = tuple(parts)
    if any(not math.isfinite(eps) for eps, _ in parts):
        return math.inf, 0.0
    return math.fsum(eps for eps, _ in parts), math.fsum(d for _, d in parts)


def _gaussian_alone(events: tuple[Event, ...], method: str) -> GaussianEvent | None:
    """Return the one Gaussian event of ``events`` when it is all they release under PLD (exact path), else None."""
    parts = [e for e in events if not _empty(e)]
    return parts[0] if method == PLD and len(parts) == 1 and isinstance(parts[0], GaussianEvent) else None


def _gaussian_loss(event: GaussianEvent, neighbours: str) -> Any:
    """Return the analytic privacy loss of ``event``'s releases: one Gaussian of multiplier σ/√k (module doc)."""
    from dp_accounting.pld import privacy_loss_mechanism as mechanism

    adjacency = mechanism.AdjacencyType.REPLACE if neighbours == REPLACE_ONE else mechanism.AdjacencyType.REMOVE
    return mechanism.GaussianPrivacyLoss(event.noise_multiplier / math.sqrt(event.count), adjacency_type=adjacency)


def _gaussian_epsilon(event: GaussianEvent, delta: float, neighbours: str) -> float:
    """Return the smallest ε (to 1e-9, from above) whose δ(ε) of ``event`` is at most ``delta``."""
    from dp_accounting.pld import common

    loss = _gaussian_loss(event, neighbours)
    search = common.BinarySearchParameters(0.0, math.inf, initial_guess=1.0, tolerance=GAUSSIAN_TOLERANCE)
    found = common.inverse_monotone_function(loss.get_delta_for_epsilon, delta, search)
    return math.inf if found is None else float(found)


GAUSSIAN_TOLERANCE = 1e-9
"""Absolute tolerance of the exact Gaussian ε (:func:`_gaussian_epsilon`): at most this above the true ε."""


def epsilon(events: Iterable[Event], delta: float, *, neighbours: str = REPLACE_ONE, method: str = PLD) -> float:
    """Return ε at ``delta`` of all ``events`` composed (adaptively) under ``neighbours`` by ``method``.

    Raises
    ------
    ValueError
        A δ outside [0, 1), an unknown relation or method, randomized response under ``add-remove`` (undefined
        there), or a zCDP part under PLD.
    """
    events = _checked(events, neighbours, method)
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0.0 <= delta < 1.0:
        raise ValueError(f"delta must lie in [0, 1), got {delta!r}")
    if _open(events):
        return math.inf
    if all(_empty(e) for e in events):
        return 0.0
    gaussian = _gaussian_alone(events, method)
    if gaussian is not None:
        return _gaussian_epsilon(gaussian, float(delta), neighbours) if delta > 0 else math.inf
    return float(_composed(events, neighbours, method).get_epsilon(float(delta)))


def delta(events: Iterable[Event], epsilon: float, *, neighbours: str = REPLACE_ONE, method: str = PLD) -> float:
    """Return δ at ``epsilon`` of all ``events`` composed under ``neighbours`` by ``method`` (see :func:`epsilon`)."""
    events = _checked(events, neighbours, method)
    if _open(events):
        return 1.0
    if all(_empty(e) for e in events):
        return 0.0
    gaussian = _gaussian_alone(events, method)
    if gaussian is not None:
        return float(_gaussian_loss(gaussian, neighbours).get_delta_for_epsilon(float(epsilon)))
    return float(_composed(events, neighbours, method).get_delta(float(epsilon)))


def dp_sgd_epsilons(event: DpSgdEvent, delta: float) -> dict[str, float]:
    """Return ``{"replace-one": ε, "add-remove": ε}`` of one DP-SGD run at ``delta`` (both relations)."""
    return {relation: epsilon([event], delta, neighbours=relation) for relation in NEIGHBOURS}


@functools.lru_cache(maxsize=256)
def calibrate_gaussian(target_epsilon: float, delta: float) -> float:
    """Return the smallest noise multiplier σ/Δ₂ (to 1e-9 relative) of one Gaussian release within (ε, δ).

    The exact analytic Gaussian (Balle & Wang 2018, Theorem 8; dp-accounting's ``GaussianPrivacyLoss``): δ(ε)
    falls as σ grows, so dp-accounting's bisection inverts it. Δ₂ is the distance of the neighbouring inputs
    under whichever relation the caller states (the add/remove and replace-one curves of a Gaussian of
    sensitivity Δ₂ are the same: the caller scales Δ₂ per relation).
    """
    from dp_accounting.pld import common
    from dp_accounting.pld import privacy_loss_mechanism as mechanism

    require_finite_positive("target_epsilon", target_epsilon)
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0.0 < delta < 1.0:
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")

    def spent_delta(sigma: float) -> float:
        return float(mechanism.GaussianPrivacyLoss(sigma).get_delta_for_epsilon(float(target_epsilon)))

    search = common.BinarySearchParameters(1e-6, MAX_NOISE_MULTIPLIER, initial_guess=1.0, tolerance=1e-12)
    found = common.inverse_monotone_function(spent_delta, float(delta), search)
    if found is None:
        raise ValueError(f"target_epsilon {target_epsilon:g} at delta {delta:g} is out of reach of one Gaussian "
                         f"release (even noise multiplier {MAX_NOISE_MULTIPLIER:g} spends more)")
    return float(found)


@functools.lru_cache(maxsize=256)
def calibrate_noise_multiplier(target_epsilon: float, delta: float, sampling_probability: float, steps: int, *,
                               neighbours: str = REPLACE_ONE) -> float:
    """Return the smallest σ (to 0.1 %) whose T = ``steps`` Poisson-sampled DP-SGD steps are within ``target_epsilon``.

    Parameters
    ----------
    target_epsilon : float
        The ε the whole run may spend, > 0.
    delta : float
        δ in (0, 1).
    sampling_probability : float
        q, the Poisson rate of each step, in (0, 1].
    steps : int
        T >= 1, every step the run may take.
    neighbours : str
        ``replace-one`` or ``add-remove``: the relation the target is stated under.

    Raises
    ------
    ValueError
        A target no σ up to :data:`MAX_NOISE_MULTIPLIER` reaches, or a parameter out of range (named).
    """
    import dp_accounting

    require_finite_positive("target_epsilon", target_epsilon)
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
    DpSgdEvent(1.0, sampling_probability, steps)  # validates q and T
    require_neighbours(neighbours)
    if steps < 1:
        raise ValueError(f"steps must be >= 1 to calibrate, got {steps!r}")

    def event(sigma: float) -> DpEvent:
        return _library_event(DpSgdEvent(float(sigma), float(sampling_probability), int(steps)))

    def spent(sigma: float) -> float:
        return epsilon([DpSgdEvent(sigma, sampling_probability, steps)], delta, neighbours=neighbours)

    # A bracket [low, high] with spent(low) > target >= spent(high), by doubling from σ = 1 (small σ make the
    # PLD large and slow: the search never goes below half the smallest σ that overspends).
    if spent(MAX_NOISE_MULTIPLIER) > target_epsilon:
        raise ValueError(f"target_epsilon {target_epsilon:g} at delta {delta:g} is out of reach of {steps} steps at "
                         f"sampling rate {sampling_probability:g} (even sigma {MAX_NOISE_MULTIPLIER:g} spends more)")
    high = 1.0
    while spent(high) > target_epsilon:
        high *= 2.0
    low = high / 2.0
    while low > 0.05 and spent(low) <= target_epsilon:
        high, low = low, low / 2.0
    sigma = dp_accounting.calibrate_dp_mechanism(
        lambda: _accountant(neighbours), event, float(target_epsilon), float(delta),
        bracket_interval=dp_accounting.ExplicitBracketInterval(low, high), tol=1e-3 * low)
    return float(sigma)


__all__ = ["ADD_REMOVE", "LIBRARY_RELATIONS", "METHOD", "METHODS", "METHOD_BASIC", "METHOD_NAMES", "NEIGHBOURS",
           "NEIGHBOURS_TEXT", "PLD", "RDP", "REPLACE_ONE", "DpSgdEvent", "Event", "GaussianEvent", "PureEvent",
           "RandomizedResponseEvent", "ZcdpEvent", "basic_composition", "calibrate_gaussian",
           "calibrate_noise_multiplier", "delta", "dp_sgd_epsilons", "epsilon", "method_name", "require_neighbours"]
