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

``--part sweep`` (a deviation from the paper, written to ``exp2_wu_sweep.*``): under the paper's budgets
eq. 4 gives σ ≥ 377 and every run sits at chance, so the IID raw-pixel setting is run again with the three
presets' budgets multiplied by ``--factors`` (default 500: 500 x the presets' largest ε = 1 is ldpfl's
largest ε), A, B and C each, over ``--seeds`` (federation seeds; the export keeps ``--seed``), to find
where the private model learns and whether C ≥ B ≥ A shows there beyond the seed spread;
``--probe-factors`` (default 100) run at the first seed only, to show where it does not learn yet.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

from ldpfl.stage2_federate.budgets import get_preset  # noqa: E402

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


# --- --part sweep: the IID presets' budgets scaled up (deviation from the paper) ---------------------------

SWEEP_NAME = "exp2_wu_sweep"
SWEEP_FACTORS = (500,)  # 500 x the presets' largest ε (1) = ldpfl's largest ε (MAX_EPSILON)
SWEEP_PROBE_FACTORS = (100,)  # run at the first seed only, to locate where the model starts learning
SWEEP_SEEDS = (1, 2, 3)
ORDERINGS = (("B", "A"), ("C", "B"), ("C", "A"))  # the paper's C ≥ B ≥ A, pair by pair


def scaled_budgets(preset: str, factor: float) -> list[float]:
    return [round(factor * v, 10) for v in get_preset(preset).values]


def aggregate_noise(sigmas: list[float]) -> dict:
    """Std of the noise the server's aggregate carries per parameter in one round, for A, B and C.

    A: α_i = 1/n (eq. 12), so √(Σσ_i²)/n. B: α_i = ρ_i/Σρ with ρ_i = 1/σ_i (eq. 11), so α_i·σ_i = 1/Σρ
    and the total is √n/Σρ. C: clients with P_i > ω (eq. 14, P_i = α_i), ω ~ U[0, max P) (draw_omega),
    keeps the k clients of largest P_i (largest ε) with probability (P_(k) − P_(k+1))/P_(1); their plain mean
    has variance Σ_{j≤k} σ_(j)²/k². The noise stays in the parameters the next round starts from, so
    the per-round RMS is what accumulates.
    """
    s = np.asarray(sigmas, dtype=np.float64)
    n = s.size
    rho = 1.0 / s
    order = np.argsort(-rho, kind="stable")
    p = rho[order] / rho.sum()
    chance = (p - np.append(p[1:], 0.0)) / p[0]  # P(exactly the top k are selected)
    std_k = np.sqrt(np.cumsum(s[order] ** 2)) / np.arange(1, n + 1)
    keep = chance > 0
    return {"A": float(np.sqrt(np.sum(s**2)) / n), "B": float(np.sqrt(n) / rho.sum()),
            "C_rms": float(np.sqrt(np.sum(chance * std_k**2))),
            "C_selections": [{"clients": int(k), "probability": float(c), "std": float(v)}
                             for k, c, v in zip(np.arange(1, n + 1)[keep], chance[keep], std_k[keep], strict=True)]}


def sweep_cell(runs: dict) -> dict:
    """Final accuracy per aggregation and the paired (same-seed) differences, mean ± s.e. over seeds."""
    final = {k: np.array([r["final_accuracy"] for r in v]) for k, v in runs.items()}
    last5 = {k: np.array([np.mean(r["accuracy"][-5:]) for r in v]) for k, v in runs.items()}
    diffs = {f"{x}-{y}": C.seed_stats(final[x] - final[y]) for x, y in ORDERINGS}
    return {"final": {k: C.seed_stats(v) for k, v in final.items()},
            "last5_mean": {k: C.seed_stats(v) for k, v in last5.items()},
            "diff": diffs, "verdict": {k: C.verdict(v) for k, v in diffs.items()},
            "final_per_seed": {k: v.tolist() for k, v in final.items()}}


def sweep_block(run_dir: Path, work: Path, scale: dict, factors, probe_factors, seeds) -> dict:
    fed = COMMON + ["--rounds", scale["iid_rounds"], "--local-epochs", scale["local_epochs"], "--batch-size", 50]
    noise = ["--perturbation", "gaussian-wu", "--clip", 2, "--sample-rate", 0.9, "--delta", 0.001]
    out = {"no_noise": [C.federate(run_dir, work / f"none-s{seed}", fed, seed=seed) for seed in seeds[:1]],
           "cells": []}
    grid = [(f, seeds[:1]) for f in probe_factors] + [(f, seeds) for f in factors]
    for factor, cell_seeds in sorted(grid):
        for preset in IID_PRESETS:
            budgets = ",".join(f"{e:g}" for e in scaled_budgets(preset, factor))
            runs = {label: [C.federate(run_dir, work / f"x{factor:g}-{preset.split('-')[-1]}-{agg}-s{seed}",
                                       fed + noise + ["--aggregation", agg, "--client-epsilons", budgets],
                                       seed=seed) for seed in cell_seeds]
                    for label, agg in AGGREGATIONS.items()}
            sigmas = runs["A"][0]["resolved"]["noise_scales"]  # eq. 4 σ_i as the run resolved them
            out["cells"].append({"factor": factor, "preset": preset, "epsilons": scaled_budgets(preset, factor),
                                 "sigmas": sigmas, "aggregate_noise": aggregate_noise(sigmas),
                                 **sweep_cell(runs), "runs": runs})
    out["no_noise_final"] = C.seed_stats([r["final_accuracy"] for r in out["no_noise"]])
    # Mean over the three presets per seed, then mean ± s.e. over seeds (the paper reports preset means).
    out["pooled"] = {}
    for factor, _ in sorted(grid):
        cells = [c for c in out["cells"] if c["factor"] == factor]
        per_seed = {k: np.mean([c["final_per_seed"][k] for c in cells], axis=0) for k in AGGREGATIONS}
        diffs = {f"{x}-{y}": C.seed_stats(per_seed[x] - per_seed[y]) for x, y in ORDERINGS}
        out["pooled"][f"{factor:g}"] = {"final": {k: C.seed_stats(v) for k, v in per_seed.items()}, "diff": diffs,
                                        "verdict": {k: C.verdict(v) for k, v in diffs.items()}}
    return out


def _pm(stats: dict, scale: float = 100.0, digits: int = 1) -> str:
    mean = f"{scale * stats['mean']:.{digits}f}"
    return f"{mean} (one seed)" if stats["se"] is None else f"{mean} ± {scale * stats['se']:.{digits}f}"


def sweep_markdown(block: dict) -> str:
    seeds = max(c["final"]["A"]["n"] for c in block["cells"])
    head = ["factor", "budgets ε_i", "σ_i (eq. 4)", "aggregate noise A / B / C (RMS)", "A (%)", "B (%)", "C (%)",
            "B − A (pp)", "C − B (pp)", "B > A", "C > B"]
    rows = []
    for c in block["cells"]:
        n = c["aggregate_noise"]
        rows.append([f"×{c['factor']:g}", "{" + ", ".join(f"{e:g}" for e in c["epsilons"]) + "}",
                     ", ".join(f"{s:.3g}" for s in c["sigmas"]),
                     f"{n['A']:.3g} / {n['B']:.3g} / {n['C_rms']:.3g}",
                     *(_pm(c["final"][k]) for k in AGGREGATIONS), _pm(c["diff"]["B-A"]), _pm(c["diff"]["C-B"]),
                     c["verdict"]["B-A"], c["verdict"]["C-B"]])
    pooled = [[f"×{f}", _pm(p["final"]["A"]), _pm(p["final"]["B"]), _pm(p["final"]["C"]), _pm(p["diff"]["B-A"]),
               _pm(p["diff"]["C-B"]), _pm(p["diff"]["C-A"]), p["verdict"]["B-A"], p["verdict"]["C-B"],
               p["verdict"]["C-A"]] for f, p in block["pooled"].items()]
    return (f"Final test accuracy after round 20, mean ± standard error over {seeds} federation seeds "
            f"(no perturbation, fedavg: {_pm(block['no_noise_final'])} %). Differences are paired by seed; "
            "an ordering is 'seen' where the mean difference exceeds 2 standard errors, 'contradicted' where "
            "it is below −2 s.e.\n\n"
            + C.markdown_table(head, rows)
            + "\n**Mean over the three presets** (per seed, then mean ± s.e. over seeds):\n\n"
            + C.markdown_table(["factor", "A (%)", "B (%)", "C (%)", "B − A (pp)", "C − B (pp)", "C − A (pp)",
                                "B > A", "C > B", "C > A"], pooled))


def sweep_plot(block: dict, path: Path) -> None:
    plt = C.pyplot()
    fig, axes = plt.subplots(1, len(IID_PRESETS), figsize=(5.2 * len(IID_PRESETS), 4.2), sharey=True)
    colours = {"A": "tab:blue", "B": "tab:orange", "C": "tab:green"}
    ref = block["no_noise_final"]
    for ax, preset in zip(axes, IID_PRESETS, strict=True):
        cells = [c for c in block["cells"] if c["preset"] == preset]
        x = np.array([c["factor"] for c in cells], dtype=float)
        for offset, label in zip((0.96, 1.0, 1.04), AGGREGATIONS, strict=True):  # dodge the error bars
            mean = np.array([c["final"][label]["mean"] for c in cells])
            se = np.array([c["final"][label]["se"] or 0.0 for c in cells])
            ax.errorbar(x * offset, mean, yerr=se, marker="o", ms=4, capsize=3, color=colours[label],
                        label=f"{label} ({AGGREGATIONS[label]})")
        ax.axhline(ref["mean"], color="black", lw=1, label="no perturbation")
        ax.axhline(0.1, color="grey", lw=0.6, ls="-.")
        ax.set_xscale("log")
        ax.set_xticks(x, [f"×{c['factor']:g}" + ("\n(one seed)" if c["final"]["A"]["n"] == 1 else "")
                          for c in cells])
        ax.minorticks_off()
        base = ", ".join(f"{v:g}" for v in get_preset(preset).values)
        ax.set_title(f"{preset.split('-')[-1]}: ε = factor × {{{base}}}")
        ax.set_xlabel("budget scale factor (not in the paper)")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("final test accuracy (mean ± s.e. over seeds)")
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle("Wu et al., IID Fashion-MNIST, raw pixels, gaussian-wu (eq. 4 σ): budgets scaled up "
                 "(deviation from the paper)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_sweep(args, scale: dict, work: Path) -> None:
    results = C.experiment_header(SWEEP_NAME, args, scale)
    results.update(deviation="budgets scaled up from the paper's wu-fmnist-iid-LLH/LMH/LHH presets",
                   factors=list(args.factors), probe_factors=list(args.probe_factors),
                   federation_seeds=list(args.seeds), export_seed=args.seed)
    start = time.perf_counter()
    raw = C.export(work / "fmnist-3-raw", IID_EXPORT + ["--extractor", "none"], seed=args.seed)
    results["export"] = raw
    results["sweep"] = sweep_block(Path(raw["run_dir"]), work / "sweep", scale, args.factors, args.probe_factors,
                                   args.seeds)
    results["invocation_seconds"] = round(time.perf_counter() - start, 1)
    sweep_plot(results["sweep"], args.out / f"{SWEEP_NAME}.png")
    C.write_results(args.out, SWEEP_NAME, results, sweep_markdown(results["sweep"]))


def _numbers(kind):
    return lambda text: tuple(kind(t) for t in text.split(",") if t.strip())


def main() -> None:
    p = C.parser(__doc__)
    p.add_argument("--part", choices=("all", "supplement", "sweep"), default="all",
                   help="supplement: only the budgets-{10,100,500} IID run, added to an existing result file; "
                        f"sweep: the IID presets' budgets times --factors over --seeds, into {SWEEP_NAME}.*")
    p.add_argument("--factors", type=_numbers(float), default=SWEEP_FACTORS,
                   help=f"sweep: budget scale factors (default {','.join(map(str, SWEEP_FACTORS))})")
    p.add_argument("--probe-factors", type=_numbers(float), default=SWEEP_PROBE_FACTORS,
                   help="sweep: factors run at the first seed only "
                        f"(default {','.join(map(str, SWEEP_PROBE_FACTORS))}; '' for none)")
    p.add_argument("--seeds", type=_numbers(int), default=SWEEP_SEEDS,
                   help=f"sweep: federation seeds (default {','.join(map(str, SWEEP_SEEDS))})")
    args = p.parse_args()
    scale = SCALES[args.scale]
    work = args.work / NAME / args.scale
    path = args.out / f"{NAME}.json"
    if args.part == "sweep":
        run_sweep(args, scale, work)
        return
    if args.part == "supplement":
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
