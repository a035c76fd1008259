"""Privacy ledger of a federation: what all the rounds in which a client uploaded cost that client.

Pure accounting, no I/O. Each client's upload in one round is one *release* of its perturbed model vector,
described by the package's one vocabulary of privacy events (:mod:`ldpfl.mechanisms.privacy_events`; a
mechanism's report gives it, ``release_from_report``):

* ``GaussianRelease(sigma, l2_sensitivity, delta)``: Gaussian noise of parameter σ on a vector that can move
  by at most Δ₂ in L2 between any two data sets of the client (the clipped parameters or update). k releases
  are composed with Google's dp-accounting (``RdpAccountant`` by default, ``PLDAccountant`` on request) and
  reported as ε at the client's δ. The RDP accountant composes α·k·Δ₂²/(2σ²) (Mironov, "Rényi Differential
  Privacy", CSF 2017: the Gaussian's RDP, additive over releases). That also bounds the discrete Gaussian
  (Canonne, Kamath, Steinke 2020: N_Z is Δ²/(2σ²)-zCDP, and independent coordinates add Rényi divergences).
  The total is converted to (ε, δ) by CKS Proposition 12. The PLD accountant models the continuous
  Gaussian only, so it is refused for a discrete release.
* ``PureEvent(epsilon)``: a pure ε-LDP release (PDPM, ldpsign, discrete Laplace): basic composition, k·ε
  (Dwork and Roth 2014, Theorem 3.16), δ = 0.
* ``NoRelease()``: ``--perturbation none``. Stage 2 adds no noise, so it adds nothing to the ledger: the
  uploads are computed from the stage-1 release (whose ε is in the client files) and from the labels,
  which no mechanism covers.

Each client's total is one :class:`~ldpfl.contract.federation_privacy.LedgerRow`, the row ``metrics.json`` holds.

The neighbouring relation is local DP's: any two values of one client's vector. Δ₂ is the largest L2
distance between two such values, and dp-accounting's Gaussian event with noise multiplier σ/Δ₂ (no
sampling) is exactly that mechanism. Rounds are adaptive (each starts from the last global model);
both accountants and basic composition hold under adaptive composition.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from numbers import Integral

from ldpfl.contract.federation_privacy import LedgerRow, LedgerSection
from ldpfl.contract.release_guarantee import RELEASED_FILES_NOTE
from ldpfl.mechanisms import accounting
from ldpfl.mechanisms.accounting import PLD, RDP
from ldpfl.mechanisms.privacy_events import GaussianRelease, NoRelease, PureEvent, Release, release_from_report

from .client_privacy import ClientPrivacy
from .round_record import RoundRecord
from .silo_training import training_ledger

METHOD_NONE = "none"
METHOD_NO_UPLOADS = "no uploads"


def _require_rounds(rounds: int) -> int:
    if isinstance(rounds, bool) or not isinstance(rounds, Integral) or rounds < 0:
        raise ValueError(f"rounds must be an integer >= 0 (uploads of one client), got {rounds!r}")
    return int(rounds)


def _gaussian_epsilon(release: GaussianRelease, rounds: int, accountant: str) -> float:
    """Compose ``rounds`` Gaussian releases of multiplier σ/Δ₂ by the package's accountant (Δ₂ holds the relation)."""
    return accounting.epsilon([release.event(rounds)], release.delta, neighbours=accounting.ADD_REMOVE,
                              method=accountant)


def ledger_entry(release: Release, rounds: int, *, accountant: str = RDP, client: int = 0) -> LedgerRow:
    """Total privacy loss of ``rounds`` releases of ``release`` by one client, as its ledger row.

    Parameters
    ----------
    release : what one upload is (``GaussianRelease``, ``PureEvent`` or ``NoRelease``).
    rounds : number of rounds in which the client uploaded (≥ 0).
    accountant : ``"rdp"`` (default; valid for the discrete and the continuous Gaussian) or ``"pld"``
        (continuous Gaussian only: tighter, refused for a discrete release).
    client : the client the row names (0 unless given; ``privacy_ledger`` names each).

    Returns
    -------
    The row: ``epsilon``/``delta`` are None for ``NoRelease`` (stage 2 adds nothing); ε is ``math.inf`` when a
    release was not private.
    """
    rounds = _require_rounds(rounds)
    if accountant not in accounting.METHODS:
        raise ValueError(f"accountant must be one of {', '.join(accounting.METHODS)}; got {accountant!r}")
    if isinstance(release, NoRelease):
        return LedgerRow(client, rounds, None, None, METHOD_NONE,
                         ("stage 2 adds no noise: the uploads are computed from the stage-1 release and the "
                          "labels; the stage-1 epsilon is in the client files",))
    if rounds == 0:
        return LedgerRow(client, 0, 0.0, 0.0, METHOD_NO_UPLOADS, ("the client never uploaded",))
    if isinstance(release, PureEvent):
        total, _ = accounting.basic_composition([(release.epsilon, 0.0)] * rounds)
        return LedgerRow(client, rounds, total, 0.0, accounting.METHOD_BASIC,
                         (f"{rounds} x per-round epsilon {release.epsilon:.6g} (pure LDP, basic composition)",))
    if isinstance(release, GaussianRelease):
        if accountant == PLD and release.discrete:
            raise ValueError("accountant='pld' models the continuous Gaussian; a discrete Gaussian release "
                             "needs accountant='rdp'")
        total = _gaussian_epsilon(release, rounds, accountant)
        method = accounting.method_name(accountant)
        kind = "discrete" if release.discrete else "continuous"
        return LedgerRow(client, rounds, total, release.delta, method,
                         (f"{rounds} adaptive releases of the {kind} Gaussian, sigma/sensitivity = "
                          f"{release.noise_multiplier:.6g}, composed by {method} at delta {release.delta:g}",))
    raise TypeError(f"release must be a GaussianRelease, PureEvent or NoRelease, got {type(release).__name__}")


def privacy_ledger(participation: Mapping[int, int], releases: Release | Mapping[int, Release], *,
                   accountant: str = RDP) -> dict[int, LedgerRow]:
    """Per-client rows: ``participation[c]`` uploads of ``releases[c]`` (or one release shared by all).

    Every client of ``participation`` needs a release; extra releases are refused too, so that a client
    cannot silently drop out of the ledger.
    """
    if not isinstance(participation, Mapping):
        raise ValueError(f"participation must map each client to its number of uploads, got "
                         f"{type(participation).__name__}")
    if isinstance(releases, Mapping):
        missing = [c for c in participation if c not in releases]
        extra = [c for c in releases if c not in participation]
        if missing or extra:
            raise ValueError(f"releases must cover exactly the clients of participation; missing {missing!r}, "
                             f"extra {extra!r}")
        per_client = releases
    else:
        per_client = {c: releases for c in participation}
    cache: dict[tuple[Release, int], LedgerRow] = {}
    out: dict[int, LedgerRow] = {}
    for client, rounds in participation.items():
        key = (per_client[client], _require_rounds(rounds))
        if key not in cache:
            cache[key] = ledger_entry(key[0], key[1], accountant=accountant)
        out[client] = dataclasses.replace(cache[key], client=client)
    return out


def participation_counts(selected_per_round: list[list[int]] | tuple, clients: Sequence[int]
                         ) -> dict[int, int]:
    """Count the rounds in which each client uploaded, from the list of uploaders of every round.

    A client listed twice in one round is refused (one upload per round); a client outside ``clients``
    is refused too.
    """
    counts = {c: 0 for c in clients}
    for r, uploaders in enumerate(selected_per_round):
        seen = set()
        for c in uploaders:
            if c not in counts:
                raise ValueError(f"round {r} lists client {c!r}, which is not one of the run's clients")
            if c in seen:
                raise ValueError(f"round {r} lists client {c!r} twice; a client uploads at most once a round")
            seen.add(c)
            counts[c] += 1
    return counts


# --------------------------------------------------------------------------------------------------
# A federation run's ledger, from its per-round records and its per-client privacy reports.

COUNTED = ("rounds in which the client's upload reached the server: selected, not dropped (LDPFL IV-E), "
           "and finite (not excluded)")


def uploads_per_round(rounds: Sequence[RoundRecord]) -> list[list[int]]:
    """Return, for each round record, the clients whose upload reached the server.

    A record (``round_record.RoundRecord``) lists ``selected``, ``dropped`` and ``excluded`` clients; the upload
    of a selected client is released unless it dropped out or was not finite.
    """
    out: list[list[int]] = []
    for record in rounds:
        lost = set(record.dropped) | set(record.excluded)
        out.append([c for c in record.selected if c not in lost])
    return out


def ledger_section(rounds: Sequence[RoundRecord], privacy: Sequence[ClientPrivacy], *,
                   accountant: str = RDP, final: bool = True) -> LedgerSection:
    """Build the ``privacy_ledger`` section of ``metrics.json``: each client's total over the run so far.

    Parameters
    ----------
    rounds : the per-round records (``selected``, ``dropped``, ``excluded``).
    privacy : each client's :class:`~ldpfl.stage2_federate.client_privacy.ClientPrivacy`; its upload's report
        gives the release of one upload (``release_from_report``).
    accountant : ``"rdp"`` (default) or ``"pld"``.
    final : bool
        False while the run goes on (a ledger of the silos' own accountants may then lag: ``training_ledger``).

    Returns
    -------
    The section: ``rounds``, ``counted`` (which rounds count), ``accountant``, ``adds_privacy_loss`` (False for
    ``none``), one ``LedgerRow`` per client (with its upload's ``mechanism``) and ``notes``. A client whose
    report cannot be accounted (no per-record figure) gets ε = None and a note. Where the silos' training has an
    accountant of its own (``silo_training``), the section is that accountant's.
    """
    own = training_ledger(rounds, privacy, final=final)
    if own is not None:
        return own
    clients = [p.client for p in privacy]
    releases: dict[int, Release | None] = {}
    problems: dict[int, str] = {}
    mechanism_of: dict[int, str] = {}
    for p in privacy:
        mechanism_of[p.client] = p.upload.mechanism
        try:
            releases[p.client] = release_from_report(p.upload)
        except ValueError as error:
            releases[p.client], problems[p.client] = None, str(error)
    counts = participation_counts(uploads_per_round(rounds), clients)
    accounted = {c: r for c, r in releases.items() if r is not None}
    entries = privacy_ledger({c: counts[c] for c in accounted}, accounted, accountant=accountant)
    rows = [dataclasses.replace(entries.get(c) or LedgerRow(c, counts[c], None, None, "not accounted",
                                                            (problems.get(c, ""),)), mechanism=mechanism_of[c])
            for c in clients]
    adds = any(not isinstance(r, NoRelease) for r in releases.values())
    notes = [f"stage 2 only: what the uploads of {len(rounds)} rounds add; the stage-1 release of each client's "
             "features is in its client file (privacy_report)"]
    if not adds:
        notes.append("perturbation none: stage 2 adds no noise and nothing to the ledger")
        if privacy and not any(p.local_only for p in privacy):  # every file shareable: all stage 2 reads is released
            notes.append(RELEASED_FILES_NOTE)
    if any(isinstance(r, GaussianRelease) for r in releases.values()):
        notes.append("Gaussian family: RDP of the per-upload (discrete) Gaussian composed over the client's rounds "
                     "by dp-accounting, epsilon at the client's delta; no amplification by sampling")
    if any(isinstance(r, PureEvent) for r in releases.values()):
        notes.append("pure-epsilon mechanisms: basic composition, rounds x per-upload epsilon")
    return LedgerSection(len(rounds), COUNTED, accountant, adds, tuple(rows), tuple(notes))


CLOSED_FORM_COUNTED = ("none: a closed-form head has no round and no upload; the coordinator read each client "
                       "file's released statistics once")
CLOSED_FORM_NOTE = ("closed-form head: fitted on the client files' released statistics (post-processing), with no "
                    "round, no upload and no noise of its own: nothing to add to the ledger")


def closed_form_ledger(privacy: Sequence[ClientPrivacy], *, rounds: int = 1) -> LedgerSection:
    """Build the ``privacy_ledger`` of a closed-form head (``closed_form``): no upload, nothing added per client.

    ``rounds``: the run's records (one: the fit). The notes state that the files are all stage 2 reads.
    """
    rows = tuple(LedgerRow(p.client, 0, None, None, "none", (CLOSED_FORM_NOTE,)) for p in privacy)
    notes = (CLOSED_FORM_NOTE, *((RELEASED_FILES_NOTE,) if privacy and not any(p.local_only for p in privacy)
                                 else ()))
    return LedgerSection(rounds, CLOSED_FORM_COUNTED, None, False, rows, notes)


def ledger_caption(section: LedgerSection) -> str:
    """Return one line for the accuracy plot: the range of the clients' totals."""
    if not section.adds_privacy_loss:
        return "stage 2 adds no privacy loss (" + (
            "closed-form head on the released statistics)" if section.counted == CLOSED_FORM_COUNTED
            else "perturbation none)")
    rows = section.clients
    if any(r.epsilon is not None and math.isinf(r.epsilon) for r in rows):
        return "stage-2 privacy ledger: some clients not private (epsilon inf)"
    finite = [(float(r.epsilon), r.delta) for r in rows if r.epsilon is not None]
    if not finite:
        return ""
    low, high = min(e for e, _ in finite), max(e for e, _ in finite)
    deltas = {d for _, d in finite if d}
    delta = f" at delta {deltas.pop():g}" if len(deltas) == 1 else ""
    span = f"{low:.3g}" if low == high else f"{low:.3g} to {high:.3g}"
    return f"stage-2 privacy ledger: epsilon per client {span}{delta} over {section.rounds} rounds"
