"""``ldpfl inspect --plot``: one PNG summarizing an :class:`~ldpfl.inspection.report.Inspection`.

Panels, top to bottom:

1. the observed density of 1s over feature x bit position (an l x r heat map; for a run directory it
   pools every readable packed-bit client of the first client's shape), or, for float files, the
   per-feature mean with a band of one standard deviation; for ``stats:K`` files (released statistics, pooled
   over the run's files of the first one's K), two panels instead: the noisy class counts with bars of
   +/- 2 sigma beside the synthetic rows per class (for one file, in place of panel 2), and the eigenvalues
   of the covariance the statistics estimate against the noise's spectral edge
   (``statistics_model.noise_edge``: below it, noise);
2. the label histogram per client (stacked by class; for a single file, train and test per class);
3. test accuracy per round, where ``RUN_DIR/federation/metrics.json`` is present.

matplotlib is imported here only, through its object-oriented API on the Agg canvas (no pyplot, no
global backend switch). The PNG is written to a temporary name and renamed into place.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ldpfl.contract.atomic import atomic_write
from ldpfl.inspection.file import FileReport
from ldpfl.inspection.released import StatisticsSummary, covariance_spectrum, pooled
from ldpfl.inspection.report import Inspection
from ldpfl.mechanisms.statistics_model import noise_edge

DPI = 110


def _bit_panel(ax, fig, reports: list[FileReport]) -> None:
    first = next(r for r in reports if r.bits is not None)
    assert first.bits is not None
    shape = (first.bits.features, first.bits.bits_per_value)
    pooled = [r.bits for r in reports if r.bits is not None and (r.bits.features, r.bits.bits_per_value) == shape]
    rows = sum(bits.total_rows for bits in pooled)
    ones = np.sum([bits.total_ones for bits in pooled], axis=0, dtype=np.int64)
    density = (ones / max(rows, 1)).reshape(shape).T  # (l, r): bit position x feature
    image = ax.imshow(density, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0.0, vmax=1.0)
    ax.set_yticks(range(shape[1]), first.bits.position_labels)
    ax.set_xlabel(f"feature index (r = {shape[0]})")
    ax.set_ylabel("bit position in a value")
    source = f"{len(pooled)} clients pooled" if len(pooled) > 1 else first.name
    mechanism = first.metadata.mechanism if first.metadata else "?"
    ax.set_title(f"Observed density of 1s per feature x bit position ({mechanism}; {source}, {rows} rows)")
    fig.colorbar(image, ax=ax, label="density of 1s", fraction=0.04, pad=0.01)


def _float_panel(ax, reports: list[FileReport]) -> None:
    first = next(r for r in reports if r.floats is not None)
    floats = first.floats
    assert floats is not None
    mean, std = floats.mean, floats.std
    x = np.arange(mean.size)
    ax.plot(x, mean, color="C0", label="mean")
    ax.fill_between(x, mean - std, mean + std, color="C0", alpha=0.25, label="mean +/- std")
    ax.set_xlabel(f"feature index (r = {mean.size})")
    ax.set_ylabel("value")
    mechanism = first.metadata.mechanism if first.metadata else "?"
    ax.set_title(f"Per-feature mean and std of the float32 features ({mechanism}; {first.name}, "
                 f"{floats.rows} rows)")
    ax.legend(loc="upper right")


def _released(reports: list[FileReport]) -> tuple[list[FileReport], list[StatisticsSummary], str]:
    """Return the stats files of the first one's K and classes, their releases, and where the figures come from."""
    found = [r for r in reports if r.released_statistics is not None]
    first = found[0].released_statistics
    assert first is not None
    same = [r for r in found if (s := r.released_statistics) is not None
            and (s.width, s.classes) == (first.width, first.classes)]
    summaries = [r.released_statistics for r in same if r.released_statistics is not None]
    return same, summaries, (f"{len(same)} files pooled" if len(same) > 1 else same[0].name)


def _counts_panel(ax, reports: list[FileReport]) -> None:
    files, summaries, source = _released(reports)
    statistics, scales = pooled(summaries)
    classes = np.arange(statistics.classes)
    rows = np.zeros(statistics.classes, dtype=np.int64)
    for report in files:
        hist = report.label_histograms.get("train", [])
        rows[:len(hist)] += np.asarray(hist[:statistics.classes], dtype=np.int64)
    ax.bar(classes - 0.2, statistics.counts, width=0.4, color="C0", yerr=2 * scales.counts, capsize=3,
           label=f"released noisy count +/- 2 sigma (sigma {scales.counts:.3g})")
    ax.bar(classes + 0.2, rows, width=0.4, color="C1", label="synthetic rows in the file(s)")
    ax.axhline(0.0, color="black", linewidth=0.6)
    ax.set_xticks(classes)
    ax.set_xlabel("class")
    ax.set_ylabel("records")
    ends = np.concatenate([statistics.counts - 2 * scales.counts, statistics.counts + 2 * scales.counts, rows])
    ends = ends[np.isfinite(ends)]
    if ends.size:  # room for the legend above the bars
        ax.set_ylim(min(0.0, float(ends.min()) * 1.1), float(ends.max()) * 1.25 + 1)
    ax.set_title(f"Released class counts and the synthetic rows drawn from them (stats:{summaries[0].width}; "
                 f"{source})")
    ax.legend(loc="upper right")


def _spectrum_panel(ax, reports: list[FileReport]) -> None:
    _, summaries, source = _released(reports)
    statistics, scales = pooled(summaries)
    values = covariance_spectrum(statistics)
    records = float(np.maximum(statistics.counts, 1.0).sum())
    edge = noise_edge(scales, records, statistics.classes, statistics.width)
    index = np.arange(1, values.size + 1)
    above = values > edge
    ax.plot(index[above], values[above], "o", markersize=3, color="C3", label=f"{int(above.sum())} above the edge")
    ax.plot(index[~above], values[~above], "o", markersize=3, color="C7", label="within the noise")
    ax.axhspan(-edge, edge, color="C7", alpha=0.15, label=f"noise spectrum, edge +/- {edge:.3g}")
    ridge = summaries[0].shrinkage * edge
    ax.axhline(ridge, color="C2", linestyle="--", linewidth=1, label=f"ridge {ridge:.3g}")
    ax.set_xlabel(f"eigenvalue rank (K = {statistics.width})")
    ax.set_ylabel("eigenvalue")
    ax.set_title(f"Eigenvalues of the within-class covariance the released statistics estimate ({source}, "
                 f"{records:.0f} records)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right")


def _label_panel(ax, reports: list[FileReport]) -> None:
    readable = [r for r in reports if r.label_histograms]
    classes = max(len(h) for r in readable for h in r.label_histograms.values())
    colors = [_class_color(k, classes) for k in range(classes)]
    if len(readable) == 1:
        report = readable[0]
        width = 0.4
        for i, (split, hist) in enumerate(report.label_histograms.items()):
            ax.bar(np.arange(len(hist)) + (i - 0.5) * width, hist, width=width, label=split)
        ax.set_ylim(0, max(max(h) for h in report.label_histograms.values()) * 1.25 + 1)  # room for the legend
        ax.set_xticks(range(classes))
        ax.set_xlabel("class")
        ax.set_ylabel("rows")
        ax.set_title(f"Label histogram of {report.name} per split")
        ax.legend(loc="upper right")
        return
    bottom = np.zeros(len(readable))
    names = [r.name.removesuffix(".h5") for r in readable]
    counts = np.zeros((len(readable), classes), dtype=np.int64)
    for i, r in enumerate(readable):
        for hist in r.label_histograms.values():
            counts[i, :len(hist)] += hist
    for k in range(classes):
        ax.bar(names, counts[:, k], bottom=bottom, color=colors[k], label=f"class {k}")
        bottom += counts[:, k]
    ax.set_xlabel("client file")
    ax.set_ylabel("rows (train + test)")
    ax.set_title("Label histogram per client (stacked by class)")
    if classes <= 20:  # one legend row above the bars, inside the axes
        ax.set_ylim(0, bottom.max() * (1.15 + 0.1 * (classes > 10)))
        ax.legend(loc="upper center", ncols=min(classes, 10), fontsize="small")
    ax.tick_params(axis="x", labelrotation=45 if len(readable) > 8 else 0)


def _class_color(k: int, classes: int):
    from matplotlib import colormaps

    if classes <= 10:
        return colormaps["tab10"](k)
    if classes <= 20:
        return colormaps["tab20"](k)
    return colormaps["viridis"](k / max(classes - 1, 1))


def _accuracy_panel(ax, inspection: Inspection) -> None:
    from matplotlib.ticker import MaxNLocator

    fed = inspection.federation
    assert fed is not None
    points = [(r, a) for r, a in zip(fed.rounds, fed.test_accuracy, strict=True) if a is not None]
    ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, color="C2")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0.0, 1.0)
    ax.grid(alpha=0.3)
    ax.set_title(f"Federated test accuracy per round (final {points[-1][1]:.3f})" if points
                 else "Federated test accuracy per round")


def write_plot(inspection: Inspection, out: str | os.PathLike) -> Path:
    """Draw the panels that the inspection supports into a PNG at ``out`` (written atomically).

    Raises
    ------
    ValueError
        When the directory of ``out`` does not exist, or no file could be read (nothing to draw).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = Path(out)
    if not out.parent.is_dir():
        raise ValueError(f"{out}: directory {out.parent} does not exist")
    readable = [r for r in inspection.files if r.metadata is not None and (r.bits or r.floats)]
    if not readable:
        raise ValueError(f"{out}: nothing to plot, no file of {inspection.path} could be read")
    fed = inspection.federation
    panels: list[Callable[[Any], None]] = [  # each draws on its axes (``fig`` is bound below, before any is called)
        (lambda ax: _bit_panel(ax, fig, readable)) if any(r.bits for r in readable)
        else (lambda ax: _float_panel(ax, readable)),
        lambda ax: _label_panel(ax, readable)]
    if any(r.released_statistics is not None for r in readable):  # stats:K files: what was released
        panels[:1] = [lambda ax: _counts_panel(ax, readable), lambda ax: _spectrum_panel(ax, readable)]
        if len(readable) == 1:  # the counts panel shows the file's rows per class already
            panels.pop()
    if fed is not None and not fed.problem and any(a is not None for a in fed.test_accuracy):
        panels.append(lambda ax: _accuracy_panel(ax, inspection))
    fig = Figure(figsize=(12, 3.6 * len(panels)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    for ax, panel in zip(axes, panels, strict=True):
        panel(ax)
    fig.suptitle(f"ldpfl inspect: {inspection.path}")
    return atomic_write(out, lambda handle: fig.savefig(handle, format="png", dpi=DPI))
