"""Experiment 2: Wu, Xu, Zhu (Appl. Sci. 2023), personalized ε on Fashion-MNIST.

IID (5.2.1, Fashion-MNIST): N = 3 clients, R = 20 rounds, batch 50, test size 600, δ_i = 1/1000,
q = 0.9, c = 2, logistic regression trained by SGD; Gaussian perturbation of the clipped parameters
with σ of eq. 4 (``--perturbation gaussian-wu``); budgets {0.05, 0.05, 1}, {0.05, 0.5, 1},
{0.05, 1, 1} (``--budget-preset wu-fmnist-iid-LLH/LMH/LHH``); aggregation A = arithmetic mean
(``fedavg``), B = weighted (``weighted``), C = probability-based selection (``probability``).
Paper: C and B beat A by +3.93 and +3.04 percentage points on Fashion-MNIST; 73.1 % without noise.
Run twice: over the raw pixels (``--extractor none --mechanism none``, the paper's setting) and over
the flatten features of LDPFL's Fig. 4 CNN (``--extractor cifar-cnn --mechanism none``).

Non-IID (5.3.1, Fashion-MNIST): N = 10 Dirichlet clients, R = 10, batch 200, test size 1,200,
δ_i = 1e-5, c = 4, Δ2 = 8, ldpsign with sign aggregation; budgets wu-fmnist-LH and wu-fmnist-LMH.
Paper: C beats A by +19.85 pp on Fashion-MNIST; 49.8 % without perturbation.

Each client holds 1,000 training records (δ_i = 1/|D_i| = 1/1000) and the test splits sum to 600
(IID) or 1,200 (non-IID), as in the paper. The learning rate: the paper uses scikit-learn's
"optimal" schedule; we use plain SGD with lr 0.01 (chosen on the noise-free IID run, seed 1).

Scales: the paper's scale is small already, so ``cpu`` and ``gpu`` differ only in the CNN epochs of
the CNN-feature run (cpu 8, gpu 50) and in local epochs (both 1: the paper does not give them).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

NAME = "exp2_wu_personalized"
SCALES = {
    "cpu": {"cnn_epochs": 8, "local_epochs": 1, "iid_rounds": 20, "noniid_rounds": 10},
    "gpu": {"cnn_epochs": 50, "local_epochs": 1, "iid_rounds": 20, "noniid_rounds": 10},
}
IID_PRESETS = ("wu-fmnist-iid-LLH", "wu-fmnist-iid-LMH", "wu-fmnist-iid-LHH")
NONIID_PRESETS = ("wu-fmnist-LH", "wu-fmnist-LMH")
# Supplement (not in the paper): budgets large enough for eq. 4's σ to leave a model to learn
# (σ = 6.06, 0.29, 0.052), to show what the aggregation rules do when the noise is not overwhelming.
SUPPLEMENT_BUDGETS = "10,100,500"
AGGREGATIONS = {"A": "fedavg", "B": "weighted", "C": "probability"}
PAPER = {
    "iid_gain_pp": {"B": 3.04, "C": 3.93},
    "iid_no_noise": 0.731,
    "noniid_gain_pp": {"C": 19.85},
    "noniid_no_perturbation": 0.498,
}
# Records: 3 clients x 1,200 (1,000 train + 200 test); 10 clients x 1,200 (1,080 + 120).
IID_EXPORT = ["--dataset", "fashion-mnist", "--clients", 3, "--limit", 3600, "--test-fraction", 0.16667,
              "--mechanism", "none"]
NONIID_EXPORT = ["--dataset", "fashion-mnist", "--clients", 10, "--partition", "dirichlet", "--beta", 0.5,
                 "--limit", 12000, "--test-fraction", 0.1, "--extractor", "none", "--mechanism", "none"]
COMMON = ["--hidden", "none", "--optimizer", "sgd", "--lr", 0.01, "--threads", 1]


def iid_block(run_dir: Path, work: Path, tag: str, scale: dict, seed: int,
              presets: tuple[str, ...] = IID_PRESETS, baseline: bool = True) -> dict:
    fed = COMMON + ["--rounds", scale["iid_rounds"], "--local-epochs", scale["local_epochs"], "--batch-size", 50]
    noise = ["--perturbation", "gaussian-wu", "--clip", 2, "--sample-rate", 0.9, "--delta", 0.001]
    out = {"no_noise": C.federate(run_dir, work / f"{tag}-none", fed, seed=seed) if baseline else None,
           "presets": {}}
    for preset in presets:
        out["presets"][preset] = {
            label: C.federate(run_dir, work / f"{tag}-{preset}-{agg}",
                              fed + noise + ["--aggregation", agg, _budget_option(preset), preset], seed=seed)
            for label, agg in AGGREGATIONS.items()}
    return out


def _budget_option(value: str) -> str:
    return "--client-epsilons" if value[0].isdigit() else "--budget-preset"


def noniid_block(run_dir: Path, work: Path, scale: dict, seed: int) -> dict:
    fed = COMMON + ["--rounds", scale["noniid_rounds"], "--local-epochs", scale["local_epochs"],
                    "--batch-size", 200]
    noise = ["--perturbation", "ldpsign", "--clip", 4, "--sensitivity", 8, "--delta", 1e-5]
    out = {"no_perturbation": C.federate(run_dir, work / "noniid-none", fed, seed=seed), "presets": {}}
    for preset in NONIID_PRESETS:
        out["presets"][preset] = {
            label: C.federate(run_dir, work / f"noniid-{preset}-{agg}",
                              fed + noise + ["--aggregation", agg, "--budget-preset", preset], seed=seed)
            for label, agg in AGGREGATIONS.items()}
    return out


def gains(block: dict) -> dict:
    """Final accuracy per preset and aggregation, and the gain of B and C over A in percentage points."""
    rows = {}
    for preset, runs in block["presets"].items():
        acc = {label: r["final_accuracy"] for label, r in runs.items()}
        rows[preset] = {"final": acc, "gain_pp": {k: round(100 * (acc[k] - acc["A"]), 2) for k in ("B", "C")}}
    mean = {k: round(sum(r["gain_pp"][k] for r in rows.values()) / len(rows), 2) for k in ("B", "C")}
    return {"per_preset": rows, "mean_gain_pp": mean}


def plot(results: dict, path: Path) -> None:
    plt = C.pyplot()
    blocks = [("iid_raw", "IID, raw pixels", IID_PRESETS), ("iid_cnn", "IID, CNN features", IID_PRESETS),
              ("noniid", "non-IID (Dirichlet), ldpsign", NONIID_PRESETS)]
    if "supplement" in results:
        blocks.append(("supplement", f"IID raw, budgets {{{SUPPLEMENT_BUDGETS}}} (not in paper)",
                       (SUPPLEMENT_BUDGETS,)))
    rows = 2 if len(blocks) > 3 else 1
    cols = -(-len(blocks) // rows)
    fig, grid = plt.subplots(rows, cols, figsize=(6 * cols, 4.4 * rows), squeeze=False)
    axes = grid.ravel()
    colours = {"A": "tab:blue", "B": "tab:orange", "C": "tab:green"}
    styles = ["-", "--", ":"]
    for ax, (key, title, presets) in zip(axes, blocks, strict=False):
        block = results[key]
        ref = block.get("no_noise") or block.get("no_perturbation")
        ax.plot(range(1, len(ref["accuracy"]) + 1), ref["accuracy"], color="black", lw=1.2,
                label="no perturbation (fedavg)")
        for style, preset in zip(styles, presets, strict=False):
            for label, run in block["presets"][preset].items():
                ax.plot(range(1, len(run["accuracy"]) + 1), run["accuracy"], color=colours[label], ls=style,
                        label=f"{label} {preset.split('-')[-1] if preset[0].isalpha() else ''}")
        ax.axhline(0.1, color="grey", lw=0.6, ls="-.")
        ax.set_title(title)
        ax.set_xlabel("round")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    for ax in grid[:, 0]:
        ax.set_ylabel("test accuracy")
    for ax in axes[len(blocks):]:
        ax.set_visible(False)
    for ax in axes[:len(blocks)]:
        ax.legend(fontsize=7, ncol=2, loc="upper left")
    fig.suptitle("Wu et al. on Fashion-MNIST: A = arithmetic mean, B = weighted, C = probability-based selection\n"
                 "(line style: budget preset; grey dash-dot: chance)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(results: dict) -> str:
    md = []
    for key, title in (("iid_raw", "IID, logistic regression over raw pixels (gaussian-wu, eq. 4 σ)"),
                       ("iid_cnn", "IID, logistic regression over Fig. 4 CNN features (gaussian-wu, eq. 4 σ)"),
                       ("noniid", "non-IID Dirichlet(0.5), logistic regression, ldpsign"),
                       ("supplement", f"Supplement (not in the paper): IID raw pixels, gaussian-wu, budgets "
                                      f"{{{SUPPLEMENT_BUDGETS}}}")):
        if key not in results:
            continue
        block = results[key]
        g = results["gains"][key]
        ref = block.get("no_noise") or block.get("no_perturbation")
        rows = []
        for preset, row in g["per_preset"].items():
            f = row["final"]
            rows.append([preset, C.pct(f["A"]), C.pct(f["B"]), C.pct(f["C"]),
                         f"{row['gain_pp']['B']:+.1f}", f"{row['gain_pp']['C']:+.1f}"])
        rows.append(["mean gain", "", "", "", f"{g['mean_gain_pp']['B']:+.1f}", f"{g['mean_gain_pp']['C']:+.1f}"])
        md.append(f"**{title}** (no perturbation: {C.pct(ref['final_accuracy'])})\n\n")
        md.append(C.markdown_table(["budgets", "A", "B", "C", "B − A (pp)", "C − A (pp)"], rows))
        md.append("\n")
    return "".join(md)


def main() -> None:
    p = C.parser(__doc__)
    p.add_argument("--part", choices=("all", "supplement"), default="all",
                   help="supplement: only the budgets-{10,100,500} IID run, added to an existing result file")
    args = p.parse_args()
    scale = SCALES[args.scale]
    work = args.work / NAME / args.scale
    path = args.out / f"{NAME}.json"
    if args.part == "supplement":
        import json

        results = json.loads(path.read_text())
        start = time.perf_counter()
        raw = C.export(work / "fmnist-3-raw", IID_EXPORT + ["--extractor", "none"], seed=args.seed)
        results["supplement"] = iid_block(Path(raw["run_dir"]), work / "fed", "raw", scale, args.seed,
                                          presets=(SUPPLEMENT_BUDGETS,), baseline=False)
        results["supplement"]["no_noise"] = results["iid_raw"]["no_noise"]
        results["gains"]["supplement"] = gains(results["supplement"])
        results["supplement_invocation_seconds"] = round(time.perf_counter() - start, 1)
        plot(results, args.out / f"{NAME}.png")
        C.write_results(args.out, NAME, results, markdown(results))
        return
    results = C.experiment_header(NAME, args, scale)
    results["paper"] = PAPER
    start = time.perf_counter()

    raw = C.export(work / "fmnist-3-raw", IID_EXPORT + ["--extractor", "none"], seed=args.seed)
    cnn = C.export(work / "fmnist-3-cnn", IID_EXPORT + ["--extractor", "cifar-cnn", "--epochs", scale["cnn_epochs"]],
                   seed=args.seed)
    noniid = C.export(work / "fmnist-10-dirichlet", NONIID_EXPORT, seed=args.seed)
    results["exports"] = {"iid_raw": raw, "iid_cnn": cnn, "noniid": noniid}
    results["iid_raw"] = iid_block(Path(raw["run_dir"]), work / "fed", "raw", scale, args.seed)
    results["iid_cnn"] = iid_block(Path(cnn["run_dir"]), work / "fed", "cnn", scale, args.seed)
    results["noniid"] = noniid_block(Path(noniid["run_dir"]), work / "fed", scale, args.seed)
    results["gains"] = {k: gains(results[k]) for k in ("iid_raw", "iid_cnn", "noniid")}
    results["invocation_seconds"] = round(time.perf_counter() - start, 1)

    plot(results, args.out / f"{NAME}.png")
    C.write_results(args.out, NAME, results, markdown(results))


if __name__ == "__main__":
    main()
