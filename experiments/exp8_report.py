"""The front of issue 34 as one JSON, a markdown table and a PNG, from ``exp8_shared_features.py``'s records.

Reads ``docs/results/exp8_shared_features_*.json`` (alone, federated, central), ``exp10_released_stats_*.json``
(issue 40: ``released-stats``, ``released-stats-fc``, ``released-stats-alone``; the first release, moments about
the origin, as ``released-stats-origin*`` from ``*_origin.json``) and the measured LDPFL private
configurations of section 6 (``exp7_private_front_fashion-mnist.json``: label/krr rows at the default stage-2
learning rate, IID, seed 22; their total ε is replace-one and has no add/remove figure: k-RR parts). Writes:

* ``docs/results/exp8_front.json``: one record per (dataset, partition, setting, seed), with ``dataset``,
  ``partition``, ``setting``, ``seed``, ``epsilon_add_remove``, ``epsilon_replace_one``, ``delta``, ``accuracy``;
* ``docs/results/exp8_front.md``: mean accuracy per (partition, ε, setting) with its standard error (over seeds
  where there are several, else the binomial one of the 10,000 test records);
* ``docs/results/exp8_front.png``: accuracy against the per-silo ε, one panel per partition.

    python experiments/exp8_report.py --results docs/results
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

TEST_ROWS = {"fashion-mnist": 10_000, "mnist5k": 1_000}
"""The records each accuracy is measured on (the binomial standard error of a one-seed row)."""
HELD_OUT_ROWS = 7_000  # section 6 and the papers' rows: the 10 clients' clean held-out records
HELD_OUT_SETTINGS = ("ldpfl-best", "wu-gaussian", "pldp-pdpm", "dp-fedaw")
SETTINGS = ("alone", "federated", "central", "released-stats", "released-stats-fc", "released-stats-alone",
            "released-stats-origin", "released-stats-origin-fc", "released-stats-origin-alone",
            "ldpfl-best", "wu-gaussian", "pldp-pdpm", "dp-fedaw")
COLOURS = {"alone": "tab:orange", "federated": "tab:blue", "central": "tab:green", "ldpfl-best": "tab:red",
           "wu-gaussian": "tab:purple", "pldp-pdpm": "tab:brown", "dp-fedaw": "tab:gray",
           "released-stats": "tab:cyan", "released-stats-fc": "tab:olive", "released-stats-alone": "tab:pink",
           "released-stats-origin": "lightblue", "released-stats-origin-fc": "khaki",
           "released-stats-origin-alone": "mistyrose"}
TOTAL_EPSILON = ("ldpfl-best",)
"""Settings whose x is a total replace-one ε (k-RR parts), not a per-silo add/remove ε. The papers' perturbations
are at the DP-SGD rows' ε: their ledger's figure (a silo's whole update) bounds a record's under both relations."""


def load(results: Path) -> list[dict]:
    records = []
    for path in sorted(results.glob("exp8_shared_features_*.json")):
        records += [r for r in json.loads(path.read_text()) if not r.get("tuning")]
    for path in sorted(results.glob("exp10_released_stats_*.json")):  # issue 40: the one-shot statistics release
        records += json.loads(path.read_text())
    exp7 = results / "exp7_private_front_fashion-mnist.json"
    if exp7.exists():
        for row in json.loads(exp7.read_text())["rows"]:
            if row["release"] == "label" and row.get("fed_lr") is None and row.get("models_from") is None:
                records.append({"dataset": "fashion-mnist", "partition": "iid", "setting": "ldpfl-best", "seed": 22,
                                "epsilon_add_remove": None, "epsilon_replace_one": row["total_epsilon"],
                                "delta": row["delta"], "accuracy": row["clean_test"],
                                "source": "docs/RESULTS.md section 6 (exp7_private_front.py): DP CNN + k-RR label "
                                          "and predicted class, Table I federation; clean held-out records"})
    return records


def summary(records: list[dict]) -> dict[tuple, tuple[float, float, int, float, float | None]]:
    """(dataset, partition, setting, target ε) → (mean accuracy, standard error, seeds, ε replace-one, add-remove)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        eps = r.get("epsilon_add_remove_target", r.get("epsilon_replace_one"))
        groups[(r["dataset"], r["partition"], r["setting"], round(float(eps), 3))].append(r)
    out = {}
    for key, rows in groups.items():
        acc = [r["accuracy"] for r in rows]
        mean = sum(acc) / len(acc)
        if len(acc) > 1:
            se = math.sqrt(sum((a - mean) ** 2 for a in acc) / (len(acc) - 1) / len(acc))
        else:
            rows_measured = HELD_OUT_ROWS if key[2] in HELD_OUT_SETTINGS else TEST_ROWS[key[0]]
            se = math.sqrt(mean * (1 - mean) / rows_measured)
        out[key] = (mean, se, len(acc), rows[0]["epsilon_replace_one"], rows[0].get("epsilon_add_remove"))
    return out


def table(stats: dict) -> str:
    lines = ["| dataset | partition | ε add/remove (replace-one) | setting | accuracy ± s.e. | seeds |",
             "|---|---|---|---|---:|---:|"]
    for (dataset, partition, setting, _eps), (mean, se, n, ro, ar) in sorted(
            stats.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][3], SETTINGS.index(kv[0][2]))):
        shown = f"{ar:.3g} ({ro:.3g})" if ar is not None else f"— ({ro:.3g}, total)"
        lines.append(f"| {dataset} | {partition} | {shown} | {setting} | {100 * mean:.1f} % ± {100 * se:.1f} | {n} |")
    return "\n".join(lines)


def plot(stats: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter

    stats = {k[1:]: v for k, v in stats.items() if k[0] == "fashion-mnist"}
    partitions = sorted({k[0] for k in stats if k[0] != "pooled"})
    figure = Figure(figsize=(5 * len(partitions), 4.2), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(partitions), squeeze=False)[0]
    for axis, partition in zip(axes, partitions, strict=True):
        for setting in SETTINGS:
            source = "pooled" if setting == "central" else partition
            points = sorted((k[2], v) for k, v in stats.items() if k[0] == source and k[1] == setting)
            if not points:
                continue
            x = [e for e, _ in points]
            axis.errorbar(x, [100 * v[0] for _, v in points], yerr=[100 * v[1] for _, v in points], marker="o",
                          capsize=3, color=COLOURS[setting],
                          label=setting + (" (x: total replace-one ε)" if setting in TOTAL_EPSILON else ""))
        axis.set_xscale("log")
        axis.set_xticks([1, 2, 3, 5, 8, 16])
        axis.set_xticklabels(["1", "2", "3", "5", "8", "16"])
        axis.xaxis.set_minor_formatter(NullFormatter())
        axis.set_xlabel("ε per silo (add/remove, δ = 1e-5)")
        axis.set_ylabel("accuracy (%): 10,000 test records; ldpfl-best, papers: 7,000 held out")
        axis.set_title(f"Fashion-MNIST, 10 silos, {partition}")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("docs/results"))
    args = parser.parse_args()
    records = load(args.results)
    keys = ("dataset", "partition", "setting", "seed", "epsilon_add_remove", "epsilon_replace_one", "delta",
            "accuracy")
    front = [{**{k: r.get(k) for k in keys}, **{k: v for k, v in r.items() if k not in keys}} for r in records]
    (args.results / "exp8_front.json").write_text(json.dumps(front, indent=1))
    stats = summary(records)
    (args.results / "exp8_front.md").write_text(table(stats) + "\n")
    plot(stats, args.results / "exp8_front.png")
    print(table(stats))


if __name__ == "__main__":
    main()
