"""Whether a client file's stored ``release_guarantee`` claims no less than its own parts give, checked fast.

``ldpfl inspect`` checks every file it reads. Pure parts compose by an exact sum, recomputed at once. A DP-SGD part
is composed by dp-accounting's PLD accountant, which costs seconds (its import alone about 1.8 s): by default the
stored figure is checked against a valid bracket of the accountant's (:mod:`ldpfl.mechanisms.accounting_bounds`,
numpy alone), and the exact accountant runs only on request (``recompute``) or where the bracket disagrees.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ldpfl.contract.release_guarantee import (
    EXTRACTOR,
    ReleaseGuarantee,
    basic_guarantee,
    file_guarantee,
    file_parts,
    pld_events,
)
from ldpfl.contract.schema import ClientMetadata
from ldpfl.mechanisms import accounting
from ldpfl.mechanisms.accounting_bounds import epsilon_bracket
from ldpfl.mechanisms.report import json_number

CHECK_EXACT = "recomputed"
CHECK_BRACKET = "bracket"
CHECK_ADDITIVE = "additive"


@dataclass(frozen=True)
class GuaranteeCheck:
    """How a stored guarantee was checked against the file's own parts, and what contradicts it.

    ``how`` is ``additive`` (no DP-SGD part: the parts compose by an exact sum, recomputed at once), ``bracket``
    (the stored figure lies within valid lower and upper bounds of the accountant's, :mod:`ldpfl.mechanisms.
    accounting_bounds`) or ``recomputed`` (the exact accountant: asked for, or the bracket disagreed);
    ``lower`` and ``upper`` bound the file's own figure (equal when it was computed exactly).
    """

    how: str
    lower: float
    upper: float
    problems: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form."""
        return {"how": self.how, "lower": json_number(self.lower), "upper": json_number(self.upper),
                "problems": list(self.problems)}


def _understated(stated: float, own: float) -> bool:
    return own > stated * (1 + 1e-9) + 1e-9


def _exact_check(stored: ReleaseGuarantee, meta: ClientMetadata, *, records: int, diagnostic: bool) -> GuaranteeCheck:
    own = file_guarantee(meta, records=records, diagnostic=diagnostic)
    problems: tuple[str, ...] = ()
    if _understated(stored.epsilon, own.epsilon):
        problems = (f"release_guarantee states epsilon {stored.epsilon:.6g}, below the {own.epsilon:.6g} of the "
                    "file's own parts",)
    return GuaranteeCheck(CHECK_EXACT, own.epsilon, own.epsilon, problems)


class _Disagrees(Exception):
    """The fast check cannot vouch for the stored figure: recompute exactly."""


def check_stored(stored: ReleaseGuarantee, meta: ClientMetadata, *, records: int, diagnostic: bool = False,
                 recompute: bool = False) -> GuaranteeCheck:
    """Check that ``stored`` claims no less than the file's own parts give.

    The earlier releases of the same records, which only the manifest knows, can only add.
    Without a DP-SGD part the parts are recomputed exactly (pure parts add; no accountant). With one, and unless
    ``recompute``, nothing is recomputed by the PLD accountant: the stored extractor part must record the file's
    own (σ, q, T, δ), its ε must lie in the valid bracket of DP-SGD alone, and the stored total in the bracket of
    everything composed (capped by basic composition over the stored parts, as :func:`guarantee_of` caps it). A figure
    below a lower bound is certainly understated; any disagreement is settled by the exact accountant. A stored
    figure between the lower bound and the exact one passes this check: ``recompute`` closes that gap (its width
    is about (T + parts) times the bracket's grid; ``GuaranteeCheck.lower`` and ``upper`` say how wide).
    """
    if recompute:
        return _exact_check(stored, meta, records=records, diagnostic=diagnostic)
    stored_sgd = [p for p in stored.parts if p.kind == EXTRACTOR and p.mechanism == "dp-sgd"]

    def checked_sgd(event: accounting.DpSgdEvent, delta: float) -> float:
        """Return the stored DP-SGD part's ε, when it records this event and lies in the event's bracket."""
        if len(stored_sgd) != 1 or stored_sgd[0].delta != delta:
            raise _Disagrees
        if stored_sgd[0].event != event:
            raise _Disagrees
        if not epsilon_bracket([event], delta).holds(stored_sgd[0].epsilon):
            raise _Disagrees
        return stored_sgd[0].epsilon

    try:
        parts = file_parts(meta, records=records, diagnostic=diagnostic, dp_sgd=checked_sgd)
        basic = basic_guarantee(tuple(parts))
        found = pld_events(parts)
        if found is None:
            if not any(p.kind == EXTRACTOR and p.mechanism == "dp-sgd" for p in parts):
                problems: tuple[str, ...] = ()
                if _understated(stored.epsilon, basic.epsilon):
                    problems = (f"release_guarantee states epsilon {stored.epsilon:.6g}, below the "
                                f"{basic.epsilon:.6g} of the file's own parts",)
                return GuaranteeCheck(CHECK_ADDITIVE, basic.epsilon, basic.epsilon, problems)
            lower = upper = basic.epsilon  # DP-SGD beside a part basic composition alone covers: exact sum
        else:
            bracket = epsilon_bracket(*found)  # type: ignore[arg-type]
            lower, upper = min(bracket.lower, basic.epsilon), min(bracket.upper, basic.epsilon)
        if not lower * (1 - 1e-9) - 1e-9 <= stored.epsilon <= upper * (1 + 1e-9) + 1e-9:
            raise _Disagrees
    except _Disagrees:
        return _exact_check(stored, meta, records=records, diagnostic=diagnostic)
    return GuaranteeCheck(CHECK_BRACKET, lower, upper)


__all__ = ["CHECK_ADDITIVE", "CHECK_BRACKET", "CHECK_EXACT", "GuaranteeCheck", "check_stored"]
