"""The private-files front (issue 40): one-shot releases of noisy sufficient statistics, then free models.

Each silo's records (Fashion-MNIST or MNIST-5k through the weight-free ScatterNet, as ``exp8_shared_features``
splits them: 10 silos, IID / Dirichlet β / shards, 90 % train, 5 % validation, 5 % own held-out) are projected
on k public orthonormal directions, clipped to C = f·√k (f·√d bounds a GroupNorm'd record of d values, so the
clip is read from no record), and released once (``ldpfl.mechanisms.sufficient_statistics``: per-class sums,
counts and second moments with Gaussian noise, the budget μ² split in shares, ε add/remove at δ = 1e-5 exact).
Everything after is post-processing:

* ``released-stats``: the 10 releases pooled, LDA on them (``ldpfl.mechanisms.statistics_model``: ridge λ =
  shrinkage × the noise's spectral edge);
* ``released-stats-alone``: each silo's own release only (the mean over silos of its LDA);
* ``released-stats-fc``: FedAvg of a linear head over each silo's synthetic records (its release's Gaussian
  model sampled from a public seed), no privacy spent.

``--tune-clip`` chose the clip fraction f on MNIST-5k's validation records at ε = 3 (0.6: nearly every record is
clipped, a normalization); ``--tune-residual`` the clip of a residual about its class mean (C_r = r·C) the same
way, for the release of moments about each silo's own noisy class means (``--moments-about class-means``, the
package's default since it halves the moments' noise; ``origin`` is the first release's). ``--tune`` then
chooses (k, shares, shrinkage) at each ε on the IID silos' validation records (seed 0) and writes the grid; the
front uses the choice recorded for each ε. Files of the origin release carry ``_origin`` in their names.
Accuracy is on the official test records (never used for a choice) and on each silo's own held-out records.

    python experiments/exp10_released_stats.py --dataset mnist5k --tune-clip --out docs/results
    python experiments/exp10_released_stats.py --dataset mnist5k --tune-residual --out docs/results
    python experiments/exp10_released_stats.py --tune-residual --out docs/results
    python experiments/exp10_released_stats.py --tune --out docs/results
    python experiments/exp10_released_stats.py --dataset mnist5k --tune --out docs/results
    python experiments/exp10_released_stats.py --partitions iid dirichlet-0.1 dirichlet-0.5 shards-1 --out docs/results
    python experiments/exp10_released_stats.py --dataset mnist5k --partitions iid dirichlet-0.1 --out docs/results
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from pathlib import Path

import numpy as np
from exp8_shared_features import features, pools, silo_splits

from ldpfl.mechanisms import statistics_model as sm
from ldpfl.mechanisms import sufficient_statistics as ss

SILOS, DELTA, CLASSES, WIDTH = 10, 1e-5, 10, 3969
PROJECTION_SEED, SYNTHETIC_SEED = 0, 1
GRID = {"k": {"fashion-mnist": [192, 256, 384, 512], "mnist5k": [32, 64, 128, 192, 256, 512]},
        "shares": [(0.5, 0.05, 0.45), (0.3, 0.02, 0.68)], "shrinkage": [0.05, 0.1, 0.2, 0.4]}
CENTERED_GRID = {"k": {"fashion-mnist": [256, 384, 512, 768, 1024], "mnist5k": [32, 64, 128, 256, 512]},
                 "shares": [(0.5, 0.05, 0.45), (0.3, 0.02, 0.68)], "shrinkage": [0.05, 0.1, 0.2]}
"""The grid of the release about the class means (wider K: its moments carry half the noise)."""
RESIDUAL_GRID = {"k": {"mnist5k": [64, 128, 256], "fashion-mnist": [512, 768]},
                 "shares": [(0.5, 0.05, 0.45), (0.3, 0.02, 0.68)],
                 "residual_fraction": [0.4, 0.5, 0.6, 0.8], "shrinkage": [0.05, 0.1, 0.2, 0.4]}
"""The grid at epsilon 3 of the residual clip C_r = r·C: MNIST-5k's 200 validation records cannot tell r apart
(every r within one record), so r was chosen on Fashion-MNIST's validation records (0.4, the package default)."""
"""The grid chosen from on validation records at each epsilon; the clip fraction is MNIST-5k's (``--tune-clip``)."""
CLIP_GRID = {"k": [128, 256, 384], "shares": [(0.5, 0.05, 0.45), (0.3, 0.02, 0.68), (0.65, 0.03, 0.32)],
             "clip_fraction": [0.6, 0.75, 0.9], "shrinkage": [0.05, 0.1, 0.2, 0.4, 0.8]}
"""MNIST-5k's grid at epsilon 3, from which the default clip fraction (0.6) was chosen."""


def projected(x: np.ndarray, k: int, clip_fraction: float) -> tuple[np.ndarray, float]:
    """All records projected to k and clipped to C = f·√k, divided by C (so the release's clip is 1)."""
    clip = clip_fraction * math.sqrt(k)
    basis = ss.projection(WIDTH, k, PROJECTION_SEED)
    z = np.empty((len(x), k))
    for start in range(0, len(x), 10_000):
        z[start:start + 10_000] = ss.project_and_clip(x[start:start + 10_000], basis, clip) / clip
    return z, clip


def releases(z, y, splits, epsilon: float, shares, rng, residual: float | None = None
             ) -> tuple[list[ss.Statistics], ss.NoiseScales]:
    """Each silo's release (C = 1: z is divided by C); ``residual`` C_r: moments about its own noisy class means."""
    mu = ss.calibrate_mu(epsilon, DELTA, shares=shares, centered=residual is not None)
    scales = ss.noise_scales(mu, 1.0, shares, moments_clip=residual)
    if residual is None:
        return [ss.release(ss.statistics(z[s["train"]], y[s["train"]], CLASSES), scales, rng) for s in splits], scales
    stats = []
    for s in splits:  # the package's two parts (gaussian_statistics.release_records), on C = 1
        zs, ys = z[s["train"]], y[s["train"]]
        first = ss.release_first_part(ss.statistics(zs, ys, CLASSES, moments=False), scales, rng)
        moments = ss.residual_moments(zs, ys, ss.noisy_means(first), residual)
        stats.append(ss.release_second_part(first, moments, scales, rng))
    return stats, scales


def pooled(stats: list[ss.Statistics], scales: ss.NoiseScales) -> tuple[ss.Statistics, ss.NoiseScales]:
    total, noise = stats[0], scales
    for s in stats[1:]:
        total, noise = total + s, noise + scales
    return total, noise


def lda_accuracy(model: sm.GaussianModel, z: np.ndarray, y: np.ndarray) -> float:
    weights, biases = model.discriminant()
    return float(np.mean(np.argmax(z @ weights + biases, axis=1) == y)) if len(y) else math.nan


def fc_federation(models: list[sm.GaussianModel], z_test, y_test, seed: int, *, rounds: int = 100,
                  lr: float = 16.0) -> object:
    """FedAvg of a linear softmax head over each silo's synthetic records (full-batch local steps, numpy)."""
    data = [sm.synthetic_records(m, SYNTHETIC_SEED + i) for i, m in enumerate(models)]
    k = z_test.shape[1]
    rng = np.random.default_rng(seed)
    w, b = rng.normal(0, 0.01, (k, CLASSES)), np.zeros(CLASSES)
    sizes = np.array([len(lab) for _, lab in data], dtype=float)
    for _ in range(rounds):
        updates = []
        for rows, labels in data:
            wl, bl = w.copy(), b.copy()
            for _step in range(5):
                logits = rows @ wl + bl
                p = np.exp(logits - logits.max(1, keepdims=True))
                p /= p.sum(1, keepdims=True)
                p[np.arange(len(labels)), labels] -= 1
                wl -= lr * rows.T @ p / len(labels)
                bl -= lr * p.mean(0)
            updates.append((wl, bl))
        w = sum(s * u[0] for s, u in zip(sizes, updates, strict=True)) / sizes.sum()
        b = sum(s * u[1] for s, u in zip(sizes, updates, strict=True)) / sizes.sum()
    return w, b


def tune(x, y, pool, out: Path, dataset: str, epsilons, clip_fraction: float, residual: float | None) -> dict:
    """Choose (k, shares, shrinkage) at each epsilon on the 10 IID silos' validation records (seed 0)."""
    splits = silo_splits(y, pool, "iid", 0)
    val = np.concatenate([s["val"] for s in splits])
    rows = []
    grid = GRID if residual is None else CENTERED_GRID
    for k in grid["k"][dataset]:
        z, _clip = projected(x, k, clip_fraction)
        for epsilon, shares in itertools.product(epsilons, grid["shares"]):
            stats, scales = releases(z, y, splits, epsilon, shares, np.random.default_rng(0), residual)
            total, noise = pooled(stats, scales)
            for a in grid["shrinkage"]:
                acc = lda_accuracy(sm.estimate(total, noise, shrinkage=a), z[val], y[val])
                rows.append({"epsilon": epsilon, "k": k, "clip_fraction": clip_fraction, "shares": list(shares),
                             "residual_fraction": residual, "shrinkage": a, "validation_accuracy": acc})
                print(json.dumps(rows[-1]), flush=True)
    chosen = {f"{e:g}": max((r for r in rows if r["epsilon"] == e), key=lambda r: r["validation_accuracy"])
              for e in epsilons}
    result = {"dataset": dataset, "chosen_on": "the 10 IID silos' validation records (5 %), seed 0, each epsilon",
              "clip_fraction_from": "MNIST-5k (exp10_clip_tuning_mnist5k.json)", "grid": rows, "chosen": chosen}
    (out / f"exp10_tuning_{dataset}{suffix(residual)}.json").write_text(json.dumps(result, indent=1))
    return chosen


def suffix(residual: float | None) -> str:
    """The results' file-name suffix: none for the release about the class means, ``_origin`` for the first."""
    return "_origin" if residual is None else ""


def scored(z, y, splits, val, shares, shrinkages, fields: dict, residual: float | None = None) -> list[dict]:
    """One release of the IID silos at epsilon 3 (seed 0), LDA at each shrinkage scored on the validation rows."""
    stats, scales = releases(z, y, splits, 3.0, shares, np.random.default_rng(0), residual)
    total, noise = pooled(stats, scales)
    return [{**fields, "shares": list(shares), "shrinkage": a,
             "validation_accuracy": lda_accuracy(sm.estimate(total, noise, shrinkage=a), z[val], y[val])}
            for a in shrinkages]


def tune_residual(x, y, pool, out: Path, dataset: str, clip_fraction: float) -> dict:
    """The grid (``RESIDUAL_GRID``) at epsilon 3 on the IID silos' validation records: the residual clip fraction."""
    splits = silo_splits(y, pool, "iid", 0)
    val = np.concatenate([s["val"] for s in splits])
    rows = []
    for k in RESIDUAL_GRID["k"][dataset]:
        z, _clip = projected(x, k, clip_fraction)
        for r, shares in itertools.product(RESIDUAL_GRID["residual_fraction"], RESIDUAL_GRID["shares"]):
            rows += scored(z, y, splits, val, shares, RESIDUAL_GRID["shrinkage"], {"k": k, "residual_fraction": r}, r)
    best = max(rows, key=lambda r: r["validation_accuracy"])
    result = {"dataset": dataset, "chosen_on": "the 10 IID silos' validation records, epsilon 3, seed 0",
              "clip_fraction": clip_fraction, "grid": rows, "chosen": best}
    (out / f"exp10_residual_tuning_{dataset}.json").write_text(json.dumps(result, indent=1))
    return best


def tune_clip(x, y, pool, out: Path, dataset: str) -> dict:
    """MNIST-5k's grid (``CLIP_GRID``) at epsilon 3: where the default clip fraction was chosen."""
    splits = silo_splits(y, pool, "iid", 0)
    val = np.concatenate([s["val"] for s in splits])
    rows = []
    for k, f in itertools.product(CLIP_GRID["k"], CLIP_GRID["clip_fraction"]):
        z, _clip = projected(x, k, f)
        for shares in CLIP_GRID["shares"]:
            rows += scored(z, y, splits, val, shares, CLIP_GRID["shrinkage"], {"k": k, "clip_fraction": f})
    best = max(rows, key=lambda r: r["validation_accuracy"])
    result = {"dataset": dataset, "chosen_on": "the 10 IID silos' validation records, epsilon 3, seed 0",
              "grid": rows, "chosen": best}
    (out / f"exp10_clip_tuning_{dataset}.json").write_text(json.dumps(result, indent=1))
    return best


def front(x, y, pool, test, choices: dict, partitions, epsilons, seeds: int, dataset: str, fc: bool) -> list[dict]:
    records = []
    spaces: dict[tuple[int, float], tuple[np.ndarray, float]] = {}
    for epsilon in epsilons:
        chosen = choices.get(f"{epsilon:g}", choices.get("all"))
        k, f, shares, a = chosen["k"], chosen["clip_fraction"], tuple(chosen["shares"]), chosen["shrinkage"]
        residual = chosen.get("residual_fraction")
        if (k, f) not in spaces:
            spaces.clear()
            spaces[(k, f)] = projected(x, k, f)
        z, clip = spaces[(k, f)]
        for partition in partitions:
            splits = silo_splits(y, pool, partition, 0)
            for seed in range(seeds if epsilon == 3 else 1):
                start = time.perf_counter()
                rng = np.random.default_rng([seed, int(epsilon * 1000)])
                stats, scales = releases(z, y, splits, epsilon, shares, rng, residual)
                mu = scales.mu
                eps = ss.epsilons(mu, DELTA, shares, centered=residual is not None)
                total, noise = pooled(stats, scales)
                model = sm.estimate(total, noise, shrinkage=a)
                alone = [sm.estimate(s, scales, shrinkage=a) for s in stats]
                common = {"dataset": dataset, "partition": partition, "seed": seed,
                          "moments_about": "origin" if residual is None else "class-means",
                          "residual_fraction": residual,
                          "epsilon_add_remove": eps["add-remove"], "epsilon_replace_one": eps["replace-one"],
                          "delta": DELTA, "epsilon_add_remove_target": epsilon, "k": k, "clip": clip,
                          "clip_fraction": f, "shares": list(shares), "shrinkage": a, "mu": mu,
                          "silo_train_rows": [len(s["train"]) for s in splits]}
                held = [lda_accuracy(model, z[s["held"]], y[s["held"]]) for s in splits]
                held_sizes = [len(s["held"]) for s in splits]
                records.append({**common, "setting": "released-stats",
                                "accuracy": lda_accuracy(model, z[test], y[test]),
                                "accuracy_of": "LDA on the 10 pooled releases", "per_silo_heldout": held,
                                "heldout_accuracy": float(np.average(held, weights=held_sizes))})
                per = [lda_accuracy(m, z[test], y[test]) for m in alone]
                held_alone = [lda_accuracy(m, z[s["held"]], y[s["held"]]) for m, s in zip(alone, splits, strict=True)]
                records.append({**common, "setting": "released-stats-alone", "accuracy": float(np.mean(per)),
                                "accuracy_of": "the mean over the 10 silos of LDA on its own release",
                                "per_silo_test": per, "per_silo_heldout": held_alone,
                                "heldout_accuracy": float(np.average(held_alone,
                                                                     weights=[len(s["held"]) for s in splits]))})
                if fc and seed == 0:
                    w, b = fc_federation(alone, z[test], y[test], seed)
                    acc = float(np.mean(np.argmax(z[test] @ w + b, 1) == y[test]))
                    records.append({**common, "setting": "released-stats-fc", "accuracy": acc,
                                    "accuracy_of": "FedAvg of a linear head over the 10 silos' synthetic records"})
                for r in records[-3:]:
                    r["seconds"] = time.perf_counter() - start
                print(json.dumps({key: records[-1][key] for key in ("partition", "setting", "seed", "accuracy")}),
                      [round(r["accuracy"], 4) for r in records[-3:]], f"eps {epsilon}", flush=True)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=("fashion-mnist", "mnist5k"), default="fashion-mnist")
    parser.add_argument("--tune", action="store_true", help="choose k, shares and shrinkage on validation")
    parser.add_argument("--tune-clip", action="store_true", help="choose the clip fraction (MNIST-5k, epsilon 3)")
    parser.add_argument("--tune-residual", action="store_true",
                        help="choose the residual clip fraction (MNIST-5k, epsilon 3)")
    parser.add_argument("--moments-about", choices=("class-means", "origin"), default="class-means")
    parser.add_argument("--partitions", nargs="+", default=["iid", "dirichlet-0.1", "dirichlet-0.5", "shards-1"])
    parser.add_argument("--epsilons", nargs="+", type=float, default=[1, 2, 3, 5, 8])
    parser.add_argument("--seeds", type=int, default=3, help="seeds at epsilon 3 (one at the others)")
    parser.add_argument("--no-fc", action="store_true", help="skip the FC federation over synthetic records")
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    args = parser.parse_args()
    short = "fmnist" if args.dataset == "fashion-mnist" else args.dataset
    x, y = features(Path(f"runs/exp8_cache/{short}_scatter"), args.dataset)
    pool, test = pools(args.dataset, y)
    args.out.mkdir(parents=True, exist_ok=True)
    clip_fraction = json.loads((args.out / "exp10_clip_tuning_mnist5k.json").read_text())["chosen"]["clip_fraction"]
    residual = None
    if args.moments_about == "class-means" and not args.tune_residual:
        residual = json.loads((args.out / "exp10_residual_tuning_fashion-mnist.json").read_text())["chosen"][
            "residual_fraction"]
    tuning = args.out / f"exp10_tuning_{args.dataset}{suffix(residual)}.json"
    if args.tune_clip:
        print("chosen", tune_clip(x, y, pool, args.out, args.dataset))
        return
    if args.tune_residual:
        print("chosen", tune_residual(x, y, pool, args.out, args.dataset, clip_fraction))
        return
    if args.tune:
        print("chosen", tune(x, y, pool, args.out, args.dataset, args.epsilons, clip_fraction, residual))
        return
    stored = json.loads(tuning.read_text())["chosen"]
    choices = stored if "k" not in stored else {"all": stored}
    records = front(x, y, pool, test, choices, args.partitions, args.epsilons, args.seeds, args.dataset,
                    not args.no_fc)
    path = args.out / f"exp10_released_stats_{args.dataset}{suffix(residual)}.json"
    old = json.loads(path.read_text()) if path.exists() else []
    keep = [r for r in old if r["partition"] not in args.partitions]
    path.write_text(json.dumps(keep + records, indent=1))


if __name__ == "__main__":
    main()
