"""What a DP-SGD run's silos released: its ``privacy_ledger`` and each silo's release guarantee. Torch-free.

A silo's accountant is the run's history (``dp_sgd_budget``): ``local_steps`` Poisson-sampled Gaussian steps per
round in which it trained (:func:`rounds_trained`), composed by the one accountant (``ldpfl.mechanisms.accounting``)
under both neighbouring relations, and one Gaussian release of its test sums per evaluated round
(``evaluation_noise``). Its guarantee is that figure where only its updates leave (local-only files: the larger of
the training and the test records' figures, McSherry 2009 parallel composition), else its file's, with the
updates' figure beside it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from ldpfl.contract.federation_privacy import AnyLedgerRow, DpSgdLedgerRow, LedgerSection, SiloGuarantee, UpdatesOnly
from ldpfl.contract.release_guarantee import (
    DP_SGD_SCOPE,
    EXTRACTOR,
    METHOD_PLD,
    SHARED_FILES_NOTE,
    GuaranteePart,
    ReleaseGuarantee,
)
from ldpfl.mechanisms import accounting
from ldpfl.mechanisms.accounting import PLD

if TYPE_CHECKING:
    from ldpfl.stage2_federate.client_privacy import ClientPrivacy
    from ldpfl.stage2_federate.round_record import RoundRecord

    from .dp_sgd_budget import DpSgdClient

LIBRARY = "opacus"
"""The library that takes the steps, as the privacy entries and the ledger's notes name it."""

COUNTED = ("rounds in which the client trained (selected and not lost; a client dropped after training counts "
           "too), local_steps DP-SGD steps each")
ACCOUNT_EVERY = 10
"""While a DP-SGD run goes on, its ledger is recomputed every this many rounds (a PLD of the whole run takes about
0.2 s per silo and relation); the final ledger covers every round."""
EVALUATION = "evaluation"
METHOD_PARALLEL = ("parallel composition over disjoint records (McSherry 2009): the larger of the training records' "
                   f"DP-SGD figure ({accounting.METHOD}) and the test records' evaluation figure")
DP_SGD_ALONE = "DP-SGD alone (only the updates leave the silo)"
SCOPES = frozenset({DP_SGD_SCOPE})
"""The scopes a DP-SGD silo's guarantee states (a run's weakest guarantee keeps its scope)."""


def rounds_trained(rounds: Iterable[RoundRecord], client: int) -> int:
    """Count the ``rounds`` in which ``client`` trained.

    Selected and not lost (its reply never came, or it failed): a client that trained and was dropped after
    training counts, since its noisy model may have left it (conservative).
    """
    return sum(client in record.selected and client not in (record.lost or ()) for record in rounds)


def dp_sgd_ledger(rounds: Sequence[RoundRecord], silos: Sequence[DpSgdClient], *,
                  final: bool = True) -> LedgerSection:
    """Build the ``privacy_ledger`` of a DP-SGD run: each silo's accountant over every step it took so far.

    Each client's row gives ε at its δ under both neighbouring relations (``epsilon`` is the run's relation,
    ``neighbours``), its rounds and steps, and how far it is from its target (``target_epsilon``). Unless
    ``final``, the figures cover the rounds up to the last multiple of :data:`ACCOUNT_EVERY` (``as_of_round``).
    """
    as_of = len(rounds) if final else len(rounds) - len(rounds) % ACCOUNT_EVERY
    rounds = rounds[:as_of]
    evaluated = sum(r.model_evaluated for r in rounds)  # each such round's model by every silo (one lost, too)
    rows = []
    for dp in silos:
        trained = rounds_trained(rounds, dp.client)
        both = dp.epsilons(trained)
        rows.append(DpSgdLedgerRow(dp.client, trained, trained * dp.local_steps, both[dp.neighbours], dp.delta,
                                   both[accounting.REPLACE_ONE], both[accounting.ADD_REMOVE], dp.neighbours,
                                   dp.target_epsilon, dp.noise_multiplier, dp.sampling_probability, dp.clip,
                                   f"{accounting.METHOD} (DP-SGD: Poisson-sampled Gaussian)",
                                   evaluation_releases=evaluated, evaluation_epsilon=dp.evaluation_epsilon(evaluated),
                                   evaluation_sigma=None if dp.evaluation is None else dp.evaluation.sigma))
    notes = (f"record-level DP-SGD ({LIBRARY}) of every silo over the {len(rounds)} rounds so far: each "
             f"silo's steps composed by one accountant ({accounting.METHOD}), epsilon at its delta under replace-one "
             "and add-remove",
             "evaluation_*: each silo's evaluation replies on its test records (disjoint from its training "
             "records), released with Gaussian noise (stage2_federate.evaluation_noise), "
             + ("one per round so far" if evaluated == len(rounds) else
                f"one per evaluated round so far ({evaluated} of the {len(rounds)} rounds: eval_every)")
             + "; the same epsilon under both relations, inf where they left in clear")
    return LedgerSection(len(rounds), COUNTED, PLD, True, tuple(rows), notes, dp_sgd=True, as_of_round=as_of)


def dp_sgd_silo(entry: ClientPrivacy, dp_sgd: DpSgdClient, accounted: AnyLedgerRow | None,
                relations: tuple[float, float] | None) -> tuple[SiloGuarantee, ReleaseGuarantee]:
    """One DP-SGD silo's row and guarantee (``guarantee.federation_guarantee``): its accountant's event as it ran.

    ``relations``: its file's figures under (replace-one, add-remove) where its release states both
    (``guarantee.file_relations``).
    """
    file_guarantee = entry.release_guarantee
    if not isinstance(accounted, DpSgdLedgerRow) or file_guarantee is None:
        raise ValueError(f"DP-SGD client {entry.client} has no DP-SGD row in the privacy ledger")
    eps, eps_ar = accounted.epsilon_replace_one, accounted.epsilon_add_remove
    delta = float(accounted.delta or 0.0)
    part = GuaranteePart(EXTRACTOR, f"the silo's updates: {accounted.steps} DP-SGD steps (sigma "
                         f"{accounted.noise_multiplier}, q {accounted.sampling_probability}, clip "
                         f"{accounted.clip}) over the records it trained on", "dp-sgd", eps, delta,
                         dp_sgd.event(accounted.rounds))
    updates = ReleaseGuarantee(eps, delta, (part,), DP_SGD_SCOPE, METHOD_PLD)
    if entry.local_only:
        tested = accounted.evaluation_epsilon
        if tested is None:  # a run written before the evaluation was accounted
            return SiloGuarantee(entry.client, eps, delta, eps, eps_ar, True), updates
        # parallel composition: training and test records are disjoint, so each record has the larger figure
        evaluation = GuaranteePart(EVALUATION, f"the silo's evaluation replies: {accounted.evaluation_releases} "
                                   f"Gaussian releases (sigma {accounted.evaluation_sigma}) of sums over its test "
                                   "records", "gaussian" if math.isfinite(tested) else "none", tested, delta)
        both = ReleaseGuarantee(max(eps, tested), delta, (part, evaluation), DP_SGD_SCOPE, METHOD_PARALLEL)
        return SiloGuarantee(entry.client, max(eps, tested), delta, max(eps, tested), max(eps_ar, tested), True,
                             evaluation_epsilon=tested), both
    note = SHARED_FILES_NOTE.format(client=entry.client) if eps < file_guarantee.epsilon else None
    # both are valid bounds of what leaves when the file is shared too: the file's holds
    return SiloGuarantee(entry.client, file_guarantee.epsilon, file_guarantee.delta, file_guarantee.epsilon,
                         None if relations is None else relations[1], False,
                         UpdatesOnly(eps, delta, DP_SGD_ALONE, eps_ar), note), file_guarantee
