"""The text of ``ldpfl inspect``: a file's full section, and a run's summary table."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ldpfl.contract.federation_privacy import FederationGuarantee
from ldpfl.contract.file_checks import as_float
from ldpfl.contract.release_history import total_epsilon
from ldpfl.contract.schema import SPLITS
from ldpfl.inspection.file import OK, FileReport
from ldpfl.inspection.report import Inspection
from ldpfl.mechanisms import PACKED_BITS
from ldpfl.mechanisms.randomness import describe_randomness


def _fmt(x: float | None, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if math.isinf(x):
        return "inf"
    return f"{x:.{digits}g}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    out = []
    for row in [header, *rows]:
        cells = [str(c).ljust(w) for c, w in zip(row, widths, strict=True)]
        out.append(indent + "  ".join(cells).rstrip())
    return out


def _compact_histogram(hist: Sequence[int] | None) -> str:
    if not hist:
        return "-"
    if len(hist) <= 12:
        return "/".join(str(h) for h in hist)
    nonzero = sum(1 for h in hist if h)
    return f"{nonzero}/{len(hist)} classes, {min(hist)}..{max(hist)} per class"


def file_lines(report: FileReport) -> list[str]:
    """Return the lines of one file's section: metadata, privacy, rows and labels, statistics, flags."""
    size = f"{report.size_bytes / 1024:.1f} KiB" if report.size_bytes is not None else "missing"
    lines = [f"{report.name}  ({report.path}, {size})"]
    if report.error:
        return [*lines, f"  status      ERROR: {report.error_problem}"]
    if report.guarantee is not None:  # text output leads with what the file releases about one record
        lines += report.guarantee.lines()
        lines.append(f"  scope       {report.guarantee.scope}; neighbours: {report.guarantee.neighbours}")
    meta = report.metadata
    assert meta is not None
    lines.append(f"  status      {report.status}" + ("" if report.status == OK else f" ({len(report.flags)} flags)"))
    checks = ["schema ok", f"manifest: {report.manifest.message}",
              "HDF5 checksums ok (every chunk read)" if report.checksums == "ok" else f"checksums {report.checksums}"]
    lines.append("  checks      " + "; ".join(checks))
    params = ", ".join(f"{k}={v}" for k, v in meta.mechanism_parameters.items()) or "-"
    unit = f"{meta.stored_width} bytes per row" if meta.feature_format == PACKED_BITS else f"{meta.features} per row"
    encoding = f"  encoding    none: r={meta.features} float32 values per row"
    if meta.feature_format == PACKED_BITS:
        encoding = (f"  encoding    m={meta.integer_bits}, n={meta.fraction_bits}, l={meta.bits_per_value} bits per "
                    f"value, r={meta.features} features, r*l={meta.features * meta.bits_per_value} bits")
    lines += [
        "metadata",
        f"  dataset     {meta.dataset} ({meta.num_classes} classes)",
        f"  client      {meta.client_index} of {meta.client_count}",
        f"  partition   {json.dumps(meta.partition, sort_keys=True, default=str)}",
        f"  extractor   {meta.extractor}, input shape {'x'.join(str(s) for s in meta.input_shape)}"
        + _fixed_extractor(meta.extractor_training),
        f"  release     {meta.release}" + ("   LOCAL ONLY: unrandomized records, never to be shared"
                                          if meta.local_only else ""),
        encoding,
        f"  features    {meta.feature_format} ({unit})",
        f"  mechanism   {meta.mechanism} ({params})",
        f"  randomness  {meta.randomness_label}: {describe_randomness(meta.randomness, meta.generator)}",
        f"  local acc   {_fmt(meta.local_accuracy)}" + ("" if meta.local_only else " (local-only: not shared)"),
        f"  written     {meta.created_utc} by ldpfl {meta.package_version}, schema v{meta.schema_version}",
    ]
    p = report.privacy
    if p is not None:
        lines.append("privacy" + ("" if p.private else "   NOT PRIVATE"))
        lines.append(f"  nominal eps {_fmt(p.nominal_epsilon)}   |   exact eps {_fmt(p.exact_epsilon_per_record, 6)} "
                     f"per {p.record}   |   exact eps {_fmt(p.exact_epsilon_per_coordinate, 6)} per {p.coordinate}")
        if p.recomputed is None:
            lines.append("  rebuilt     the mechanism could not be rebuilt from its parameters")
        else:
            lines.append("  rebuilt     " + ("the mechanism's parameters reproduce these values" if p.agrees
                                             else "MISMATCH with the report rebuilt from the parameters"))
        # a stats:K file's figures (sigma_*, mu, epsilon under both relations) are in its own section below
        for name, probs in ({} if report.released_statistics is not None else p.probabilities).items():
            if isinstance(probs, Mapping) and "p_one_given_one" in probs:
                lines.append(f"  {name:<11} {probs.get('positions', '?')} positions, P(1|1) "
                             f"{_fmt(as_float(probs.get('p_one_given_one')), 6)}, P(1|0) "
                             f"{_fmt(as_float(probs.get('p_one_given_zero')), 6)}, exact eps per bit "
                             f"{_fmt(as_float(probs.get('exact_epsilon_per_bit')), 6)}")
            else:
                lines.append(f"  {name:<11} {json.dumps(probs, default=str)}")
    if report.released_statistics is not None:
        lines += report.released_statistics.lines()
    lines.append("rows and labels")
    lines += _table(["split", "rows", "label histogram"],
                    [[s, str(report.rows.get(s, 0)), " ".join(str(h) for h in report.label_histograms.get(s, []))]
                     for s in SPLITS])
    if report.bits is not None:
        b = report.bits
        lines.append(f"bit statistics  (density of 1s per class of positions; train {b.rows.get('train', 0)} rows, "
                     f"test {b.rows.get('test', 0)} rows; the prediction describes train)")
        rows = []
        for c in b.classes:
            z = c.deviation_se
            rng = "-" if c.low is None else f"[{_fmt(c.low)}, {_fmt(c.high)}]"
            rows.append([c.name, str(c.positions), _fmt(c.observed.get("train")), _fmt(c.predicted),
                         "-" if z is None else f"{z:+.1f}".replace("-0.0", "+0.0"), _fmt(c.observed.get("test")), rng,
                         "!" if c.problems() else ""])
        lines += _table(["class", "positions", "train", "predicted", "dev/SE", "test", "mechanism range", ""], rows)
        lines += [f"  note: {n}" for n in b.notes]
    if report.floats is not None:
        f = report.floats.to_dict()
        synthetic = " of the synthetic records" if report.released_statistics is not None else ""
        lines.append(f"float statistics{synthetic}  (over all {f['rows']} rows, train and test)")
        for key in ("mean_per_feature", "std_per_feature"):
            s = f[key]
            lines.append(f"  {key.replace('_', ' '):<17} min {_fmt(s['min'])}, median {_fmt(s['median'])}, "
                         f"max {_fmt(s['max'])}")
        lines.append(f"  values            min {_fmt(f['minimum'])}, max {_fmt(f['maximum'])}, "
                     f"non-finite {f['non_finite_values']}")
        if f["output_fractions"]:
            shares = ", ".join(f"{k} ({_fmt(f['outputs'][k], 6)}) {v:.4f}" if k in f["outputs"] else f"{k} {v:.4f}"
                               for k, v in f["output_fractions"].items())
            lines.append(f"  output shares     {shares}")
    if report.flags:
        lines.append("flags")
        lines += [f"  ! {flag}" for flag in report.flags]
    return lines


def _federation_guarantee_lines(guarantee: FederationGuarantee | None) -> list[str]:
    """Return the federation's release guarantee: the weakest silo's, under both relations where defined."""
    if guarantee is None:
        return []
    eps, add_remove = guarantee.epsilon, guarantee.epsilon_add_remove
    both = f" replace-one, {_fmt(add_remove)} add-remove" if add_remove is not None else ""
    delta = guarantee.delta
    local = [c for c in guarantee.clients if c.local_only_files]
    where = (f"; {len(local)} silo(s) keep their files local (only updates leave)" if local else "")
    if any(c.evaluation_epsilon is not None for c in local):
        where += "; training and test records both covered (the larger figure)"
    return [f"  federation guarantee  eps {_fmt(eps)}{both} at delta {delta} per record, the weakest silo's{where}"]


def _release_history_lines(result: Inspection) -> list[str]:
    """Return the releases of the run's records and their total ε per record, when there was more than one."""
    history = result.release_history
    if history is None or all(len(entries) < 2 for entries in history.values()):
        return []
    lines = ["  releases    these records were released more than once (--from-models): each release spends their "
             "privacy again; total exact eps per record = the sum over releases (basic composition)"]
    rows = [[str(client), str(len(entries)),
             " + ".join(f"{r.mechanism}/{r.release} {_fmt(r.exact_epsilon_per_record, 6)}" for r in entries),
             _fmt(total_epsilon(entries), 6)] for client, entries in sorted(history.items())]
    return lines + _table(["client", "releases", "mechanism/release eps", "total eps/record"], rows, indent="    ")


def _fixed_extractor(training: Any) -> str:
    """Return ``; fixed: scattering2d J=2 L=8, group_norm 27 groups`` for a weight-free extractor, else ``""``."""
    fixed = training.get("fixed") if isinstance(training, dict) else None
    if not isinstance(fixed, dict):
        return ""
    norm: dict[str, Any] = fixed["normalization"] if isinstance(fixed.get("normalization"), dict) else {}
    return (f"; fixed, learned from no record: {fixed.get('kind', '?')} J={fixed.get('J', '?')} "
            f"L={fixed.get('L', '?')}, {norm.get('kind', 'no normalization')} {norm.get('groups', '')} groups".rstrip())


def run_lines(result: Inspection) -> list[str]:
    """Return the lines of a run's summary: one row per client, then the run's problems and notes."""
    n_bad = sum(f.status != OK for f in result.files)
    lines = [f"run {result.path}  ({len(result.files)} client files, {n_bad} not ok)"]
    guarantees = [f.guarantee for f in result.files if f.guarantee is not None]
    if guarantees:  # the run's text leads with its weakest client's guarantee
        worst = max(guarantees, key=lambda g: (g.epsilon, g.delta))
        lines.append(f"  {worst.headline()} (the weakest of {len(guarantees)} clients)")
    local = [f.name for f in result.files if f.metadata is not None and f.metadata.local_only]
    if local:
        lines.append(f"  LOCAL ONLY  {len(local)} of {len(result.files)} files are local-only (clean records and true "
                     "labels, --local-only): they must never leave the silo; their guarantee holds if shipped")
    if result.manifest is not None:
        lines.append(f"  manifest  {result.manifest.get('files_listed')} files listed, updated "
                     f"{result.manifest.get('updated_utc', '?')}")
    rows = []
    for f in result.files:
        m, p = f.metadata, f.privacy
        sha = {"ok": "ok", "mismatch": "BAD", "error": "BAD"}.get(f.manifest.status, "-")
        if f.error:
            status = f"ERROR: {f.error_problem}"
        else:
            status = f.status if f.status == OK else f"FLAGGED: {f.flags[0] if f.flags else f.manifest.message}"
        rows.append([
            "?" if m is None else str(m.client_index), f.name, str(f.rows.get("train", "-")),
            str(f.rows.get("test", "-")), _compact_histogram(f.label_histograms.get("train")),
            "-" if m is None else m.release, "-" if m is None else m.mechanism,
            _fmt(None if p is None else p.nominal_epsilon),
            _fmt(None if p is None else p.exact_epsilon_per_record, 6),
            _fmt(None if f.guarantee is None else f.guarantee.epsilon, 6), sha, status])
    lines += _table(["client", "file", "train", "test", "train labels", "release", "mechanism", "nominal eps",
                     "features eps/record", "total eps/record", "sha", "status"], rows)
    flagged = [(f.name, flag) for f in result.files if not f.error for flag in f.flags[1:]]
    if flagged:
        lines.append("more flags")
        lines += [f"  ! {name}: {flag}" for name, flag in flagged]
    if result.problems:
        lines.append("run problems")
        lines += [f"  ! {p}" for p in result.problems]
    elif len([f for f in result.files if f.metadata]) > 1:
        lines.append("  consistency  all readable clients agree on dataset, extractor, encoding, format and mechanism")
    lines += _release_history_lines(result)
    if result.federation is not None and not result.federation.problem:
        fed = result.federation.to_dict()
        evaluated = "" if fed["evaluated_rounds"] == fed["rounds"] else f" ({fed['evaluated_rounds']} evaluated)"
        clean = fed["final_clean_test_accuracy"]
        clean_text = "" if clean is None else f", final clean test accuracy {_fmt(clean)} (the silos' local records)"
        lines.append(f"  federation  {fed['rounds']} rounds{evaluated}, final test accuracy "
                     f"{_fmt(fed['final_test_accuracy'])}, best {_fmt(fed['best_test_accuracy'])}{clean_text}")
        lines += [f"  ! federation  silo {c}: {a} by the aggregation rule in {n} of the {r} rounds it was aggregated in"
                  for c, a, n, r in result.federation.named_outliers]
        lines += result.federation.silos.lines()
        if result.federation.ledger is not None:
            lines += result.federation.ledger.lines()
        lines += _federation_guarantee_lines(result.federation.guarantee)
    lines += [f"  note: {n}" for n in result.notes]
    return lines


def inspection_text(result: Inspection, *, details: bool = False) -> str:
    """Return the human-readable report: a file's full section, or a run's summary table (plus sections)."""
    if result.kind == "file":
        return "\n".join(file_lines(result.files[0]))
    lines = run_lines(result)
    if details:
        for report in result.files:
            lines += ["", *file_lines(report)]
    return "\n".join(lines)
