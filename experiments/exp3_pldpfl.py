"""Experiment 3: PLDP-FL (Shen et al., Entropy 2023): PDPM model perturbation under the ε1, ε2, ε3 modes.

Paper (6.1, 6.2.2-6.2.3): MNIST and Fashion-MNIST, N = 100 clients, γ = 0.7 of them per round
(Algorithm 1 line 4), 5 local epochs, batch 20, lr 0.01, a small CNN whose FC part is 320-50-10;
PDPM (Algorithm 2, eq. 10) perturbs each selected client's parameters with its own ε_i over its safe
range τ_i. Modes: ε1 = {0.1, 0.2, ...} (smallest), ε2 = {0.1, ..., 1.0} (ascending), ε3 = {0.9, 1.0, ...}
(largest). Reported: accuracy grows with ε; after 50 rounds on Fashion-MNIST the ε2 and ε3
combinations reach 79.2 % and 85.6 % (best over τ modes), ε1 is clearly lower.

Here: Fashion-MNIST records split into 100 IID clients, raw pixels (``--extractor none --mechanism
none``: the fixed-point bits of the pixels, m = 4, n = 5, so 7,840 inputs), an FC net 7,840-50-10
(``--hidden 50``: ldpfl's stage 2 is fully connected, so the paper's conv layers are dropped and its
50-unit FC layer kept), SGD lr 0.01,
batch 20, ``--aggregation fraction --fraction 0.7``, τ_i = [-1, 1] for every client
(``--range-length 2 --range-centre 0``), budgets ``--budget-preset pldp-eps1/2/3``. Baseline: the
same protocol without perturbation (non-private FedAvg with γ·N selection).

Scales: cpu = 12,000 records (108 train + 12 test per client), 15 rounds, 1 local epoch;
gpu = 60,000 records (540 + 60 per client, the paper's 600 per client), 50 rounds, 5 local epochs.

``--part sweep`` (a deviation from the paper, written to ``exp3_pldpfl_sweep.*``): the same protocol with
the three modes' budgets multiplied by ``--factors`` (passed as ``--client-epsilons`` lists of 100 values)
under the paper's smallest safe ranges τ1 = {0.2, 0.4} (``--client-ranges pldp-tau1``), every mode over
``--seeds`` (federation seeds; the export keeps ``--seed``), plus ``--probes`` (ε3 only, first seed only)
at other factors (or, for example ``2:100``, at τ = [-1, 1]). Eq. 10 keeps a variance of 3L²/8 per
weight however large ε is (outputs L/2 and -L at ε → ∞), so at τ = [-1, 1] no budget removes the noise;
the sweep shows where a smaller τ lets the model learn and whether ε1 < ε2 < ε3 shows there beyond the
seed spread. The factor-1
runs at τ = [-1, 1] and the non-private run are read from this script's own ``exp3_pldpfl.json``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

from ldpfl.mechanisms.calibration import pdpm_output_values, pdpm_probabilities  # noqa: E402
from ldpfl.stage2_federate.budgets import get_preset  # noqa: E402

NAME = "exp3_pldpfl"
SCALES = {
    "cpu": {"records": 12000, "rounds": 15, "local_epochs": 1},
    "gpu": {"records": 60000, "rounds": 50, "local_epochs": 5},
}
MODES = ("pldp-eps1", "pldp-eps2", "pldp-eps3")
CLIENTS = 100
GAMMA = 0.7
PAPER_FMNIST = {"pldp-eps2": 0.792, "pldp-eps3": 0.856}  # best τ combination after 50 rounds (6.2.3)


def export(args, scale: dict, work: Path) -> dict:
    return C.export(work / "iid-100", ["--dataset", args.dataset, "--clients", CLIENTS, "--limit", scale["records"],
                                       "--extractor", "none", "--mechanism", "none"], seed=args.seed)


def fed_options(scale: dict) -> list:
    return ["--rounds", scale["rounds"], "--local-epochs", scale["local_epochs"], "--batch-size", 20,
            "--optimizer", "sgd", "--lr", 0.01, "--hidden", 50, "--threads", 1,
            "--aggregation", "fraction", "--fraction", GAMMA]


def main() -> None:
    p = C.parser(__doc__)
    p.add_argument("--dataset", default="fashion-mnist")
    p.add_argument("--part", choices=("modes", "sweep"), default="modes",
                   help=f"modes: the paper's budgets (default); sweep: budgets times --factors, into {SWEEP_NAME}.*")
    p.add_argument("--factors", type=_numbers(float), default=SWEEP_FACTORS,
                   help="sweep: budget scale factors run under τ1 for every mode and seed "
                        f"(default {','.join(map(str, SWEEP_FACTORS))})")
    p.add_argument("--probes", type=_probes, default=_probes(SWEEP_PROBES),
                   help="sweep: RANGES:FACTOR,... run for pldp-eps3 at the first seed only; RANGES is pldp-tau1 or "
                        f"one L for every client (default {SWEEP_PROBES}; '' for none)")
    p.add_argument("--seeds", type=_numbers(int), default=SWEEP_SEEDS,
                   help=f"sweep: federation seeds (default {','.join(map(str, SWEEP_SEEDS))})")
    args = p.parse_args()
    scale = SCALES[args.scale]
    work = args.work / NAME / args.scale
    if args.part == "sweep":
        run_sweep(args, scale, work)
        return
    results = C.experiment_header(NAME, args, scale)
    results["paper_fmnist_after_50_rounds"] = PAPER_FMNIST
    start = time.perf_counter()
    run = export(args, scale, work)
    run_dir = Path(run["run_dir"])
    results["export"] = run
    fed = fed_options(scale)
    results["runs"] = {"non-private": C.federate(run_dir, work / "fed-none", fed, seed=args.seed)}
    for mode in MODES:
        results["runs"][mode] = C.federate(run_dir, work / f"fed-{mode}",
                                           fed + ["--perturbation", "pdpm", "--budget-preset", mode,
                                                  "--range-length", 2, "--range-centre", 0], seed=args.seed)
    # PDPM's per-coordinate output spread at the modes' extreme budgets (from the privacy report).
    results["pdpm_reports"] = {str(e): C.mechanism_report("pdpm", ["--epsilon", e, "-L", 2, "--center", 0])
                               for e in (0.1, 0.5, 1.0)}
    results["invocation_seconds"] = round(time.perf_counter() - start, 1)

    rows = []
    for key, r in results["runs"].items():
        rows.append([key, C.pct(PAPER_FMNIST.get(key)) if key in PAPER_FMNIST else "", C.pct(r["final_accuracy"]),
                     C.pct(r["best_accuracy"])])
    md = C.markdown_table(["mode", "paper FMNIST (50 rounds)", f"ours final (round {scale['rounds']})", "ours best"],
                          rows)
    plot(results, args.out / f"{NAME}.png")
    C.write_results(args.out, NAME, results, md)


def plot(results: dict, path: Path) -> None:
    plt = C.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    colours = {"non-private": "black", "pldp-eps1": "tab:red", "pldp-eps2": "tab:orange", "pldp-eps3": "tab:green"}
    for key, r in results["runs"].items():
        acc = r["accuracy"]
        ax.plot(range(1, len(acc) + 1), acc, marker="o", ms=3, color=colours[key], label=key)
    for key, value in PAPER_FMNIST.items():
        ax.axhline(value, color=colours[key], ls=":", lw=1, label=f"paper {key} (50 rounds)")
    ax.axhline(0.1, color="grey", lw=0.6, ls="-.")
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("PLDP-FL on Fashion-MNIST: PDPM (τ = [-1, 1]) vs non-private, γ = 0.7, N = 100")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- --part sweep: the modes' budgets scaled up (deviation from the paper) -------------------------------

SWEEP_NAME = "exp3_pldpfl_sweep"
SWEEP_FACTORS = (10,)  # under τ1, all modes, all seeds: ε1 = {1, 2}, ε3 = {9, 10} (at eq. 10's floor)
# Probes, ε3 only, first seed only: where the largest budgets do or do not learn. τ = [-1, 1] needs no
# probe: its noise floor (0.146 per weight after averaging) is 6 times τ1's, at which ε3 reaches only ~30 %.
SWEEP_PROBES = "pldp-tau1:1,pldp-tau1:100"
SWEEP_SEEDS = (1, 2, 3)
TAU1 = "pldp-tau1"  # the paper's smallest safe ranges, {0.2, 0.4} cycling
ORDERINGS = (("pldp-eps2", "pldp-eps1"), ("pldp-eps3", "pldp-eps2"), ("pldp-eps3", "pldp-eps1"))


def _numbers(kind):
    return lambda text: tuple(kind(t) for t in text.split(",") if t.strip())


def _probes(text: str) -> tuple[tuple[str, float], ...]:
    pairs = [t.split(":") for t in text.split(",") if t.strip()]
    return tuple((ranges, float(factor)) for ranges, factor in pairs)


def scaled_epsilons(mode: str, factor: float) -> list[float]:
    return [round(factor * e, 10) for e in get_preset(mode).for_clients(CLIENTS)]


def range_lengths(ranges: str) -> list[float]:
    return list(get_preset(ranges).for_clients(CLIENTS)) if ranges == TAU1 else [float(ranges)] * CLIENTS


def pdpm_std_at_zero(epsilon: float, length: float) -> float:
    """Std of one eq. 10 output for a weight at the range's centre (t = 0, mean 0): √(P_h·h² + P_l·l²)."""
    high, low = pdpm_output_values(epsilon, length)
    p_high, p_low = pdpm_probabilities(np.zeros(1), epsilon, length)
    return float(np.sqrt(p_high[0] * high**2 + p_low[0] * low**2))


def pdpm_noise(epsilons: list[float], lengths: list[float]) -> dict:
    """Per-client std at t = 0 and that of the mean of γN random uploads (eq. 7): √(mean σ_i² / γN)."""
    pairs = sorted(set(zip(epsilons, lengths, strict=True)))
    std = {pair: pdpm_std_at_zero(*pair) for pair in pairs}  # a few distinct (ε, L) pairs, not per weight
    per_client = np.array([std[pair] for pair in zip(epsilons, lengths, strict=True)])
    floor = np.sqrt(3.0 / 8.0) * np.asarray(lengths)  # ε → ∞: outputs L/2 w.p. 1/2, -L w.p. 1/4, 0 w.p. 1/4
    return {"client_std_min": float(per_client.min()), "client_std_max": float(per_client.max()),
            "aggregate_std": float(np.sqrt(np.mean(per_client**2) / int(GAMMA * CLIENTS))),
            "aggregate_floor": float(np.sqrt(np.mean(floor**2) / int(GAMMA * CLIENTS)))}


def sweep_cell(runs: dict) -> dict:
    final = {k: np.array([r["final_accuracy"] for r in v]) for k, v in runs.items()}
    last5 = {k: np.array([np.mean(r["accuracy"][-5:]) for r in v]) for k, v in runs.items()}
    diffs = {f"{x}>{y}": C.seed_stats(final[x] - final[y]) for x, y in ORDERINGS if x in final and y in final}
    return {"final": {k: C.seed_stats(v) for k, v in final.items()},
            "last5_mean": {k: C.seed_stats(v) for k, v in last5.items()},
            "diff": diffs, "verdict": {k: C.verdict(v) for k, v in diffs.items()},
            "final_per_seed": {k: v.tolist() for k, v in final.items()}}


def sweep_block(run_dir: Path, work: Path, scale: dict, factors, probes, seeds) -> dict:
    fed = fed_options(scale)
    out = {"cells": []}
    grid = [(TAU1, f, MODES, seeds) for f in factors] + [(r, f, MODES[-1:], seeds[:1]) for r, f in probes]
    for ranges, factor, modes, cell_seeds in sorted(grid, key=lambda g: (g[0] != TAU1, g[1])):
        lengths = range_lengths(ranges)
        tau = ["--client-ranges", TAU1] if ranges == TAU1 else ["--range-length", ranges]
        runs, noise = {}, {}
        for mode in modes:
            eps = scaled_epsilons(mode, factor)
            budgets = ",".join(f"{e:g}" for e in eps)
            noise[mode] = pdpm_noise(eps, lengths)
            runs[mode] = [C.federate(run_dir, work / f"{ranges}-x{factor:g}-{mode}-s{seed}",
                                     fed + ["--perturbation", "pdpm", "--client-epsilons", budgets, *tau,
                                            "--range-centre", 0], seed=seed) for seed in cell_seeds]
        out["cells"].append({"ranges": ranges, "factor": factor, "noise": noise, **sweep_cell(runs), "runs": runs})
    return out


def _pm(stats: dict, scale: float = 100.0, digits: int = 1) -> str:
    mean = f"{scale * stats['mean']:.{digits}f}"
    return f"{mean} (one seed)" if stats["se"] is None else f"{mean} ± {scale * stats['se']:.{digits}f}"


def _tau(ranges: str) -> str:
    return "τ1 = {0.2, 0.4}" if ranges == TAU1 else f"L = {float(ranges):g} (τ = [-1, 1])"


def _budgets(mode: str, factor: float) -> str:
    values = [f"{round(factor * e, 10):g}" for e in get_preset(mode).values]
    return "{" + ", ".join(values if len(values) <= 2 else [values[0], "…", values[-1]]) + "}"


def sweep_markdown(block: dict) -> str:
    head = ["safe range", "factor", "budgets ε1 / ε2 / ε3", "noise of the mean upload ε1 / ε2 / ε3 (floor)",
            "ε1 (%)", "ε2 (%)", "ε3 (%)", "ε2 − ε1 (pp)", "ε3 − ε2 (pp)", "ε3 − ε1 (pp)", "ε2 > ε1", "ε3 > ε2",
            "ε3 > ε1"]
    rows = []
    for c in block["cells"]:
        f, n = c["factor"], c["noise"]
        floor = next(iter(n.values()))["aggregate_floor"]
        diffs = [f"{x}>{y}" for x, y in ORDERINGS]
        rows.append([_tau(c["ranges"]) + (" (section 3 runs)" if c.get("source") else ""), f"×{f:g}",
                     " / ".join(_budgets(m, f) if m in n else "—" for m in MODES),
                     " / ".join(f"{n[m]['aggregate_std']:.3f}" if m in n else "—" for m in MODES) + f" ({floor:.3f})",
                     *(_pm(c["final"][m]) if m in n else "—" for m in MODES),
                     *(_pm(c["diff"][k]) if k in c["diff"] else "—" for k in diffs),
                     *(c["verdict"].get(k, "—") for k in diffs)])
    seeds = max(s["n"] for c in block["cells"] for s in c["final"].values())
    return (f"Final test accuracy after round 15, mean ± standard error over {seeds} federation seeds ('one "
            f"seed': a probe run at seed 1 only) (non-private, seed {block['non_private']['seed']}: "
            f"{C.pct(block['non_private']['final_accuracy'])}). Noise: std per weight of the mean of the γN = 70 "
            "uploads for a weight at the centre of τ (eq. 10 at t = 0), in brackets its floor as ε → ∞ "
            "(√(3/8)·L per upload). Differences are paired by seed; an ordering is 'seen' where the mean "
            "difference exceeds 2 standard errors, 'contradicted' where it is below −2 s.e.\n\n"
            + C.markdown_table(head, rows))


def sweep_plot(block: dict, path: Path) -> None:
    plt = C.pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    colours = {"pldp-eps1": "tab:red", "pldp-eps2": "tab:orange", "pldp-eps3": "tab:green"}
    for ranges, style, face in ((TAU1, "-", None), ("2", ":", "none")):
        cells = [c for c in block["cells"] if c["ranges"] == ranges]
        for offset, mode in zip((0.94, 1.0, 1.06), MODES, strict=True):  # dodge the error bars
            have = [c for c in cells if mode in c["final"]]
            if not have:
                continue
            x = np.array([c["factor"] for c in have], dtype=float) * offset
            mean = np.array([c["final"][mode]["mean"] for c in have])
            se = np.array([c["final"][mode]["se"] or 0.0 for c in have])
            ax.errorbar(x, mean, yerr=se, ls=style, marker="o", ms=5, capsize=3, color=colours[mode],
                        mfc=face or colours[mode], label=f"{mode}, {_tau(ranges)}")
    ax.axhline(block["non_private"]["final_accuracy"], color="black", lw=1, label="non-private")
    ax.axhline(0.1, color="grey", lw=0.6, ls="-.")
    ax.set_xscale("log")
    factors = sorted({c["factor"] for c in block["cells"]})
    ax.set_xticks(factors, [f"×{f:g}" for f in factors])  # probes (one seed) carry no error bar
    ax.minorticks_off()
    ax.set_xlabel("budget scale factor (×1 = the paper's modes; above: not in the paper)")
    ax.set_ylabel("final test accuracy (mean ± s.e. over seeds)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    ax.set_title("PLDP-FL, Fashion-MNIST, N = 100, γ = 0.7: PDPM with the modes' budgets scaled up\n"
                 "(deviation from the paper; round 15; hollow: τ = [-1, 1], filled: τ1)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def modes_reference(path: Path, args) -> tuple[dict, dict] | None:
    """The modes part's runs (τ = [-1, 1], factor 1, seed = --seed) and its non-private run, from its JSON."""
    if not path.is_file():
        return None
    modes = json.loads(path.read_text())
    if modes.get("seed") != args.seed or modes.get("scale") != args.scale:
        return None
    runs = {m: [modes["runs"][m]] for m in MODES}
    noise = {m: pdpm_noise(scaled_epsilons(m, 1), range_lengths("2")) for m in MODES}
    cell = {"ranges": "2", "factor": 1.0, "noise": noise, **sweep_cell(runs), "runs": runs, "source": str(path)}
    return cell, modes["runs"]["non-private"]


def run_sweep(args, scale: dict, work: Path) -> None:
    results = C.experiment_header(SWEEP_NAME, args, scale)
    results.update(deviation="budgets scaled up from the paper's pldp-eps1/2/3 modes",
                   factors=list(args.factors), probes=[list(p) for p in args.probes],
                   federation_seeds=list(args.seeds), export_seed=args.seed)
    start = time.perf_counter()
    run = export(args, scale, work)
    results["export"] = run
    run_dir = Path(run["run_dir"])
    block = sweep_block(run_dir, work / "sweep", scale, args.factors, args.probes, args.seeds)
    # Factor 1 at τ = [-1, 1] and the non-private run are the modes part's runs (same export command and
    # seed) when its JSON is there; otherwise the non-private run is done here.
    reference = modes_reference(args.out / f"{NAME}.json", args)
    if reference:
        block["cells"].append(reference[0])
        block["non_private"] = {**reference[1], "seed": args.seed, "source": reference[0]["source"]}
    else:
        block["non_private"] = {**C.federate(run_dir, work / "sweep" / f"none-s{args.seed}", fed_options(scale),
                                             seed=args.seed), "seed": args.seed}
    results["sweep"] = block
    results["invocation_seconds"] = round(time.perf_counter() - start, 1)
    sweep_plot(block, args.out / f"{SWEEP_NAME}.png")
    C.write_results(args.out, SWEEP_NAME, results, sweep_markdown(block))

if __name__ == "__main__":
    main()
