"""A federation's release guarantee (``metrics.json``'s ``release_guarantee``): each silo's, and the weakest's.

Everything a federation releases about one record is what its silo's files released (their
``ReleaseGuarantee``: the model, its updates and its metrics are computed from those: post-processing), or,
where only updates leave, the bound of the privacy ledger over them. Pure, no I/O; the record is
``ldpfl.contract.federation_privacy.FederationGuarantee``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ldpfl.contract.federation_privacy import FederationGuarantee, LedgerRow, LedgerSection, SiloGuarantee, UpdatesOnly
from ldpfl.contract.release_guarantee import (
    CLEAN_METRICS_NOTE,
    CLEAR_EVALUATION_NOTE,
    FEDERATION_SCOPE,
    LOCAL_METRICS_NOTE,
    RELEASED_FILES_NOTE,
    ReleaseGuarantee,
    weakest,
)

from .client_privacy import ClientPrivacy
from .silo_training import TRAINING_SCOPES

LEDGER_BOUND = "the privacy ledger (local DP over the client's whole vector)"
BOTH_RELATIONS = "replace-one (epsilon) and add-remove (epsilon_add_remove, where defined)"
FEATURES = "features"


def file_relations(entry: ClientPrivacy) -> tuple[float, float] | None:
    """Return a silo's file guarantee under (replace-one, add-remove), where its release states both; else None.

    A release that states both relations (a ``stats:K`` release: its report's ``probabilities`` hold
    ``epsilon_replace_one`` and ``epsilon_add_remove``) gives the file's figure under each when the file's guarantee
    is that release's alone: its other parts (labels, extractor) spend nothing and its figure is the replace-one one.
    """
    guarantee = entry.release_guarantee
    figures = dict(entry.feature_privacy.probabilities)
    numbers = [float(v) for v in (figures.get("epsilon_replace_one"), figures.get("epsilon_add_remove"))
               if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)]
    if guarantee is None or len(numbers) != 2:
        return None
    replace_one, add_remove = numbers
    others = [p for p in guarantee.parts if p.kind != FEATURES]
    if any(p.epsilon != 0 or p.delta != 0 for p in others) or not math.isclose(
            guarantee.epsilon, replace_one, rel_tol=1e-9, abs_tol=1e-12):
        return None
    return replace_one, add_remove


def post_processing_only(privacy: Sequence[ClientPrivacy], ledger: LedgerSection | None) -> bool:
    """Return whether stage 2 only post-processes the released files: shareable files, nothing added by stage 2."""
    return (ledger is not None and not ledger.adds_privacy_loss and bool(privacy)
            and all(not entry.training.own_accountant and not entry.local_only for entry in privacy))


def federation_guarantee(privacy: Sequence[ClientPrivacy], ledger: LedgerSection | None, *,
                         clean_metrics: bool = False) -> FederationGuarantee:
    """Return ``metrics.json``'s ``release_guarantee``: each client's, and the run's (the weakest client's).

    ``privacy`` holds each client's record with its file's ``release_guarantee``; ``ledger`` is the
    ``privacy_ledger`` section. Where only updates leave (a Flower deployment), an update perturbed under local DP
    over the whole client vector is also bounded by the ledger's (ε, δ): ``updates_only`` gives the smaller bound.

    A silo whose training has an accountant of its own (``silo_training``: ``SiloTraining.silo_guarantee``) and
    whose files are local-only releases only its updates: its figure is that accountant's, under replace-one
    (``epsilon``, the project's convention) and add-remove (``epsilon_add_remove``, the literature's). A silo whose
    files are shareable keeps its file's figure, with the accountant's as ``updates_only``. A file whose release
    states both relations (``stats:K``: :func:`file_relations`) gives its silo both figures, and the run both when
    every silo has them. When stage 2 adds nothing to shareable
    files (:func:`post_processing_only`), the notes say so (``RELEASED_FILES_NOTE``): any number of runs over the
    same files leaves every figure as it is.

    Raises
    ------
    ValueError
        No client, a client without its file's guarantee, or a silo with its own accountant without its ledger row.
    """
    clients: list[SiloGuarantee] = []
    guarantees: list[ReleaseGuarantee] = []
    for entry in privacy:
        if entry.release_guarantee is None:
            raise ValueError(f"client {entry.client} has no release_guarantee (its file's)")
        accounted = None if ledger is None else ledger.row(entry.client)
        own = entry.training.silo_guarantee(entry, accounted, file_relations(entry))
        if own is not None:
            row, guarantee = own
            clients.append(row)
            guarantees.append(guarantee)
            continue
        guarantee = entry.release_guarantee
        guarantees.append(guarantee)
        eps = accounted.epsilon if isinstance(accounted, LedgerRow) else None
        updates = None
        if eps is not None and eps < guarantee.epsilon:
            assert isinstance(accounted, LedgerRow)
            updates = UpdatesOnly(eps, float(accounted.delta or 0.0), LEDGER_BOUND)
        relations = file_relations(entry)
        clients.append(SiloGuarantee(entry.client, guarantee.epsilon, guarantee.delta,
                                     None if relations is None else relations[0],
                                     None if relations is None else relations[1], updates_only=updates))
    worst = weakest(guarantees)
    if worst is None:
        raise ValueError("a federation's guarantee needs at least one client")
    notes = [CLEAN_METRICS_NOTE] if clean_metrics else []
    if any(entry.training.own_accountant and entry.local_only for entry in privacy):
        notes.append(LOCAL_METRICS_NOTE)
    if any(c.evaluation_epsilon is not None and math.isinf(c.evaluation_epsilon) for c in clients):
        notes.append(CLEAR_EVALUATION_NOTE)
    if post_processing_only(privacy, ledger):
        notes.append(RELEASED_FILES_NOTE)
    add_remove = [c.epsilon_add_remove for c in clients]
    both = any(entry.training.own_accountant for entry in privacy) or all(e is not None for e in add_remove)
    return FederationGuarantee(
        worst.epsilon, worst.delta, worst.scope if worst.scope in TRAINING_SCOPES else FEDERATION_SCOPE, tuple(notes),
        tuple(clients), worst.parts, neighbours=BOTH_RELATIONS if both else None,
        epsilon_add_remove=(None if not both or any(e is None for e in add_remove)
                            else max(e for e in add_remove if e is not None)))


__all__ = ["BOTH_RELATIONS", "federation_guarantee", "file_relations", "post_processing_only"]
