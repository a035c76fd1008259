"""Plot of experiment 7 (docs/results/exp7_private_front.png) from its JSON results.

Run from the repository root: python experiments/exp7_plot.py
"""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

R = "docs/results/"
fm = json.load(open(R + "exp7_private_front_fashion-mnist.json"))["rows"]
lr = json.load(open(R + "exp7_private_front_fashion-mnist_lr0.0001.json"))["rows"]
mn = json.load(open(R + "exp7_private_front_mnist5k.json"))["rows"]
fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
for ax, rows, extra, title in ((axes[0], fm, lr, "Fashion-MNIST, 10 silos"), (axes[1], mn, [], "MNIST-5k, 2 silos")):
    def series(rs, key):
        rs = sorted(rs, key=lambda r: r["total_epsilon"])
        return [r["total_epsilon"] for r in rs], [100 * r[key] for r in rs]
    lab = [r for r in rows if r["release"] == "label"]
    sco = [r for r in rows if r["release"] == "scores"]
    ax.plot(*series(lab, "dp_cnn_alone"), "k-o", label="each silo's DP CNN alone")
    ax.plot(*series(lab, "clean_test"), "C0-s", label="federated, label/krr (lr 1e-3)")
    if extra:
        ax.plot(*series(extra, "clean_test"), "C2--^", label="federated, label/krr (lr 1e-4)")
    ax.plot(*series(sco, "clean_test"), "C3-v", label="federated, scores/hybrid")
    ax.axhline(80, color="grey", lw=0.8, ls=":")
    ax.axvline(8, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("total ε per record over everything released (δ = 1e-5)")
    ax.set_title(title)
axes[0].axhline(83.3, color="C1", lw=1, ls="--", label="non-private CNN alone (ε = ∞ if released)")
axes[0].set_ylabel("accuracy on clean held-out records (%)")
axes[0].legend(fontsize=8, loc="lower right")
fig.suptitle("The honest front: DP-SGD CNN + k-RR labels + one randomized value per record (seed 22)")
fig.tight_layout()
fig.savefig(R + "exp7_private_front.png", dpi=110)
