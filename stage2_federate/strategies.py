"""Aggregation strategies: one class per paper rule, a registry, and the sign wrapper.

Each round (as Flower's ``configure_fit`` / ``aggregate_fit``) a strategy does two things: ``select``, which
clients train (k of N at random, or γ·N for PLDP-FL), and ``aggregate``, which combines the uploads that reached
the server into one vector, with the weights used. The math lives in ``aggregation`` as pure functions;
strategies only choose the weights and the clients. Sign aggregation for ldpsign (WU eqs. 10, 13, 16) *wraps*
whichever strategy is chosen, as Flower adds DP by wrapping: it takes the inner strategy's combination and
returns its sign.

Robust aggregation (issue 31) is a strategy like the papers': ``median`` (coordinate-wise median), ``trimmed-mean``
(coordinate-wise β-trimmed mean) and ``norm-clipped`` (each update clipped on the server, then the mean). Every strategy
only ever sees uploads the server checked (``reply_checks``: finite, of the model's shape, within the update-norm
bound), and ``max_client_weight`` caps any client's normalized weight in the weighted means (the excess is shared by the
others, ``aggregation.cap_weights``). Each robust rule returns which silos it discounted or clipped, by how much
(``Aggregate.outliers``, issue 42); a rule that cannot act at the run's clients per round is refused (``rule_checks``).
Registry keys are the CLI's ``--aggregation`` choices.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

import numpy as np

from ldpfl import mechanisms as mech
from ldpfl.common.errors import ParameterError
from ldpfl.common.registry import Registry
from ldpfl.mechanisms.base import PARAMETERS, require_generator

from . import aggregation as agg
from . import outliers as out
from . import rule_checks as checks

if TYPE_CHECKING:  # config imports this module, and the description's fields import config
    from .client_description import ClientDescription

NoiseScales = Mapping[int, float | None]  # by client index: σ_i, the noise scale of its perturbation (None: no noise)


@dataclass(frozen=True)
class StrategyOptions:
    """Options of the strategies; each strategy refuses the ones it does not use."""

    clients_per_round: int | None = None  # k of N (None: all N)
    sample_weighted: bool = False  # fedavg: n_k/n weights (FEDAW eq. 2)
    fraction: float | None = None  # fraction: γ
    max_client_weight: float | None = None  # a cap on any client's normalized weight (None: no cap)
    trim_fraction: float | None = None  # trimmed-mean: β dropped at each end (None: DEFAULT_TRIM_FRACTION)
    target: str = PARAMETERS  # what the uploads are (parameters, or updates local − global): norm-clipped
    outlier_report: bool = False  # the non-robust rules: each upload's distance from the round's median (outliers)


@dataclass(frozen=True)
class Aggregate:
    """A round's combination: ``vector`` is None when no upload was used (keep the previous model)."""

    vector: np.ndarray | None
    used: tuple[int, ...]
    weights: tuple[float, ...]  # normalized weight of each used client, same order as ``used``
    info: Mapping[str, Any] = field(default_factory=dict)
    outliers: out.OutlierReport | None = None  # which silos the rule discounted or clipped, by how much (outliers)


def _nothing(info: Mapping[str, Any] | None = None) -> Aggregate:
    return Aggregate(None, (), (), dict(info or {}))


class Strategy:
    """Base: k-of-N selection, and a weighted mean whose weights subclasses choose."""

    NAME: ClassVar[str] = ""
    SOURCE: ClassVar[str] = ""
    SUMMARY: ClassVar[str] = ""
    upload_noise: Mapping[int, float] | None = None  # each silo's training noise s_i: names by it (outliers)
    upload_signal: float | None = None  # the bound B on an honest upload's gradient part (outliers)

    def __init__(self, clients: Sequence[ClientDescription], options: StrategyOptions = StrategyOptions(),
                 noise_scales: NoiseScales | None = None):
        if not clients:
            raise ValueError("a strategy needs at least one client, got none")
        self.clients = {c.index: c for c in clients}
        self.noise_scales = dict(noise_scales or {})
        self.options = options
        self.client_ids = sorted(self.clients)
        self._check_options(options)
        self.clients_per_round = self._clients_per_round(options)

    # -- options -------------------------------------------------------------------------------------
    def _check_options(self, options: StrategyOptions) -> None:
        if options.sample_weighted:
            raise _only_for("sample_weighted", "fedavg", self.NAME)
        if options.fraction is not None:
            raise _only_for("fraction", "fraction", self.NAME)

    def _clients_per_round(self, options: StrategyOptions) -> int:
        n = len(self.client_ids)
        k = n if options.clients_per_round is None else options.clients_per_round
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
            raise ValueError(f"clients per round must be an integer in [1, {n}] (N = {n} clients), got {k!r}")
        return k

    # -- selection (LDPFL Algorithm 1 line 18: the n clients of the current round) --------------------
    def select(self, round_number: int, rng: np.random.Generator) -> list[int]:
        """Select k of the N clients, uniformly without replacement (all N, without a draw, when k = N)."""
        require_generator(rng)
        k = self.clients_per_round
        if k == len(self.client_ids):
            return list(self.client_ids)
        chosen = rng.choice(len(self.client_ids), size=k, replace=False)
        return sorted(self.client_ids[i] for i in chosen)

    # -- aggregation ---------------------------------------------------------------------------------
    def weights(self, clients: Sequence[int]) -> np.ndarray:
        """Return the unnormalized weight of each client in ``clients`` (equal by default)."""
        return np.ones(len(clients))

    def aggregate(self, global_vector: np.ndarray, uploads: Mapping[int, np.ndarray], *,
                  rng: np.random.Generator) -> Aggregate:
        """Average the uploads with the strategy's weights (all of them, unless a subclass selects)."""
        clients = sorted(uploads)
        if not clients:
            return _nothing()
        w = self.capped(self.weights(clients))
        vector = agg.weighted_average([uploads[c] for c in clients], w)
        return Aggregate(vector, tuple(clients), tuple(w.tolist()), outliers=self.outlier_report(clients, uploads))

    def outlier_report(self, clients: Sequence[int], uploads: Mapping[int, np.ndarray]) -> out.OutlierReport | None:
        """Return the outlier report of ``clients``' uploads when ``outlier_report`` is set (``outliers``)."""
        if not self.options.outlier_report:
            return None
        return out.report(clients, [uploads[c] for c in clients], None, out.FLAGGED, **self.noise_facts)

    @property
    def noise_facts(self) -> dict[str, Any]:
        """What a report names by: each silo's training noise and label histogram, the signal bound (``outliers``)."""
        mixes = {c: description.label_histogram for c, description in self.clients.items()}
        return {"noise_scales": self.upload_noise, "label_mixes": mixes, "signal_bound": self.upload_signal}

    def capped(self, weights: np.ndarray) -> np.ndarray:
        """Return ``weights`` normalized, none above ``max_client_weight`` (``aggregation.cap_weights``)."""
        w = np.asarray(weights, dtype=np.float64)
        cap = self.options.max_client_weight
        return w / w.sum() if cap is None else agg.cap_weights(w, cap)

    def describe(self) -> dict[str, Any]:
        """Describe the strategy for ``config.json``."""
        described = {"name": self.NAME, "source": self.SOURCE, "clients_per_round": self.clients_per_round}
        if self.options.max_client_weight is not None:
            described["max_client_weight"] = self.options.max_client_weight
        return described


STRATEGIES: Registry[type[Strategy]] = Registry("aggregation")
S = TypeVar("S", bound=type[Strategy])


def register(cls: S) -> S:
    """Class decorator: add a strategy under its NAME; a second registration of a name fails."""
    STRATEGIES.add(cls.NAME, cls)
    return cls


def strategy_names() -> list[str]:
    """Return the registered strategies (``aggregation`` choices), in registration order."""
    return STRATEGIES.names()


def strategy_class(name: str) -> type[Strategy]:
    """Return the strategy registered as ``name``; an unknown name lists the valid ones."""
    return STRATEGIES.get(name)


def create_strategy(name: str, clients: Sequence[ClientDescription], options: StrategyOptions = StrategyOptions(),
                    noise_scales: NoiseScales | None = None) -> Strategy:
    """Build strategy ``name`` over ``clients``, whose perturbations add noise of ``noise_scales``' σ_i."""
    return strategy_class(name)(clients, options, noise_scales)


@register
class FedAvg(Strategy):
    """Plain mean of the uploads (LDPFL eq. 1 / Algorithm 1 line 21); ``sample_weighted``: n_k/n (FEDAW eq. 2)."""

    NAME = "fedavg"
    SOURCE = "LDPFL Algorithm 1 line 21; DP-FedAW eq. 2 with --sample-weighted"
    SUMMARY = "mean of the uploads (n_k/n weights with --sample-weighted)"

    def _check_options(self, options: StrategyOptions) -> None:
        if options.fraction is not None:
            raise _only_for("fraction", "fraction", self.NAME)

    def weights(self, clients: Sequence[int]) -> np.ndarray:
        """Weigh clients equally, or by n_k (``sample_weighted``)."""
        if self.options.sample_weighted:
            return agg.sample_size_weights([self.clients[c].train_rows for c in clients])
        return np.ones(len(clients))


def _only_for(option: str, aggregation: str, name: str) -> ParameterError:
    return ParameterError(f"`{option}` applies to aggregation {aggregation!r} only, not {name!r}")


def _require_noise_scales(strategy: Strategy) -> dict[int, float]:
    scales = {i: strategy.noise_scales.get(i) for i in strategy.client_ids}
    if missing := [i for i, s in scales.items() if s is None]:
        noisy = [n for n in mech.federation_names()
                 if (wiring := mech.mechanism_class(n).FEDERATION) is not None and wiring.budget]
        raise ParameterError(f"aggregation {strategy.NAME!r} weighs client i by 1/σ_i (Wu eqs. 11/14), which needs "
                             f"a noise scale per client; the perturbation of clients {missing} adds no noise "
                             f"(perturbation 'none'?). Use `perturbation` {', '.join(noisy)}, or `aggregation` fedavg")
    return {i: float(s) for i, s in scales.items() if s is not None}


@register
class WeightedAverage(Strategy):
    """WU method B (eqs. 11-13): α_i = ρ_i / Σρ with ρ_i = 1/σ_i, W = Σ α_i G̃_i / Σ α_i."""

    NAME = "weighted"
    SOURCE = "Wu et al. 4.1, eqs. 11-13"
    SUMMARY = "weights alpha_i proportional to 1/sigma_i of each client's perturbation"

    def __init__(self, clients: Sequence[ClientDescription], options: StrategyOptions = StrategyOptions(),
                 noise_scales: NoiseScales | None = None):
        super().__init__(clients, options, noise_scales)
        self.sigmas = _require_noise_scales(self)

    def weights(self, clients: Sequence[int]) -> np.ndarray:
        """Weigh client i by ρ_i = 1/σ_i (eq. 11), renormalized over the received clients."""
        return agg.inverse_sigma_weights([self.sigmas[c] for c in clients])  # eq. 11 over the received clients


@register
class ProbabilitySelection(Strategy):
    """WU method C (eqs. 14-16): the received clients with P_i > ω are averaged.

    P_i = ρ_i / Σρ over all N clients is fixed before training; each round a uniform ω is drawn.

    Decision: ω is drawn uniformly on [0, max P_i) over the received clients, which is the same as
    redrawing ω ~ U[0, 1] until at least one received client is selected (``aggregation.draw_omega``).
    """

    NAME = "probability"
    SOURCE = "Wu et al. 4.2, eqs. 14-16"
    SUMMARY = "clients with P_i > omega are averaged; omega redrawn until someone is selected"

    def __init__(self, clients: Sequence[ClientDescription], options: StrategyOptions = StrategyOptions(),
                 noise_scales: NoiseScales | None = None):
        super().__init__(clients, options, noise_scales)
        sigmas = _require_noise_scales(self)
        p = agg.inverse_sigma_weights([sigmas[c] for c in self.client_ids])  # eq. 14
        self.probabilities = dict(zip(self.client_ids, p.tolist(), strict=True))

    def aggregate(self, global_vector: np.ndarray, uploads: Mapping[int, np.ndarray], *,
                  rng: np.random.Generator) -> Aggregate:
        """Draw ω and average the received clients with P_i > ω (eq. 15)."""
        clients = sorted(uploads)
        if not clients:
            return _nothing()
        p = np.array([self.probabilities[c] for c in clients])
        omega = agg.draw_omega(p, rng)
        chosen = [c for c, keep in zip(clients, agg.probability_selection_mask(p, omega), strict=True) if keep]
        vector = agg.mean([uploads[c] for c in chosen])  # eq. 15
        return Aggregate(vector, tuple(chosen), tuple([1.0 / len(chosen)] * len(chosen)), {"omega": omega},
                         self.outlier_report(clients, uploads))


@register
class FractionSelection(Strategy):
    """PLDP-FL Algorithm 1: γ·N random clients per round (line 4), their uploads' plain mean (line 8, eq. 7)."""

    NAME = "fraction"
    SOURCE = "PLDP-FL Algorithm 1 lines 4 and 8, eq. 7"
    SUMMARY = "gamma*N random clients per round (--fraction), plain mean"

    def _check_options(self, options: StrategyOptions) -> None:
        if options.sample_weighted:
            raise _only_for("sample_weighted", "fedavg", self.NAME)
        if options.fraction is None:
            raise ParameterError("aggregation 'fraction' needs `fraction` γ in (0, 1]")
        if options.clients_per_round is not None:
            raise ParameterError("aggregation 'fraction' selects γ·N clients; give `fraction`, not "
                                 "`clients_per_round`")

    def _clients_per_round(self, options: StrategyOptions) -> int:
        return agg.fraction_count(cast(float, options.fraction), len(self.client_ids))  # None refused above

    def describe(self) -> dict[str, Any]:
        """Describe the strategy, with γ."""
        return {**super().describe(), "fraction": self.options.fraction}


@register
class FedAW(Strategy):
    """DP-FedAW eqs. 7-10: g_k = cos(label distribution of client k, uniform); W = Σ g_k w_k / Σ g_k.

    The label distribution is the training split's label histogram recorded in the client's file.
    """

    NAME = "fedaw"
    SOURCE = "DP-FedAW eqs. 7, 8, 10"
    SUMMARY = "weights g_k: cosine similarity of client k's label distribution with the uniform one"

    def __init__(self, clients: Sequence[ClientDescription], options: StrategyOptions = StrategyOptions(),
                 noise_scales: NoiseScales | None = None):
        super().__init__(clients, options, noise_scales)
        g = agg.label_similarity_weights([self.clients[c].label_histogram for c in self.client_ids])
        self.similarities = dict(zip(self.client_ids, g.tolist(), strict=True))

    def weights(self, clients: Sequence[int]) -> np.ndarray:
        """Weigh client k by g_k (eq. 8)."""
        return np.array([self.similarities[c] for c in clients])


MEDIAN = "median"
TRIMMED_MEAN = "trimmed-mean"
NORM_CLIPPED = "norm-clipped"
DEFAULT_TRIM_FRACTION = 0.2
"""β of ``trimmed-mean`` when ``trim_fraction`` is not given (Flower's FedTrimmedAvg default)."""


class CoordinateWise(Strategy):
    """A robust rule that counts every client equally and combines the uploads coordinate by coordinate.

    It keeps, in every coordinate, the values between the k-th smallest and the k-th largest (:meth:`trimmed`), and
    reports each silo's share of dropped values (``outliers.kept_discounts``).
    """

    def _check_options(self, options: StrategyOptions) -> None:
        super()._check_options(options)
        checks.refuse_outlier_report(self.NAME, options.outlier_report)

    def _clients_per_round(self, options: StrategyOptions) -> int:
        k = super()._clients_per_round(options)
        self._check_acts(k)
        return k

    def _check_acts(self, clients: int) -> None:
        """Refuse a rule that drops no value at ``clients`` clients per round (it would be the plain mean)."""
        checks.check_coordinate_rule(self.NAME, clients)

    def trimmed(self, clients: int) -> int:  # pragma: no cover - each rule defines it
        """Return how many values the rule drops at each end of a coordinate with ``clients`` uploads."""
        raise NotImplementedError

    def combine(self, rows: list[np.ndarray]) -> np.ndarray:  # pragma: no cover - each rule defines it
        """Return the combination of the clients' uploads (one row each)."""
        raise NotImplementedError

    def details(self, clients: int) -> dict[str, Any]:
        """Return what the round's record says of the combination (``Aggregate.info``)."""
        return {}

    def aggregate(self, global_vector: np.ndarray, uploads: Mapping[int, np.ndarray], *,
                  rng: np.random.Generator) -> Aggregate:
        """Return :meth:`combine` of the uploads; every client counts equally (weights 1/n, nominal)."""
        clients = sorted(uploads)
        if not clients:
            return _nothing()
        rows = [uploads[c] for c in clients]
        vector = self.combine(rows)
        report = out.report(clients, rows, out.kept_discounts(rows, self.trimmed(len(clients))), out.DISCOUNTED,
                            **self.noise_facts)
        return Aggregate(vector, tuple(clients), tuple([1.0 / len(clients)] * len(clients)),
                         self.details(len(clients)), report)


@register
class CoordinateMedian(CoordinateWise):
    """Coordinate-wise median of the uploads (Yin et al. 2018, Option II): robust to fewer than half bad clients."""

    NAME = MEDIAN
    SOURCE = "Yin et al. 2018 (ICML), coordinate-wise median; Flower's FedMedian"
    SUMMARY = "coordinate-wise median of the uploads (robust)"

    def trimmed(self, clients: int) -> int:
        """Return ⌊(n − 1)/2⌋: the median keeps the middle value (the two middle ones for an even n)."""
        return (clients - 1) // 2

    def combine(self, rows: list[np.ndarray]) -> np.ndarray:
        """Return the coordinate-wise median."""
        return agg.coordinate_median(rows)


@register
class TrimmedMean(CoordinateWise):
    """Coordinate-wise β-trimmed mean (Yin et al. 2018, Option I): ⌊β·n⌋ values dropped at each end."""

    NAME = TRIMMED_MEAN
    SOURCE = "Yin et al. 2018 (ICML), coordinate-wise trimmed mean; Flower's FedTrimmedAvg"
    SUMMARY = "coordinate-wise mean without the floor(beta*n) largest and smallest values (--trim-fraction)"

    @property
    def fraction(self) -> float:
        """β, the fraction dropped at each end of a coordinate."""
        beta = self.options.trim_fraction
        return DEFAULT_TRIM_FRACTION if beta is None else float(beta)

    def _check_acts(self, clients: int) -> None:
        """Refuse a β that trims no silo at ``clients`` per round, naming the smallest β that trims one."""
        super()._check_acts(clients)
        checks.check_trim_fraction(self.fraction, clients)

    def trimmed(self, clients: int) -> int:
        """Return ⌊β·n⌋ (at most ⌊(n − 1)/2⌋)."""
        return agg.trim_count(self.fraction, clients)

    def combine(self, rows: list[np.ndarray]) -> np.ndarray:
        """Return the β-trimmed mean."""
        return agg.trimmed_mean(rows, self.fraction)

    def details(self, clients: int) -> dict[str, Any]:
        """Return how many values were dropped at each end."""
        return {"trimmed": agg.trim_count(self.fraction, clients)}

    def describe(self) -> dict[str, Any]:
        """Describe the strategy, with β."""
        return {**super().describe(), "trim_fraction": self.fraction}


@register
class NormClippedMean(Strategy):
    """Server-side norm bounding (Sun et al. 2019): each update clipped to the round's median norm, then the mean.

    The update is ``upload - global`` for uploaded parameters (the upload itself for uploaded updates); the
    mean of the clipped updates is added back to the global model for a parameters target. The bound is the
    lower median of the round's update norms, so no client moves the model further than a typical one.
    Clipping is post-processing: it keeps any DP guarantee of the uploads (a record-level one included).
    Each silo's discount is the fraction of its update the clipping took away (``outliers``).
    """

    NAME = NORM_CLIPPED
    SOURCE = "Sun et al. 2019, norm bounding; DP-FedAvg's server clipping (McMahan et al. 2018)"
    SUMMARY = "each update clipped to the round's median update norm, then the mean"

    def _check_options(self, options: StrategyOptions) -> None:
        super()._check_options(options)
        checks.refuse_outlier_report(self.NAME, options.outlier_report)

    def _clients_per_round(self, options: StrategyOptions) -> int:
        k = super()._clients_per_round(options)
        checks.check_clipping(self.NAME, k)
        return k

    def aggregate(self, global_vector: np.ndarray, uploads: Mapping[int, np.ndarray], *,
                  rng: np.random.Generator) -> Aggregate:
        """Clip every client's update to the round's lower-median norm and return the (capped) mean."""
        clients = sorted(uploads)
        if not clients:
            return _nothing()
        reference = np.asarray(global_vector, dtype=np.float64) if self.options.target == PARAMETERS else 0.0
        updates = [np.asarray(uploads[c], dtype=np.float64) - reference for c in clients]
        w = self.capped(np.ones(len(clients)))
        mean_update, bound = agg.norm_clipped_mean(updates, w)
        dtype = np.asarray(uploads[clients[0]]).dtype
        vector = (mean_update + reference).astype(dtype if np.issubdtype(dtype, np.floating) else np.float64)
        norms = np.linalg.norm(np.stack(updates), axis=1)
        taken = np.where(norms > bound, 1.0 - bound / np.maximum(norms, 1e-300), 0.0)
        report = out.report(clients, updates, taken, out.CLIPPED, **self.noise_facts)
        return Aggregate(vector, tuple(clients), tuple(w.tolist()), {"clip_norm": bound}, report)


class SignAggregation(Strategy):
    """Wrapper for ldpsign uploads (WU eqs. 10, 13, 16): sign of the inner strategy's combination.

    fedavg gives eq. 10, weighted eq. 13, probability eq. 16; fraction and fedaw get the same treatment.
    What the server does with the sign (set the model to it, or step along it) is the federation's
    choice of sign mode; see ``perturbation``.
    """

    NAME = "sign"
    SOURCE = "Wu et al. eqs. 9, 10, 13, 16"
    SUMMARY = "sign of the wrapped strategy's combination"

    def __init__(self, inner: Strategy):  # no super().__init__(): the state lives in ``inner``
        self.inner = inner
        self.clients = inner.clients
        self.noise_scales = inner.noise_scales
        self.options = inner.options
        self.client_ids = inner.client_ids
        self.clients_per_round = inner.clients_per_round

    def select(self, round_number: int, rng: np.random.Generator) -> list[int]:
        """Select as the inner strategy does."""
        return self.inner.select(round_number, rng)

    def aggregate(self, global_vector: np.ndarray, uploads: Mapping[int, np.ndarray], *,
                  rng: np.random.Generator) -> Aggregate:
        """Return the sign of the inner strategy's combination (eq. 9 over eqs. 10, 13, 16)."""
        inner = self.inner.aggregate(global_vector, uploads, rng=rng)
        if inner.vector is None:
            return inner
        return Aggregate(agg.sign(inner.vector), inner.used, inner.weights, {**inner.info, "signed": True},
                         inner.outliers)

    def describe(self) -> dict[str, Any]:
        """Describe the inner strategy, marked as signed."""
        return {**self.inner.describe(), "sign": True}
