"""A silo whose own test accuracy stands far above the others' is flagged (issue 42 item 3).

The reported test accuracy is pooled over the union of the silos' test rows (``round_record.union_evaluation``), so
a silo with many test rows that its own training rows repeat (records duplicated ten times: the model has seen
each of its test rows) lifts the pooled figure however badly the model serves the others. The coordinator cannot
see a silo's records; it sees each silo's own figure (``per_client``), and flags silo k on the final round when
both hold:

* **far above the others**: a_k − a_o > max(:data:`GAP_BOUND`, :data:`Z_BOUND` · SE), with a_o the accuracy over
  the other silos' test rows pooled, and SE = √(p(1 − p)(1/n_k + 1/n_o)) the standard error of that difference
  for two binomial samples of n_k and n_o rows sharing the pooled accuracy p (two honest silos' accuracies differ
  by more than 3 SE about once in 370 draws);
* **it lifts the pooled figure**: p − a_o = (a_k − a_o) · n_k / (n_k + n_o) > :data:`LIFT_BOUND`, so that the
  figure reported with the silo is more than 2 pp above the one without it.

An honest silo of a non-IID run may score well above the others; with a share of the test rows like theirs it
lifts the pooled figure by its gap over the number of silos, below the bound for ten silos unless its gap exceeds
20 pp. The flag does not change the figure: it names the silo and the figure without it (``metrics.json``'s
``pooled_figure_flags``, ``--json``, and the summary). See docs/cross-silo.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ldpfl.contract.pooled_figure_flag import PooledFigureFlag

from .round_record import ClientScore

GAP_BOUND = 0.15
"""A flagged silo's own test accuracy is more than 15 pp above the other silos' pooled accuracy."""

Z_BOUND = 3.0
"""... and more than 3 standard errors of the difference of two binomial accuracies above it."""

LIFT_BOUND = 0.02
"""... and the pooled figure with the silo is more than 2 pp above the figure without it."""


def summary_line(flag: Mapping[str, Any]) -> str:
    """Return the summary's line on a flag written by ``PooledFigureFlag.to_dict``, with the bounds it passed."""
    return (PooledFigureFlag(int(flag["client"]), float(flag["test_accuracy"]), int(flag["test_rows"]),
                             float(flag["others_test_accuracy"]), int(flag["others_test_rows"]),
                             float(flag["pooled_test_accuracy"])).describe()
            + f" (flagged past {GAP_BOUND * 100:.0f} pp and {Z_BOUND:g} standard errors above the others, lifting the "
            f"pooled figure by over {LIFT_BOUND * 100:.0f} pp)")


def pooled_figure_flags(scores: Sequence[ClientScore]) -> list[PooledFigureFlag]:
    """Return the silos of ``scores`` (one round's ``per_client``) that lift the pooled accuracy, by client index."""
    scored = [s for s in scores if s.test_rows > 0 and math.isfinite(s.test_accuracy)]
    total_rows = sum(s.test_rows for s in scored)
    total_correct = sum(s.test_accuracy * s.test_rows for s in scored)
    flags = []
    for silo in sorted(scored, key=lambda s: s.client):
        others_rows = total_rows - silo.test_rows
        if others_rows <= 0:
            continue
        others = (total_correct - silo.test_accuracy * silo.test_rows) / others_rows
        pooled = total_correct / total_rows
        gap = silo.test_accuracy - others
        error = math.sqrt(max(pooled * (1.0 - pooled), 0.0) * (1.0 / silo.test_rows + 1.0 / others_rows))
        if gap > max(GAP_BOUND, Z_BOUND * error) and pooled - others > LIFT_BOUND:
            flags.append(PooledFigureFlag(silo.client, silo.test_accuracy, silo.test_rows, others, others_rows,
                                          pooled))
    return flags


def final_round_flags(rounds: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Return the flags of the last round that holds per-silo figures (``per_client``), as written."""
    for row in reversed(rounds):
        per_client = row.get("per_client") or []
        if per_client:
            scores = [ClientScore(int(s["client"]), _number(s["test_loss"]), _number(s["test_accuracy"]),
                                  int(s["test_rows"])) for s in per_client]
            return [f.to_dict() for f in pooled_figure_flags(scores)]
    return []


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)  # a figure JSON wrote as null (NaN: no test row)
