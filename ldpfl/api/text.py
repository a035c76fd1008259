"""The text summaries of the jobs' results, as ``ldpfl`` prints them, for any front end (a notebook too).

One function per result: :func:`export_text`, :func:`plan_text`, :func:`gather_text`, :func:`federate_text` and
:func:`predict_lines`; the demo's and inspect's results have their own ``format_text``. They import nothing heavy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ldpfl.stage1_features.export.plan import describe_privacy
from ldpfl.stage2_federate.outputs import label_claim_lines, outlier_lines, pooled_figure_lines, summary_table

if TYPE_CHECKING:
    from ldpfl.contract.gather import GatherResult
    from ldpfl.stage1_features.export.results import ExportResult

    from .federate_job import FederateResult
    from .plan_job import PlanResult

MAX_LEDGER_CLIENTS = 12
"""Beyond this many clients, ``ldpfl federate``'s summary gives the range of the ledger's figures."""


def _accuracy(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def export_text(result: ExportResult) -> str:
    """Return ``ldpfl export``'s table: the run, its settings, one row per client, privacy, labels, randomness."""
    width = (f"r·l = {result.feature_width} bits" if result.feature_format == "packed-bits"
             else f"{result.features} float32 values")
    lines = [f"run directory  {result.run_dir}",
             f"dataset {result.dataset}, extractor {result.extractor}, release {result.release} "
             f"({result.features} values per record), mechanism {result.mechanism}, {width} per record",
             f"{'client':>6}  {'train':>7}  {'test':>6}  {'local acc':>9}  {'file':<16} status"]
    lines += [f"{c.index:>6}  {c.rows.get('train', 0):>7}  {c.rows.get('test', 0):>6}  "
              f"{_accuracy(c.local_accuracy):>9}  {c.file:<16} {c.status}" for c in result.clients]
    lines.append(f"privacy: {describe_privacy(result.privacy)}")
    labels = result.label_release
    if labels.synthetic:
        lines.append("labels: those of the synthetic records (post-processing of the per-class statistics)")
    elif not labels.clear:
        lines.append(f"labels: k-RR, exact ε = {labels.epsilon:.6g} per record (p_keep {labels.p_keep:.4g}); "
                     "it adds to the features' ε")
    else:
        lines.append("labels: in clear (label ε = inf; --label-epsilon randomizes them)")
    lines.append(f"randomness: {result.privacy.randomness_label}; {len(result.clients)} clients ({result.new} new) "
                 f"in {result.seconds:.1f} s; manifest {result.manifest.name}")
    return "\n".join(lines)


def plan_text(made: PlanResult) -> str:
    """Return ``ldpfl plan``'s summary: the file and fingerprint, the data, the extractor and mechanism, privacy."""
    plan = made.plan
    width = (f"r·l = {plan.feature_width} bits" if plan.mechanism.encoding is not None
             else f"{plan.features} float32 values")
    fixed = "".join(f", {k} {v}" for k, v in plan.extractor_options.items())
    return "\n".join([
        f"plan {made.path}  {plan.fingerprint}",
        f"dataset {plan.dataset}: {plan.num_classes} classes ({', '.join(plan.classes)}), input shape "
        f"{plan.input_shape}",
        f"extractor {plan.extractor}{fixed} (r = {plan.features}), release {plan.release}, mechanism "
        f"{plan.mechanism.name}, {width} per record",
        f"privacy: {describe_privacy(made.privacy)}"])


def gather_text(result: GatherResult) -> str:
    """Return ``ldpfl gather``'s summary: the run directory and each client file's source."""
    head = (f"run directory  {result.run_dir}  ({len(result.files)} client files"
            + (f", plan {result.plan_fingerprint}" if result.plan_fingerprint else "") + ")")
    return "\n".join([head, *(f"  client {index:>3}  {path}" for index, path in result.files)])


def federate_text(result: FederateResult) -> str:
    """Return ``ldpfl federate``'s summary: the rounds' table, the privacy ledger, the final accuracy, the outputs."""
    lines = [summary_table(result.rounds), *outlier_lines(result.rounds), *pooled_figure_lines(result.rounds),
             *left_out_lines(result.record.config), *label_claim_lines(result.record.config)]
    if result.privacy_ledger is not None:
        lines.append("\n".join(result.privacy_ledger.lines(max_clients=MAX_LEDGER_CLIENTS)))
    final = result.final_accuracy
    clean = result.rounds[-1].get("clean_test_accuracy") if result.rounds else None
    measured = f"final test accuracy {_figure(final)}" + (
        f", clean test accuracy {_figure(clean)}" if isinstance(clean, float) else "")
    done = (f"the closed-form head {result.config.head} (no round)" if result.config.closed_form
            else f"{len(result.rounds)} rounds")
    lines.append(f"{measured} after {done}; outputs in {result.outputs.directory}")
    return "\n".join(lines)


def left_out_lines(config: Mapping[str, Any]) -> list[str]:
    """Return one line per silo the coordinator left out before round 1 (``config.json``'s ``run.left_out``)."""
    run = config.get("run") if isinstance(config, Mapping) else None
    left = run.get("left_out") if isinstance(run, Mapping) else None
    return [f"left out before round 1: {x['reason']}" for x in left or ()]


def _figure(value: object) -> str:
    """Return an accuracy as ``0.1234``, ``n/a`` where there is none (None, or NaN: no test row)."""
    return f"{value:.4f}" if isinstance(value, float) and math.isfinite(value) else "n/a"


def predict_lines(summary: Mapping[str, Any]) -> list[str]:
    """Return ``ldpfl predict``'s closing lines: what was predicted, on which input, the accuracy, the run's."""
    inputs = {"clean": "clean release (not randomized; nothing leaves the silo, no privacy spent)",
              "randomized": "randomized release (the silo's mechanism, fresh randomness)",
              "released": "rows as stored in the file"}[summary["inputs"]]
    lines = [f"predicted {summary['records']} records: {summary['source']}", f"input: {inputs}"]
    if summary.get("accuracy") is not None:
        lines.append(f"accuracy {summary['accuracy']:.4f} ({summary['correct']}/{summary['records']})")
    last = summary.get("model_last_round")
    if last:
        measured = ", ".join(f"{k} {v:.4f}" for k, v in last.items() if k != "round" and isinstance(v, float))
        lines.append(f"the federation's last round ({last.get('round')}), on all clients: {measured}")
    personal = summary.get("model_personalization")
    if personal:
        lines.append(f"model: client {personal['client_index']}'s {personal['method']} personalization"
                     + (" -- LOCAL ONLY (epsilon = inf if shipped): keep it and its predictions on the silo"
                        if personal.get("local_only") else f", epsilon {personal.get('epsilon')} if shipped"))
    if summary.get("out"):
        lines.append(f"predictions written to {summary['out']}")
    return lines


__all__ = ["export_text", "federate_text", "gather_text", "plan_text", "predict_lines"]
