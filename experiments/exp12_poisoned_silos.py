"""Poisoned silos named (issue 42): does the median or trimmed mean name one poisoning silo of 10, under DP-SGD?

The private federation of docs/RESULTS.md section 7 (``exp8_shared_features.run_federated``): Fashion-MNIST's 60,000
training records split among 10 silos (``silo_splits``: 90 % of each silo's records for training), every record
through the weight-free ScatterNet (``features``: exp8's cached float32 features), a linear head trained with one
record-level DP-SGD step per silo and round (``train_dp_sgd``: clip 0.1, Poisson q = 0.1365, σ calibrated by the
package's accountant for ε = 3 per silo over the 300 steps, add/remove, δ = 1e-5), 300 rounds, server momentum 0.9
applied after the rule's combination. The learning rate is section 7's validation choice for the partition (IID 4,
Dirichlet 0.1 2; ``--lr`` overrides it). The only change to ``run_federated``'s loop is the server's combination:
the package's own strategy (``stage2_federate.strategies.create_strategy``) instead of ``np.mean``, and its
``OutlierReport`` (``stage2_federate.outliers``) kept each round:

* ``fedavg``: the mean, with FedAvg's optional outlier report (``outlier_report``: flagged past ``OUTLIER_BOUND``
  times the typical silo's distance from the round's median);
* ``median``: the coordinate-wise median; ``trimmed-mean``: β = ``--trim-fraction`` (0.1: one value dropped at each
  end of every coordinate of 10, the smallest β that trims one).

Who is named in a round: since the DP-SGD outlier statistic (``outliers.noise_distances``), the strategy is given
each silo's DP-SGD noise per coordinate (``outliers.upload_noise_scales``: lr·σ·C/(q·n_i)), as ``ldpfl federate
--dp-sgd`` does, and a silo is named when its distance from the others' median, in units of what the noise alone
puts there and relative to the round's median silo, exceeds ``noise_bound`` (z = ``NOISE_Z``); the discount and the
raw distance are still recorded. Runs recorded before it (no ``noise`` figures in their silos) named a silo by its
discount (≥ ``DISCOUNT_BOUND``) or FedAvg's distance (> ``OUTLIER_BOUND``). ``--rerun`` replaces the chosen runs'
records. The run's summary names a silo named in more than half of its rounds (``persistent_outliers``).

Scenarios (silo 9 poisons; it runs the same DP-SGD steps, so its privacy accounting is unchanged):

* ``clean``: 10 honest IID silos; ``dirichlet-0.1``: 10 honest silos, Dirichlet β = 0.1 over the labels;
* ``label-flip``: IID, silo 9 trains on y -> 9 - y; ``near-constant``: IID, every label of silo 9 is class 0.

Accuracy is the final model's on Fashion-MNIST's official 10,000 test records (clean labels), never used for a
choice. Everything calls the package's functions; nothing of the product is re-implemented.

    nohup nice -n 10 .venv/bin/python experiments/exp12_poisoned_silos.py --out docs/results > runs/exp12.log 2>&1 &
    nohup nice -n 10 .venv/bin/python experiments/exp12_poisoned_silos.py --rules median --rerun \
        --out docs/results > runs/exp12_noise.log 2>&1 &   # the DP-SGD statistic's key rows
    nohup nice -n 10 .venv/bin/python experiments/exp12_poisoned_silos.py --rules trimmed-mean \
        --out runs/exp12_tm_noise > runs/exp12_tm_noise/log 2>&1 &   # the trimmed mean's, beside the others
    .venv/bin/python experiments/exp12_poisoned_silos.py --merge runs/exp12_tm_noise --out docs/results

``--merge DIR`` runs nothing: it adds DIR's records (same setting) to ``--out``'s, replacing a record of the same
scenario, rule and statistic (``named_by``), and rewrites the table. Since the label-mix reference, a silo is named
when its noise distance and its label-mix distance both pass their bounds; each silo's share of rounds past the
noise distance's bound alone is recorded beside (``noise.named_share``), comparable with the median's rows named by
the noise distance alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from exp8_shared_features import (  # noqa: E402
    CLASSES,
    CLIP,
    DELTA,
    MOMENTUM,
    ROUNDS,
    SILOS,
    WIDTH,
    Q,
    accuracy,
    dp_client,
    features,
    pools,
    sigma_for,
    silo_splits,
    split_of,
)

from ldpfl.mechanisms import accounting  # noqa: E402
from ldpfl.stage2_federate import outliers as out  # noqa: E402
from ldpfl.stage2_federate.client_description import ClientDescription  # noqa: E402
from ldpfl.stage2_federate.model import build_model, get_vector, make_optimizer, set_vector  # noqa: E402
from ldpfl.stage2_federate.server_optimizers import FedAvgM  # noqa: E402
from ldpfl.stage2_federate.silo_training import upload_noise_scales, upload_signal_bound  # noqa: E402
from ldpfl.stage2_federate.silo_training.dp_sgd import train_dp_sgd  # noqa: E402
from ldpfl.stage2_federate.strategies import StrategyOptions, create_strategy  # noqa: E402

POISONER, CONSTANT_CLASS = 9, 0
RULES = ("fedavg", "median", "trimmed-mean")
SCENARIOS = {  # name: (partition, what silo POISONER does to its training labels)
    "clean": ("iid", None),
    "label-flip": ("iid", "flip"),
    "near-constant": ("iid", "constant"),
    "dirichlet-0.1": ("dirichlet-0.1", None),
}
SECTION7_LR = {"iid": 4.0, "dirichlet-0.1": 2.0}  # exp8's validation choices (exp8_shared_features_federated_*.json)
COMMAND = "nice -n 10 .venv/bin/python experiments/exp12_poisoned_silos.py --out docs/results"  # all 12 runs
SCRIPT = "nice -n 10 .venv/bin/python experiments/exp12_poisoned_silos.py"
MERGED = (f"`{COMMAND}` (the 12 first runs, named by discount or distance); `{SCRIPT} --rules median --rerun "
          f"--out docs/results` (the median's four, named by the DP-SGD noise distance); `{SCRIPT} --rules median "
          "trimmed-mean --out runs/exp12_mix2`, then `.venv/bin/python experiments/exp12_poisoned_silos.py --merge "
          "runs/exp12_mix2 --out docs/results` (both rules' four, named by the noise distance and the label mix: "
          "the label-mix reference as committed in 67411e5)")
"""The runs behind docs/results' table, as a ``--merge`` into it names them."""


def poisoned_labels(labels: np.ndarray, rows: np.ndarray, attack: str | None) -> np.ndarray:
    """Return a copy of ``labels`` with the poisoning silo's training ``rows`` changed (flip: 9 - y; constant: 0)."""
    out_labels = labels.copy()
    if attack == "flip":
        out_labels[rows] = CLASSES - 1 - labels[rows]
    elif attack == "constant":
        out_labels[rows] = CONSTANT_CLASS
    elif attack is not None:
        raise ValueError(f"attack must be None, 'flip' or 'constant', got {attack!r}")
    return out_labels


def federate(x, y, splits, rule: str, trim_fraction: float, sigma: float, lr: float, seed: int, *, rounds: int
             ) -> tuple[torch.nn.Module, list[out.OutlierReport]]:
    """``run_federated``'s loop (same generators, DP-SGD steps and momentum) with the package's ``rule``."""
    gen = torch.Generator().manual_seed(seed)
    model = build_model(WIDTH, (), CLASSES, generator=gen)
    data = [split_of(x, y, s["train"]) for s in splits]
    clients = [dp_client(i, len(s["train"]), sigma, 1) for i, s in enumerate(splits)]
    rngs = [np.random.default_rng([seed, i, 2]) for i in range(SILOS)]
    profiles = [ClientDescription.in_memory(i, len(s["train"]), np.bincount(y[s["train"]], minlength=CLASSES).tolist())
                for i, s in enumerate(splits)]
    options = (StrategyOptions(outlier_report=True) if rule == "fedavg" else
               StrategyOptions(trim_fraction=trim_fraction) if rule == "trimmed-mean" else StrategyOptions())
    strategy = create_strategy(rule, profiles, options)
    strategy.upload_noise = upload_noise_scales(dict(enumerate(clients)), lr=lr, plain_sgd=True)  # as the loop
    strategy.upload_signal = upload_signal_bound(dict(enumerate(clients)), lr=lr, plain_sgd=True)
    server_rng = np.random.default_rng([seed, 12])  # none of these rules draws from it
    momentum = FedAvgM(MOMENTUM)
    vector = get_vector(model).numpy()
    reports = []
    for _round in range(rounds):
        uploads = {}
        for i in range(SILOS):
            set_vector(model, torch.from_numpy(vector.copy()))
            train_dp_sgd(model, data[i], clients[i], optimizer=make_optimizer("sgd", model.parameters(), lr),
                         generator=gen, rng=rngs[i])
            uploads[i] = get_vector(model).numpy()
        combined = strategy.aggregate(vector, uploads, rng=server_rng)
        assert combined.vector is not None and combined.outliers is not None
        reports.append(combined.outliers)
        vector = momentum.step(vector, np.asarray(combined.vector, dtype=np.float32))
    set_vector(model, torch.from_numpy(vector.copy()))
    return model, reports


def _spread(values: np.ndarray) -> list[float]:
    return [round(float(q), 4) for q in np.quantile(values, [0.25, 0.5, 0.75])]


def silo_figures(reports: list[out.OutlierReport]) -> list[dict]:
    """Per silo: the share of rounds it was named, its discount, distance and noise distance (mean, quartiles)."""
    figures = []
    for client in range(SILOS):
        entries = [s for r in reports for s in r.silos if s.client == client]
        discount = np.array([s.discount for s in entries])
        distance = np.array([s.distance for s in entries])
        figure = {"client": client, "named_share": float(np.mean([s.named for s in entries])),
                  "discount_mean": float(discount.mean()), "discount_quartiles": _spread(discount),
                  "distance_mean": float(distance.mean()), "distance_quartiles": _spread(distance),
                  "distance_past_bound_share": float(np.mean(distance > out.OUTLIER_BOUND))}
        if all(s.noise_distance is not None for s in entries):
            noise = np.array([s.noise_distance for s in entries])
            bounds = np.array([s.noise_bound for s in entries])
            figure["noise"] = {"distance_mean": float(noise.mean()), "distance_quartiles": _spread(noise),
                               "distance_min": float(noise.min()), "distance_max": float(noise.max()),
                               "bound": float(bounds.mean()),
                               "named_share": float(np.mean(noise > bounds))}  # by the noise distance alone
        if all(s.mix_distance is not None for s in entries):  # runs since the label-mix reference
            mix = np.array([s.mix_distance for s in entries])
            figure["mix"] = {"distance_mean": float(mix.mean()), "distance_quartiles": _spread(mix),
                             "distance_max": float(mix.max())}
        figures.append(figure)
    return figures


def noise_alone_summary(reports: list[out.OutlierReport]) -> list[int]:
    """The silos whose noise distance alone passes its bound in more than half of the rounds (label mix aside)."""
    past = [sum(bool(s.noise_distance is not None and s.noise_bound is not None and s.noise_distance > s.noise_bound)
                for r in reports for s in r.silos if s.client == client) for client in range(SILOS)]
    return [client for client in range(SILOS) if 2 * past[client] > len(reports)]


def _noise_cell(silo: dict) -> str:
    noise, mix = silo.get("noise"), silo.get("mix")
    if noise is None:
        return "–"
    return f"{noise['distance_mean']:.4f} / {noise['bound']:.4f}" + (
        "" if mix is None else f" (label mix {mix['distance_mean']:.4f})")


def _noise_alone(record: dict) -> str:
    """Silo 9's and the most-named honest silo's share of rounds past the noise distance's bound alone."""
    silos = record["silos"]
    if record.get("named_by") == "DP-SGD noise distance":  # named by it alone
        shares = [s["named_share"] for s in silos]
    elif all("named_share" in s.get("noise", {}) for s in silos):
        shares = [s["noise"]["named_share"] for s in silos]
    else:
        return "–"
    return f"{100 * shares[POISONER]:.1f} / {100 * max(shares[:POISONER]):.1f}"


def table(records: list[dict]) -> str:
    """The Markdown table: accuracy, gaps to the honest runs of the partition, named shares, the summary's names."""
    clean = {(r["partition"], r["rule"]): r["accuracy"] for r in records if r["attack"] is None}
    lines = ["| scenario | rule | named by | test accuracy | vs honest, same rule (pp) | vs honest FedAvg (pp) | "
             "silo 9 named (% of rounds) | silos 0-8 named, most (% of rounds) | by the noise distance alone: "
             "silo 9 / silos 0-8 most (% of rounds) | named in the summary | "
             "silo 9 mean discount / distance | silo 9 noise distance / bound | silos 0-8 noise distance, "
             "largest mean | seconds |",
             "|---|---|---|---:|---:|---:|---:|---:|---|---|---|---|---|---:|"]
    for r in records:
        gaps = [f"{100 * (r['accuracy'] - clean[key]):+.2f}" if key in clean else "–"
                for key in ((r["partition"], r["rule"]), (r["partition"], "fedavg"))]
        silos = r["silos"]
        names = ", ".join(f"silo {p['client']} ({p['named_rounds']}/{p['rounds']})" for p in r["named_in_summary"])
        who = f"{r['scenario']} ({'silo 9 poisons' if r['attack'] else 'all honest'})"
        honest = [s for s in silos[:POISONER] if "noise" in s]
        largest = max(honest, key=lambda s: s["noise"]["distance_mean"]) if honest else None
        worst = "–" if largest is None else f"silo {largest['client']}: {_noise_cell(largest)}"
        lines.append(f"| {who} | {r['rule_label']} | {r.get('named_by', 'discount or distance')} | "
                     f"{100 * r['accuracy']:.2f} % | {gaps[0]} | {gaps[1]} | "
                     f"{100 * silos[POISONER]['named_share']:.1f} | "
                     f"{100 * max(s['named_share'] for s in silos[:POISONER]):.1f} | {_noise_alone(r)} | "
                     f"{names or 'none'} | "
                     f"{silos[POISONER]['discount_mean']:.3f} / {silos[POISONER]['distance_mean']:.3f} | "
                     f"{_noise_cell(silos[POISONER])} | "
                     f"{worst} | "
                     f"{r['seconds']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    parser.add_argument("--rules", nargs="+", default=list(RULES), choices=RULES)
    parser.add_argument("--trim-fraction", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="sigma is calibrated for epsilon over these steps")
    parser.add_argument("--epsilon", type=float, default=3.0, help="per silo, add/remove, delta 1e-5")
    parser.add_argument("--lr", type=float, default=None, help="default: section 7's choice for the partition")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rerun", action="store_true", help="replace the chosen runs' records")
    parser.add_argument("--merge", type=Path, default=None,
                        help="run nothing: add this directory's records to --out's and rewrite the table")
    parser.add_argument("--cache", type=Path, default=Path("runs/exp8_cache/fmnist_scatter"))
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    args = parser.parse_args()
    if args.merge is not None:
        merge(args.merge, args.out)
        return
    torch.set_num_threads(1)
    x, y = features(args.cache, "fashion-mnist")
    pool, test_rows = pools("fashion-mnist", y)
    sigma = sigma_for(args.epsilon, steps=args.rounds)
    both = accounting.dp_sgd_epsilons(accounting.DpSgdEvent(sigma, Q, args.rounds), DELTA)
    setting = {"silos": SILOS, "poisoner": POISONER, "constant_class": CONSTANT_CLASS, "rounds": args.rounds,
               "epsilon_add_remove": both[accounting.ADD_REMOVE], "epsilon_replace_one": both[accounting.REPLACE_ONE],
               "delta": DELTA, "noise_multiplier": sigma, "sampling_probability": Q, "clip": CLIP,
               "steps_per_round": 1, "server_momentum": MOMENTUM, "trim_fraction": args.trim_fraction,
               "lr": args.lr or SECTION7_LR, "generator_root": args.seed, "discount_bound": out.DISCOUNT_BOUND,
               "outlier_bound": out.OUTLIER_BOUND}
    statistic = {"noise_z": out.NOISE_Z, "reference": "coordinate-wise lower median of the other silos",
                 "noise_scale": "lr * sigma * clip * sqrt(steps) / (q * n_i)"}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "exp12_poisoned_silos.json"
    saved = json.loads(path.read_text()) if path.exists() else {}
    before = {("generator_root" if key == "seed" else key): value for key, value in saved.get("setting", {}).items()}
    records: list[dict] = saved.get("records", []) if before == setting else []
    if args.rerun:
        chosen = {(scenario, rule) for scenario in args.scenarios for rule in args.rules}
        records = [r for r in records if (r["scenario"], r["rule"]) not in chosen]
    done = {(r["scenario"], r["rule"]) for r in records}
    for scenario in args.scenarios:
        partition, attack = SCENARIOS[scenario]
        splits = silo_splits(y, pool, partition, args.seed)
        labels = poisoned_labels(y, splits[POISONER]["train"], attack)
        lr = args.lr or SECTION7_LR[partition]
        for rule in args.rules:
            if (scenario, rule) in done:
                continue
            start, cpu = time.perf_counter(), time.process_time()
            model, reports = federate(x, labels, splits, rule, args.trim_fraction, sigma, lr, args.seed,
                                      rounds=args.rounds)
            seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
            noisy = reports[0].noise_median is not None
            label = f"trimmed-mean β {args.trim_fraction:g}" if rule == "trimmed-mean" else (
                "fedavg (+ outlier report)" if rule == "fedavg" else rule)
            records.append({
                "scenario": scenario, "partition": partition, "attack": attack, "rule": rule, "rule_label": label,
                "action": reports[0].action, "named_by": ("DP-SGD noise distance and label mix"
                                                          if reports[0].silos[0].mix_distance is not None else
                                                          "DP-SGD noise distance") if noisy else (
                    "distance" if rule == "fedavg" else "discount"),
                "lr": lr, "accuracy": accuracy(model, x, y, test_rows),
                "silos": silo_figures(reports),
                "named_in_summary": [p.to_dict() for p in out.persistent_outliers(reports)],
                **({"named_by_noise_alone_in_summary": noise_alone_summary(reports)} if noisy else {}),
                "poisoner_discount_every_10_rounds": [round(r.silos[POISONER].discount, 4) for r in reports[::10]],
                "poisoner_distance_every_10_rounds": [round(r.silos[POISONER].distance, 3) for r in reports[::10]],
                **({"poisoner_noise_distance_every_10_rounds": [round(float(r.silos[POISONER].noise_distance), 4)
                                                                for r in reports[::10]],
                    "round_noise_median_quartiles": _spread(np.array([r.noise_median for r in reports]))}
                   if noisy else {}),
                "silo_train_rows": [len(s["train"]) for s in splits], "seconds": seconds, "cpu_seconds": cpu})
            last = records[-1]
            records.sort(key=lambda r: (list(SCENARIOS).index(r["scenario"]), RULES.index(r["rule"])))
            path.write_text(json.dumps({"setting": setting, "noise_statistic": statistic, "records": records},
                                       indent=1))
            print(f"{scenario} {rule}: test {last['accuracy']:.4f}, silo {POISONER} named in "
                  f"{100 * last['silos'][POISONER]['named_share']:.0f} % of rounds, summary "
                  f"{[p['client'] for p in last['named_in_summary']]} ({seconds:.0f} s, {cpu:.0f} s CPU)", flush=True)
    command = "nice -n 10 .venv/bin/python " + " ".join(["experiments/exp12_poisoned_silos.py", *sys.argv[1:]])
    line = f"`{command}`"
    if args.rerun or args.rules != list(RULES) or args.scenarios != list(SCENARIOS):
        line += f" (these runs; the others: `{COMMAND}`)"
    write_table(args.out, line, setting, statistic, records)
    print(table(records))


def _setting(saved: dict) -> dict:
    return {("generator_root" if key == "seed" else key): value for key, value in saved.get("setting", {}).items()}


def merge(source: Path, target: Path) -> None:
    """Add ``source``'s records to ``target``'s (same setting), replacing those of the same run and statistic."""
    added = json.loads((source / "exp12_poisoned_silos.json").read_text())
    path = target / "exp12_poisoned_silos.json"
    saved = json.loads(path.read_text())
    if _setting(added) != _setting(saved):
        raise SystemExit(f"{source} was run in another setting than {target}: nothing merged")

    def key(record: dict) -> tuple:
        return record["scenario"], record["rule"], record.get("named_by")

    new = {key(r) for r in added["records"]}
    records = [r for r in saved["records"] if key(r) not in new] + added["records"]
    records.sort(key=lambda r: (list(SCENARIOS).index(r["scenario"]), RULES.index(r["rule"])))  # stable: old first
    statistic = {**saved.get("noise_statistic", {}), **added.get("noise_statistic", {})}
    path.write_text(json.dumps({"setting": saved["setting"], "noise_statistic": statistic, "records": records},
                               indent=1))
    write_table(target, MERGED, _setting(saved), statistic, records)
    print(table(records))


def write_table(out_dir: Path, line: str, setting: dict, statistic: dict, records: list[dict]) -> None:
    """Write ``exp12_poisoned_silos.md``: the command line(s), the setting, the table of ``records``."""
    (out_dir / "exp12_poisoned_silos.md").write_text(
        "# Poisoned silos named: one label-flipping or near-constant silo of 10 (Fashion-MNIST, ScatterNet, "
        "DP-SGD)\n\n"
        f"{line}\n\nSetting: {json.dumps(setting)}. DP-SGD statistic: {json.dumps(statistic)}. Test accuracy "
        "on the official 10,000 clean test records; one seed (0). 'vs honest': the run of the same partition with "
        "every silo honest. 'named by': DP-SGD noise distance = noise distance > its bound (1 + z·√κ_i/(2√d), "
        "outliers.noise_distances), the rule's discount and distance still recorded; runs recorded before that "
        "statistic named by discount ≥ DISCOUNT_BOUND (median, trimmed mean) or distance > OUTLIER_BOUND "
        "(FedAvg's report). The summary names a silo named in more than half of its rounds. Distance: ‖u_i − m‖ "
        "over the round's lower-median distance (1: a typical silo). Noise distance: ‖u_i − m_−i‖ / √(d·v_i) "
        "over the round's median of it (1: a typical silo), mean over the 300 rounds, and its mean bound. 'DP-SGD "
        "noise distance and label mix': named when both pass their bounds (label-mix distance in brackets); 'by "
        "the noise distance alone': the share of rounds past its bound, label mix aside.\n\n"
        f"{table(records)}\n")


if __name__ == "__main__":
    main()
