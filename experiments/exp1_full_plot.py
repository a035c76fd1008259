"""Plot Table I at full scale: federated test accuracy per round of one or more federations, beside the
clients' own CNNs and the paper's ~81 %.

    python experiments/exp1_full_plot.py --run "50 CNN epochs=runs/fed_t1_50ep/metrics.json" \
        --cnn-accuracy 0.85 --out docs/results/exp1_fmnist_50ep.png

Each ``--run LABEL=METRICS_JSON`` is a federation's ``metrics.json``; the plot shows its test accuracy
(and training accuracy, dashed) per round. ``--cnn-accuracy`` draws the clients' mean local CNN accuracy.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PAPER_TABLE_I = 0.81  # LDPFL Table I, Fashion-MNIST, UER ε = 0.5


def curve(path: Path) -> tuple[list[int], list[float], list[float]]:
    """Rounds, test accuracies and training accuracies of one federation's metrics.json."""
    rounds = json.loads(path.read_text())["rounds"]
    return ([r["round"] for r in rounds], [r["test_accuracy"] for r in rounds],
            [r["train_accuracy"] for r in rounds])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="append", required=True, metavar="LABEL=METRICS_JSON")
    parser.add_argument("--cnn-accuracy", type=float, help="the clients' mean local CNN accuracy (a line)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    figure, axis = plt.subplots(figsize=(7, 4.2))
    for spec in args.run:
        label, _, path = spec.partition("=")
        rounds, test, train = curve(Path(path))
        line, = axis.plot(rounds, [100 * a for a in test], marker="o", markersize=3, label=f"{label}: test")
        axis.plot(rounds, [100 * a for a in train], linestyle="--", color=line.get_color(), alpha=0.6,
                  label=f"{label}: training records")
    axis.axhline(100 * PAPER_TABLE_I, color="black", linewidth=0.8, linestyle=":", label="paper, Table I (~81 %)")
    if args.cnn_accuracy is not None:
        axis.axhline(100 * args.cnn_accuracy, color="grey", linewidth=0.8, label="clients' own CNNs (mean)")
    axis.set_xlabel("round")
    axis.set_ylabel("accuracy (%)")
    axis.set_ylim(0, 100)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, loc="lower right")
    axis.set_title("LDPFL Table I at full scale: Fashion-MNIST, 10 clients, UER ε = 0.5, α = 10")
    figure.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out, dpi=120)
    print(args.out)


if __name__ == "__main__":
    main()
