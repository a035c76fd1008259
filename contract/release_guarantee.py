"""One per-record guarantee over everything a silo releases (issue 22 item 4).

A client file releases, for every record of the client: the values computed by its extractor and randomized by
the file's mechanism (features, bottleneck, scores or a predicted class), the record's label (in clear or
randomized by k-RR), and, through the extractor, something of every *other* record it was trained on. The
guarantee composes all of it for one record, under the neighbouring relation of local DP: **replace one record**
(its image and its label) by any other; the number of records n is the same in both, so row counts and shapes
are public under it. Parts:

* ``features``: the file's mechanism on the record's own values, ε_f per record (its exact report; pure ε-DP);
* ``labels``: the true label in clear (ε = ∞) or k-RR at exact ε_l (pure ε-DP);
* ``extractor``: how the released function depends on the record through training:

  - trained with DP-SGD (noise multiplier σ, Poisson rate q, T steps): the CNN is (ε, δ)-DP in the record, and
    every other record's release is post-processing of the CNN and of that record's own data;
  - trained without DP: one record changes the CNN and so the release of each of the other n − 1 records; each
    of those is ε_f-LDP whatever its input, so the only bound is group privacy, (n − 1)·ε_f (Dwork and Roth
    2014, Theorem 2.2), which with the record's own ε_f gives n·ε_f;
  - not trained (raw features): no part;
  - fixed by the software (the weight-free ``scatter``, recorded as ``{"training": "none", "fixed": {...}}``): a
    part of ε = 0 that says so: the function is the same whatever the records are, so a record changes no
    other record's release.
* ``re-release``: each earlier release of the same records (``--from-models``: the same extractor, counted once).

Composition (Dwork and Roth 2014, Theorem 3.16; adaptive composition holds for all of them): pure parts add. When
a DP-SGD part is present, everything is also composed with dp-accounting's PLD accountant under REPLACE_ONE:
the DP-SGD event as it ran (``PoissonSampledDpEvent`` of a ``GaussianDpEvent``, T times), each k-RR part (the
labels, and a predicted class released by ``krr``) as the ``RandomizedResponseDpEvent`` it is, and each other
pure ε part as binary randomized response at ε, which dominates every ε-DP mechanism (Kairouz, Oh, Viswanath
2015, Theorem 4). The guarantee is the smaller of the two valid figures, and ``method`` says which one it is.

This module imports numpy-level code only; dp-accounting loads when a DP-SGD part is composed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ldpfl.contract.extractor_training import UNTRAINED_EXTRACTORS, ExtractorTraining
from ldpfl.contract.label_release import CLEAR_LABELS, LabelRelease
from ldpfl.contract.release_history import ReleaseEntry
from ldpfl.contract.release_point import LABEL, STATS
from ldpfl.mechanisms import accounting
from ldpfl.mechanisms.privacy_events import (
    DpSgdEvent,
    Event,
    PartEvent,
    PureEvent,
    RandomizedResponseEvent,
    event_from_json,
)
from ldpfl.mechanisms.report import format_epsilon, json_number, number_from_json

if TYPE_CHECKING:  # the schema holds a file's guarantee: it imports this module
    from ldpfl.contract.schema import ClientMetadata

KRR_MECHANISM = "krr"

NEIGHBOURS = "replace one record (its values and its label); n is public"

FEATURES = "features"
LABELS = "labels"
EXTRACTOR = "extractor"
RE_RELEASE = "re-release"
DIAGNOSTIC = "diagnostic"

METHOD_BASIC = accounting.METHOD_BASIC
METHOD_PLD = accounting.method_name(accounting.PLD, neighbours=accounting.REPLACE_ONE)

PLD_MAX_PURE_EPSILON = 30.0
"""Pure parts above this ε are not given to the PLD accountant (randomized response at ε > 30 keeps the truth with
probability 1 − 1e-13: nothing to gain, and the discretization loses it); basic composition covers them."""

FIXED_TEXT = "fixed by the software, learned from no record"
"""Why a weight-free extractor's part is 0 (``scatter``)."""


@dataclass(frozen=True)
class GuaranteePart:
    """One value (or set of values) released about a record, with its own per-record (ε, δ).

    ``kind`` is one of ``features``, ``labels``, ``extractor``, ``re-release``, ``diagnostic``; ``covers`` says
    what it covers in words; ``event`` is what the accountant needs (:data:`PartEvent`; :func:`event_from_json`
    reads its JSON form).
    """

    kind: str
    covers: str
    mechanism: str
    epsilon: float
    delta: float = 0.0
    event: PartEvent = None

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form (an infinite ε as ``"inf"``)."""
        event = self.event
        return {"kind": self.kind, "covers": self.covers, "mechanism": self.mechanism,
                "epsilon": json_number(self.epsilon), "delta": self.delta,
                "event": {} if event is None else event.to_json()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GuaranteePart:
        """Read a part (``ValueError`` naming the key when it is malformed)."""
        epsilon = number_from_json(data.get("epsilon"), name="epsilon", optional=False)
        assert epsilon is not None
        delta = float(data.get("delta", 0.0))
        if not 0.0 <= delta < 1.0:
            raise ValueError(f"part delta must be in [0, 1), got {delta!r}")
        return cls(str(data["kind"]), str(data["covers"]), str(data["mechanism"]), epsilon, delta,
                   event_from_json(data.get("event", {})))


@dataclass(frozen=True)
class ReleaseGuarantee:
    """The per-record (ε, δ) over every part, how it was composed, and a one-sentence scope.

    The one writer of its JSON form is :meth:`to_dict`, the one reader :meth:`from_dict`.
    """

    epsilon: float
    delta: float
    parts: tuple[GuaranteePart, ...]
    scope: str
    method: str = METHOD_BASIC
    neighbours: str = NEIGHBOURS

    @property
    def private(self) -> bool:
        """True where the guarantee is finite."""
        return math.isfinite(self.epsilon)

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form written to files, manifests, ``metrics.json`` and ``inspect --json``."""
        return {"epsilon": json_number(self.epsilon), "delta": self.delta, "private": self.private,
                "method": self.method, "neighbours": self.neighbours, "scope": self.scope,
                "parts": [part.to_dict() for part in self.parts]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReleaseGuarantee:
        """Read a guarantee (``ValueError`` when it is malformed)."""
        if isinstance(data, ReleaseGuarantee):
            return data
        if not isinstance(data, Mapping) or not isinstance(data.get("parts"), list):
            raise ValueError("release_guarantee must be a JSON object with a list 'parts'")
        epsilon = number_from_json(data.get("epsilon"), name="epsilon", optional=False)
        assert epsilon is not None
        return cls(epsilon, float(data.get("delta", 0.0)), tuple(GuaranteePart.from_dict(p) for p in data["parts"]),
                   str(data.get("scope", "")), str(data.get("method", METHOD_BASIC)),
                   str(data.get("neighbours", NEIGHBOURS)))

    def headline(self) -> str:
        """Return the one line that text output leads with."""
        if not self.private:
            open_parts = ", ".join(p.kind for p in self.parts if not math.isfinite(p.epsilon))
            return f"release guarantee: epsilon = inf per record (not private: {open_parts})"
        delta = f", delta = {self.delta:.3g}" if self.delta else ""
        return f"release guarantee: epsilon = {format_epsilon(self.epsilon)}{delta} per record ({self.method})"

    def lines(self) -> list[str]:
        """Return the headline, then one line per part."""
        out = [self.headline()]
        for part in self.parts:
            delta = f", delta {part.delta:.3g}" if part.delta else ""
            out.append(f"  {part.kind:<10} {format_epsilon(part.epsilon):>18}{delta}  {part.mechanism}: {part.covers}")
        return out


# ---------------------------------------------------------------------------------------------------------------
# Parts


def features_part(mechanism: str, release: str, epsilon: float | None, delta: float = 0.0, *,
                  categories: int | None = None) -> GuaranteePart:
    """Return the part of the record's own released values: the file's exact per-record ε (None: unknown, ∞).

    ``categories``: the values are one of k classes released by k-RR (``krr`` on the ``label`` release). For
    neighbours whose classes differ, its privacy loss is exactly k-RR's; for equal classes it is 0. So the
    accountant takes it as the k-RR it is, which composes tighter than binary RR at the same ε. A ``stats:K``
    release randomizes no record's values: its part covers the silo's one release of noisy statistics.
    """
    eps = math.inf if epsilon is None else float(epsilon)
    event: PartEvent
    if delta:
        event = None
    elif categories is not None and math.isfinite(eps):
        event = RandomizedResponseEvent(eps, int(categories))
    else:
        event = PureEvent(eps)
    kind, _, width = release.partition(":")
    covers = f"the record's {release} values, randomized"
    if kind == STATS:  # no record's values: one release of the silo's statistics (issue 40)
        covers = (f"the silo's per-class sums, class counts and second moments of its records projected to {width} "
                  "values and clipped, each with Gaussian noise, released once (the synthetic rows are "
                  "post-processing of them)")
    return GuaranteePart(FEATURES, covers, mechanism, eps, float(delta), event)


def labels_part(release: LabelRelease) -> GuaranteePart:
    """Return the label part: in clear (ε = ∞; also when the file does not record it) or k-RR at its exact ε."""
    if release.clear:
        return GuaranteePart(LABELS, "the record's true label, in clear", "clear", math.inf, 0.0, release.event())
    if release.synthetic:
        return GuaranteePart(LABELS, "the synthetic records' labels: post-processing of the noisy per-class "
                             "statistics, whose part covers the record's label", "statistics", 0.0, 0.0,
                             release.event())
    return GuaranteePart(LABELS, f"the record's label, k-ary randomized response over k = {release.num_classes} "
                         "classes", "krr", release.epsilon, 0.0, release.event())


def extractor_part(training: ExtractorTraining | None, *, trained: bool, records: int, features_epsilon: float,
                   dp_sgd: DpSgdEpsilon | None = None) -> GuaranteePart | None:
    """How the released function depends on the record through training (see the module docstring).

    ``training`` is the file's (``None``: not recorded, the non-private training of earlier versions when
    ``trained``); ``records`` is n, the client's released records; ``dp_sgd`` gives a DP-SGD part's ε at δ
    (default :func:`dp_sgd_epsilon`, the exact accountant).
    """
    training = training if training is not None else ExtractorTraining.from_json(None, trained=trained)
    if training.training == "none" and training.fixed is not None:
        fixed = training.fixed
        what = ", ".join(f"{k}={fixed[k]}" for k in ("kind", "J", "L") if k in fixed)
        return GuaranteePart(EXTRACTOR, f"{FIXED_TEXT} ({what or 'weight-free'}): no record changes the release of "
                             "another", "fixed", 0.0, 0.0, PureEvent(0.0))
    if training.training == "none":
        return None
    if training.dp_sgd is not None and training.delta is not None:
        event, delta = training.dp_sgd, training.delta
        return GuaranteePart(EXTRACTOR, f"the CNN trained on the client's {training.details.get('records', 'n')} "
                             "records with record-level DP-SGD; the other records' releases are post-processing of it",
                             "dp-sgd", (dp_sgd or dp_sgd_epsilon)(event, delta), delta, event)
    n = int(training.details.get("records", records))
    group = math.inf if not math.isfinite(features_epsilon) else max(n - 1, 0) * features_epsilon
    return GuaranteePart(EXTRACTOR, f"the CNN trained on the client's records without DP: one record changes the "
                         f"release of each of the other {max(n - 1, 0)} records (group privacy, (n - 1) x "
                         f"{format_epsilon(features_epsilon)})", "non-private training", group)


def re_release_parts(entries: Iterable[ReleaseEntry]) -> list[GuaranteePart]:
    """Earlier releases of the same records (``release_history`` entries): their features and labels again."""
    parts = []
    for entry in entries:
        eps = entry.exact_epsilon_per_record
        label_eps = labels_part(entry.label_release or CLEAR_LABELS).epsilon
        total = math.inf if eps is None else eps + label_eps
        parts.append(GuaranteePart(RE_RELEASE, f"the earlier release {entry.file} of {entry.run} (its values and "
                                   "its labels)", entry.mechanism, total, 0.0, PureEvent(total)))
    return parts


# ---------------------------------------------------------------------------------------------------------------
# Composition


DpSgdEpsilon = Callable[[DpSgdEvent, float], float]
"""How a DP-SGD part's ε at δ is obtained (the exact accountant, or a checked stored figure)."""


def dp_sgd_epsilon(event: DpSgdEvent, delta: float) -> float:
    """ε at δ of DP-SGD as it ran, under REPLACE_ONE (the package's accountant: dp-accounting PLD)."""
    return accounting.epsilon([event], delta, neighbours=accounting.REPLACE_ONE)


def basic_guarantee(parts: tuple[GuaranteePart, ...], scope: str = "") -> ReleaseGuarantee:
    """Return the guarantee of ``parts`` by the accountant's basic composition: ε and δ add; ∞ stays ∞."""
    epsilon, delta = accounting.basic_composition((p.epsilon, p.delta) for p in parts)
    return ReleaseGuarantee(epsilon, delta, parts, scope, METHOD_BASIC)


def pld_events(parts: Sequence[GuaranteePart]) -> tuple[list[Event], float] | None:
    """Return the events the PLD accountant composes for ``parts`` and their δ; None where basic composition applies.

    None: no DP-SGD part, more than one, a pure part with δ > 0 or above PLD_MAX_PURE_EPSILON, or a part at ε = ∞.
    """
    if any(not math.isfinite(p.epsilon) for p in parts):
        return None
    sgd = [p for p in parts if p.kind == EXTRACTOR and p.mechanism == "dp-sgd"]
    pure = [p for p in parts if p not in sgd]
    if len(sgd) != 1 or any(p.delta for p in pure) or any(p.epsilon > PLD_MAX_PURE_EPSILON for p in pure):
        return None
    if not isinstance(sgd[0].event, DpSgdEvent):
        return None
    return [sgd[0].event, *(_pure_event(p) for p in pure if p.epsilon > 0)], sgd[0].delta


def guarantee_of(parts: Sequence[GuaranteePart], *, scope: str) -> ReleaseGuarantee:
    """Return the per-record guarantee of all ``parts`` (see the module docstring for the method)."""
    parts = tuple(parts)
    basic = basic_guarantee(parts, scope)
    found = pld_events(parts)
    if found is None:
        return basic
    events, delta = found
    pld = accounting.epsilon(events, delta, neighbours=accounting.REPLACE_ONE)
    if pld < basic.epsilon:
        return ReleaseGuarantee(pld, delta, parts, scope, METHOD_PLD)
    return basic


def _pure_event(part: GuaranteePart) -> Event:
    """k-RR as itself; any other pure ε-DP part as binary randomized response at ε (which dominates it)."""
    if isinstance(part.event, RandomizedResponseEvent):
        return RandomizedResponseEvent(part.epsilon, part.event.categories)
    return PureEvent(part.epsilon)


# ---------------------------------------------------------------------------------------------------------------
# A client file's guarantee

FILE_SCOPE = ("everything this client file releases about one record: its randomized values, its label, the "
              "extractor's dependence on it, and the earlier releases of the same records")
LOCAL_ONLY_SCOPE = ("LOCAL ONLY: this file must never leave the silo (only DP-SGD updates may); if shipped, it "
                    "releases " + FILE_SCOPE)


def file_parts(meta: ClientMetadata, *, records: int, history: Iterable[ReleaseEntry] = (),
               diagnostic: bool = False, dp_sgd: DpSgdEpsilon | None = None) -> list[GuaranteePart]:
    """Return the parts of a client file's guarantee (``meta``: its ``ClientMetadata``).

    ``records`` is the client's released rows (train + test); ``history`` the earlier releases of the same
    records (``release_history`` entries, oldest first, without this file's own); ``diagnostic``: the file
    carries ``/stats/input_bit_density`` (an aggregate of the clear encoding: a part with ε = ∞); ``dp_sgd``: how a
    DP-SGD part's ε is obtained (:func:`extractor_part`).
    """
    report = meta.privacy_report
    k_rr = meta.mechanism == KRR_MECHANISM and meta.release == LABEL
    feature = features_part(meta.mechanism, meta.release, report.exact_epsilon_per_record, report.exact_delta,
                            categories=meta.num_classes if k_rr else None)
    history = list(history)
    parts = [feature, labels_part(meta.label_release or CLEAR_LABELS)]
    # group privacy covers every release that went through the same extractor: this one and the earlier ones
    earlier = [e.exact_epsilon_per_record for e in history]
    through_extractor = math.inf if None in earlier else feature.epsilon + math.fsum(e for e in earlier if e)
    extractor = extractor_part(meta.training(), trained=meta.extractor not in UNTRAINED_EXTRACTORS,
                               records=records, features_epsilon=through_extractor, dp_sgd=dp_sgd)
    if extractor is not None:
        parts.append(extractor)
    parts += re_release_parts(history)
    if diagnostic:
        parts.append(GuaranteePart(DIAGNOSTIC, "/stats/input_bit_density: the density of 1s of the clear encoding, "
                                   "an aggregate of the records written on request (store_input_density)",
                                   "none", math.inf))
    return parts


def file_guarantee(meta: ClientMetadata, *, records: int, history: Iterable[ReleaseEntry] = (),
                   diagnostic: bool = False) -> ReleaseGuarantee:
    """Return the per-record guarantee of a client file (see :func:`file_parts`); a local-only file's says so."""
    scope = LOCAL_ONLY_SCOPE if getattr(meta, "local_only", False) else FILE_SCOPE
    return guarantee_of(file_parts(meta, records=records, history=history, diagnostic=diagnostic), scope=scope)


def stored_or_computed(meta: ClientMetadata, *, records: int) -> ReleaseGuarantee:
    """Return the file's stored ``release_guarantee``; files that predate it get one computed from their attributes.

    A file of schema version < 4 recorded neither its label release nor its extractor's training: its labels
    are in clear and a trained extractor was trained without DP, so its guarantee is ε = ∞.
    """
    if meta.release_guarantee is not None:
        return meta.release_guarantee
    return file_guarantee(meta, records=records)


def weakest(guarantees: Iterable[ReleaseGuarantee]) -> ReleaseGuarantee | None:
    """Return the weakest of ``guarantees`` (the largest ε, then δ): a run's figure; None when there is none."""
    return max(guarantees, key=lambda g: (g.epsilon, g.delta), default=None)


# ---------------------------------------------------------------------------------------------------------------
# A federation's guarantee (metrics.json)

FEDERATION_SCOPE = ("what a federation over these client files releases about one record: the model, its updates "
                    "and its metrics are computed from the files' released values (post-processing, no further "
                    "loss), so each client's figure is its file's; the run's is the weakest client's")
RELEASED_FILES_NOTE = ("stage 2 is post-processing of the released client files: it reads only what they released "
                       "and adds no noise nor release of its own, so each silo's guarantee is its file's "
                       "release_guarantee, whatever the number of runs, models or tuning sweeps over the same files")
"""Said by the ledger, the federation's guarantee and the CLI when every silo's file is shareable and stage 2 adds
nothing (no model perturbation, no DP-SGD): e.g. over ``stats:K`` files (issue 40)."""
CLEAN_METRICS_NOTE = ("clean_test_* metrics are computed from local-only clear records (--eval-clean); they are not "
                      "covered by this guarantee and must stay on the silo")


DP_SGD_SCOPE = ("what a federation releases about one record when the silos train with record-level DP-SGD: each "
                "silo's updates (and so the model and what is computed from it) are (epsilon, delta)-DP in "
                "each of its training records over every step it took, and its evaluation replies in each of its "
                "test records (Gaussian noise); its client files never leave it (local-only), so this is "
                "everything it releases; the run's figure is the weakest silo's")
LOCAL_METRICS_NOTE = ("DP-SGD silos do not report training metrics (train_* are null: they would be computed from "
                      "clear training records); the evaluation sums (test_*, per_client) of silos whose files are "
                      "local-only are computed from their TEST records, disjoint from their training records, and "
                      "leave with Gaussian noise (per-record loss clipped to 10 nats), accounted as "
                      "evaluation_epsilon: each silo's figure is the larger of the two (parallel composition), and "
                      "the reported test figures are noisy")
CLEAR_EVALUATION_NOTE = ("the evaluation sums (test_*, per_client) of local-only DP-SGD silos were released in clear "
                         "(eval_epsilon inf): their test records are not protected, so their figure is inf")
SHARED_FILES_NOTE = ("client {client}'s file is shareable, so it may have left the silo: its release guarantee "
                     "covers everything (the updates are computed from the released file: post-processing); the "
                     "DP-SGD figure alone holds where only the updates leave (updates_only)")

