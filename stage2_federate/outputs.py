"""What a federation run writes: metrics (CSV, JSON), the configuration, the accuracy plot.

Every file is written through ``ldpfl.contract.atomic`` (a temporary name in the same directory, fsync, rename,
fsync of the directory), so a reader never sees a half-written file. No seed is ever written: the
configuration carries only the randomness mode. Imports numpy and matplotlib (the Agg canvas, never
pyplot's global state); no torch.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ldpfl.contract.atomic import atomic_write, atomic_write_text
from ldpfl.contract.federation_privacy import LedgerSection
from ldpfl.contract.jsonout import json_ready, refuse_seed_keys
from ldpfl.contract.layout import METRICS_JSON

from .client_privacy import ClientPrivacy
from .guarantee import federation_guarantee
from .outliers import OutlierReport, persistent_outliers
from .pooled_figure import final_round_flags, summary_line
from .round_record import RoundRecord
from .silo_training import UPLOAD_NOISE

if TYPE_CHECKING:
    from matplotlib.figure import Figure

METRICS_CSV = "metrics.csv"
CONFIG_JSON = "config.json"
PLOT_PNG = "accuracy.png"
MODEL_PT = "model.pt"
CHECKPOINT_PT = "checkpoint.pt"
OUTPUT_NAMES = (METRICS_CSV, METRICS_JSON, CONFIG_JSON, PLOT_PNG, MODEL_PT, CHECKPOINT_PT)

CSV_COLUMNS = ("round", "train_loss", "train_accuracy", "test_loss", "test_accuracy", "clean_test_accuracy",
               "selected", "dropped", "excluded", "aggregated", "weights", "client_epsilons", "kept_previous_model",
               "outliers", "rejected")
"""``clean_test_accuracy``: on the clients' unrandomized local test files (``--eval-clean``), else empty;
``outliers``: the silos the rule named in the round (discounted, clipped or flagged; the figures are in
``metrics.json``), empty without a report; ``rejected``: the silos whose reply the server refused (their reasons are
in ``metrics.json``)."""


def write_json(path: str | os.PathLike, payload: Any) -> Path:
    """Atomically write ``payload`` as indented JSON (refuses any key that names a seed)."""
    refuse_seed_keys(payload, str(path))
    return atomic_write_text(path, json.dumps(json_ready(payload), indent=2, sort_keys=False, allow_nan=False) + "\n")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list | tuple):
        return ";".join(_cell(v) for v in value)
    if isinstance(value, Mapping) and "client" in value:  # a rejected silo: its index (the reason is in the JSON)
        return str(value["client"])
    if isinstance(value, Mapping) and "named" in value:  # an outlier report: the silos it named
        return _cell(value["named"])
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return str(value)


def write_metrics_csv(path: str | os.PathLike, rounds: Sequence[Mapping[str, Any]]) -> Path:
    """One row per round; list cells (clients, weights, ε) are joined with ';'."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for record in rounds:
        writer.writerow([_cell(record.get(column)) for column in CSV_COLUMNS])
    return atomic_write_text(path, buffer.getvalue())


def write_metrics_json(path: str | os.PathLike, *, config: Mapping[str, Any], privacy: Sequence[ClientPrivacy],
                       rounds: Sequence[Mapping[str, Any]], ledger: LedgerSection,
                       extra: Mapping[str, Any] | None = None) -> Path:
    """``{"config": …, "privacy": [per-client reports], "rounds": [per-round records], "privacy_ledger": …, …extra}``.

    ``ledger`` is each client's total over the rounds so far (``ledger.ledger_section``); ``release_guarantee`` is
    the per-record figure over everything the clients released (``guarantee.federation_guarantee``). The privacy
    records become JSON here, once.
    """
    payload = {"config": config, "privacy": [p.to_dict() for p in privacy], "rounds": list(rounds),
               "privacy_ledger": ledger.to_dict()}
    reports = [OutlierReport.from_dict(r["outliers"]) for r in rounds if r.get("outliers") is not None]
    if reports:  # issue 42: the silos the rule named in most rounds
        payload["named_outliers"] = [p.to_dict() for p in persistent_outliers(reports)]
    flags = final_round_flags(rounds)
    if flags:  # issue 42: a silo far above the others lifts the pooled figure (pooled_figure)
        payload["pooled_figure_flags"] = flags
    if privacy and all(p.release_guarantee is not None for p in privacy):  # issue 22: everything released, one figure
        clean = any(key.startswith("clean_test_") for r in rounds for key in r)
        payload["release_guarantee"] = federation_guarantee(privacy, ledger, clean_metrics=clean).to_dict()
    return write_json(path, payload | dict(extra or {}))


PER_SILO_LABELS = 10
"""Up to this many silos get a legend entry each (and a colour of their own); more share one entry."""


def per_client_series(rounds: Sequence[RoundRecord], metric: str) -> dict[int, list[float]]:
    """Return each silo's ``test_{metric}`` per round from the rounds' ``per_client`` entries (NaN where absent).

    A silo whose evaluation the server rejected in a round has no entry there: its line has a gap.
    """
    clients = sorted({score.client for r in rounds for score in r.per_client})
    series = {c: [math.nan] * len(rounds) for c in clients}
    for position, record in enumerate(rounds):
        for score in record.per_client:
            value = getattr(score, f"test_{metric}")
            series[score.client][position] = math.nan if value is None else float(value)
    return series


def history_figure(rounds: Sequence[RoundRecord], title: str = "", caption: str = "") -> Figure:
    """Return the figure of accuracy.png: accuracy (left) and loss (right) per round (a matplotlib ``Figure``).

    Beside the global model's pooled test figure, each silo's own test rows (``per_client``) are drawn as a thin
    line, so a silo the model serves badly (a poisoned or dominated one) stands apart from the pooled figure.
    The test figures are drawn over the evaluated rounds only (``eval_every``), the training figures over all.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    def series(key: str, records: Sequence[RoundRecord]) -> list[float]:
        values = [getattr(r, key) for r in records]
        return [math.nan if v is None else float(v) for v in values]

    tested = [r for r in rounds if r.model_evaluated]
    x, x_tested = [r.round for r in rounds], [r.round for r in tested]
    figure = Figure(figsize=(10, 4), dpi=100)
    FigureCanvasAgg(figure)
    for axis, metric, label in zip(figure.subplots(1, 2), ("accuracy", "loss"), ("Accuracy", "Cross-entropy loss"),
                                   strict=True):
        silos = per_client_series(tested, metric)
        for position, (client, values) in enumerate(silos.items()):
            own = len(silos) <= PER_SILO_LABELS
            axis.plot(x_tested, values, linewidth=0.8, alpha=0.7, color=f"C{position % 10}" if own else "0.6",
                      label=f"silo {client} (its test rows)" if own else ("each silo's test rows" if not position
                                                                          else None))
        axis.plot(x_tested, series(f"test_{metric}", tested), marker="o", linewidth=2.2, color="black",
                  label="test (global model, pooled)")
        named = [r for r in tested if r.outliers is not None and r.outliers.named]
        if named:  # the rounds in which the rule named a silo (``outliers``), on the pooled line
            action = named[0].outliers.action if named[0].outliers is not None else "named"
            axis.plot([r.round for r in named], series(f"test_{metric}", named), linestyle="none", marker="x",
                      markersize=9, color="red", label=f"round in which a silo is {action}")
        if any(r.clean_test_loss is not None or r.clean_test_accuracy is not None for r in rounds):  # as the rows
            axis.plot(x_tested, series(f"clean_test_{metric}", tested), marker="s", label="clean test (local files)")
        axis.plot(x, series(f"train_{metric}", rounds), marker=".", linestyle="--", color="0.35",
                  label="train (mean over clients)")
        axis.set_xlabel("round")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7 if len(silos) > 3 else None)
    if title:
        figure.suptitle(title)
    if caption:
        figure.text(0.5, 0.01, caption, ha="center", va="bottom", fontsize=9)
    figure.subplots_adjust(left=0.07, right=0.98, bottom=0.19 if caption else 0.13, top=0.88 if title else 0.95,
                           wspace=0.22)
    return figure


def plot_history(path: str | os.PathLike, rounds: Sequence[RoundRecord], title: str = "",
                 caption: str = "") -> Path:
    """Write accuracy.png (:func:`history_figure`); ``caption`` under the plots.

    The federation passes the privacy ledger's one-line summary (``ledger.ledger_caption``) as the caption.
    """
    figure = history_figure(rounds, title, caption)
    return atomic_write(path, lambda handle: figure.savefig(handle, format="png"))


def summary_table(rounds: Sequence[Mapping[str, Any]]) -> str:
    """Per-round test accuracy as a small text table (the CLI's closing summary).

    ``clean_acc`` (accuracy on the clients' clean local test files, ``--eval-clean``) shows when recorded.
    """
    clean = any("clean_test_accuracy" in r for r in rounds)
    reported = any(r.get("outliers") is not None for r in rounds)
    lines = ["round  test_acc  test_loss  train_acc  " + ("clean_acc  " if clean else "") + "aggregated"
             + ("  named" if reported else "")]
    for r in rounds:
        def fmt(v: Any, width: int) -> str:
            return f"{'n/a':>{width}}" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:>{width}.4f}"
        clean_cell = f"{fmt(r.get('clean_test_accuracy'), 9)}  " if clean else ""
        lines.append(f"{r['round']:>5}  {fmt(r.get('test_accuracy'), 8)}  {fmt(r.get('test_loss'), 9)}  "
                     f"{fmt(r.get('train_accuracy'), 9)}  {clean_cell}"
                     f"{','.join(str(c) for c in r.get('aggregated', [])) or '-':<10}"
                     + (f"  {','.join(str(c) for c in (r.get('outliers') or {}).get('named', [])) or '-'}"
                        if reported else "").rstrip())
    return "\n".join(lines)


def outlier_lines(rounds: Sequence[Mapping[str, Any]]) -> list[str]:
    """Return the summary's lines on the silos the rule named in most rounds (none without an outlier report)."""
    reports = [OutlierReport.from_dict(r["outliers"]) for r in rounds if r.get("outliers") is not None]
    if not reports:
        return []
    named = persistent_outliers(reports)
    if not named:
        return [f"outliers: no silo {reports[-1].action} in most rounds"]
    return [f"outliers: {p.line(noise=UPLOAD_NOISE)}" for p in named]


def pooled_figure_lines(rounds: Sequence[Mapping[str, Any]]) -> list[str]:
    """Return the summary's lines on the silos that lift the final pooled test accuracy (``pooled_figure``)."""
    return [summary_line(flag) for flag in final_round_flags(rounds)]


def label_claim_lines(config: Mapping[str, Any]) -> list[str]:
    """Return the summary's line on the cap of unchecked label histograms (``config.json``'s ``label_claims``)."""
    from .label_claims import LabelClaimCap  # here: label_claims counts labels with torch, which --help never loads

    record = config.get("label_claims") if isinstance(config, Mapping) else None
    return [LabelClaimCap.line(record)] if isinstance(record, Mapping) else []
