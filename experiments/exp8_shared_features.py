"""The front that decides (issue 34): does a silo gain by joining, on shared ScatterNet features with DP-SGD?

Fashion-MNIST's 60,000 training records are split among 10 silos (IID, Dirichlet β = 0.5 and β = 0.1 over the
labels, or ``shards-1``: DP-FedAW's split, every silo two label-sorted shards: ``stage1_features.export.partition
.make_partition``); each silo keeps 90 % of its records for training,
5 % for validation (hyperparameter choice) and 5 % as its own held-out records. Every record is mapped by the
weight-free ScatterNet (``stage1_features.models.scatter``: kymatio J = 2, L = 8, GroupNorm(27); no privacy
cost), and a linear head is trained with record-level DP-SGD (``stage2_federate.dp_sgd.train_dp_sgd``: Opacus
ghost clipping, clip 0.1, Poisson rate q = 0.1365, noise from the silo's own stream) at a per-silo (ε, δ = 1e-5)
stated under add/remove and calibrated over every step by the project's accountant (``contract.accounting``):

* ``alone``: each silo trains on its own records only (300 steps, SGD momentum 0.9); the row is the mean over
  the 10 silos (each silo's accuracy is in ``per_silo``);
* ``federated``: FedAvg of the 10 silos, one DP-SGD step each per round, 300 rounds, server momentum 0.9
  (what ``ldpfl federate --dp-sgd --local-steps 1 --server-momentum 0.9 --hidden none`` runs);
* ``central``: the pooled 54,000 training records in one place, 300 steps (the ceiling at the same per-record ε).

The learning rate of each (partition, setting) is chosen from ``--lr-grid`` on the validation records at ε = 3,
seed 0, and kept for every ε and seed. Accuracies are on Fashion-MNIST's official 10,000 test records (never
used for a choice); ``per_silo_heldout`` gives each silo's own held-out records. Everything here calls the
package's own functions; nothing of the product is re-implemented.

    python experiments/exp8_shared_features.py --partitions iid dirichlet-0.5 --out docs/results
    python experiments/exp8_shared_features.py --partitions dirichlet-0.1 --settings alone federated --out ...
    python experiments/exp8_shared_features.py --partitions iid --settings central --out docs/results
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from ldpfl.mechanisms import accounting
from ldpfl.stage1_features.datasets.loaders import load_dataset
from ldpfl.stage1_features.export.partition import make_partition
from ldpfl.stage1_features.models.scatter import ScatterNet
from ldpfl.stage2_federate.data import ClientSplit
from ldpfl.stage2_federate.model import build_model, evaluate, get_vector, make_optimizer, set_vector
from ldpfl.stage2_federate.server_optimizers import FedAvgM
from ldpfl.stage2_federate.silo_training.dp_sgd import train_dp_sgd
from ldpfl.stage2_federate.silo_training.dp_sgd_budget import DpSgdClient

SILOS, ROUNDS, Q, CLIP, DELTA, MOMENTUM = 10, 300, 0.1365, 0.1, 1e-5, 0.9
WIDTH, CLASSES = 3969, 10
DATASETS = ("fashion-mnist", "mnist5k")


def pools(dataset: str, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The silos' pool and the test records: Fashion-MNIST's official 60,000 / 10,000; MNIST-5k (no official
    split) 4,000 / 1,000 after a fixed permutation."""
    if dataset == "fashion-mnist":
        return np.arange(60_000), np.arange(60_000, len(labels))
    order = np.random.default_rng(12345).permutation(len(labels))
    return np.sort(order[:4000]), np.sort(order[4000:])


def features(cache: Path, dataset: str) -> tuple[np.ndarray, np.ndarray]:
    """All the dataset's records through the ScatterNet (cached as float32 .npy beside ``cache``)."""
    x_path, y_path = cache.with_suffix(".x.npy"), cache.with_suffix(".y.npy")
    if x_path.exists():
        return np.load(x_path, mmap_mode="r"), np.load(y_path)
    data = load_dataset(dataset)
    start = time.perf_counter()
    x = ScatterNet().transform(data.features().reshape(len(data), 28, 28, 1))
    print(f"scattered {len(x)} images in {time.perf_counter() - start:.0f} s", flush=True)
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.save(x_path, x)
    np.save(y_path, data.y)
    return x, data.y


def silo_splits(labels: np.ndarray, pool: np.ndarray, partition: str, seed: int) -> list[dict[str, np.ndarray]]:
    """Each silo's train / validation / held-out rows (90 / 5 / 5 %) of the ``pool`` rows."""
    rng = np.random.default_rng(10_000 + seed)
    kind, _, parameter = partition.partition("-")  # dirichlet-β; shards-U: a fraction U of 2-shard silos
    option = {"unb": float(parameter or 0.5)} if kind == "shards" else {"beta": float(parameter or 0.5)}
    part = make_partition(labels[pool], SILOS, kind=kind, rng=rng, min_samples=10 if len(pool) > 10_000 else 5,
                          **option)
    out = []
    for rows in part.clients:
        rows = rng.permutation(pool[rows])
        a, b = int(0.9 * len(rows)), int(0.95 * len(rows))
        out.append({"train": np.sort(rows[:a]), "val": np.sort(rows[a:b]), "held": np.sort(rows[b:])})
    return out


def split_of(x: np.ndarray, y: np.ndarray, rows: np.ndarray) -> ClientSplit:
    return ClientSplit(torch.from_numpy(np.ascontiguousarray(x[rows])), torch.from_numpy(y[rows]), WIDTH, False)


def dp_client(index: int, records: int, sigma: float, steps: int, *, q: float = Q, clip: float = CLIP) -> DpSgdClient:
    return DpSgdClient(index, sigma, clip, q, steps, DELTA, accounting.ADD_REMOVE, records)


def sigma_for(epsilon: float, *, q: float = Q, steps: int = ROUNDS) -> float:
    """σ of ε per silo (add/remove, δ = 1e-5) over ``steps`` Poisson steps at ``q`` (the front's 300 at 0.1365)."""
    return accounting.calibrate_noise_multiplier(epsilon, DELTA, q, steps, neighbours=accounting.ADD_REMOVE)


def run_alone(x, y, splits, sigma: float, lr: float, seed: int) -> list[torch.nn.Module]:
    models = []
    for i, s in enumerate(splits):
        gen = torch.Generator().manual_seed(seed * 100 + i)
        model = build_model(WIDTH, (), CLASSES, generator=gen)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)
        train_dp_sgd(model, split_of(x, y, s["train"]), dp_client(i, len(s["train"]), sigma, ROUNDS),
                     optimizer=optimizer, generator=gen, rng=np.random.default_rng([seed, i, 1]))
        models.append(model)
    return models


def run_federated(x, y, splits, sigma: float, lr: float, seed: int, *, q: float = Q, rounds: int = ROUNDS,
                  clip: float = CLIP, server_momentum: float = MOMENTUM) -> torch.nn.Module:
    """FedAvg of the silos, one DP-SGD step each a round (q, C and the rounds: the front's unless given)."""
    gen = torch.Generator().manual_seed(seed)
    model = build_model(WIDTH, (), CLASSES, generator=gen)
    data = [split_of(x, y, s["train"]) for s in splits]
    clients = [dp_client(i, len(s["train"]), sigma, 1, q=q, clip=clip) for i, s in enumerate(splits)]
    rngs = [np.random.default_rng([seed, i, 2]) for i in range(SILOS)]
    momentum = FedAvgM(server_momentum)
    vector = get_vector(model).numpy()
    for _round in range(rounds):
        uploads = []
        for i in range(SILOS):
            set_vector(model, torch.from_numpy(vector.copy()))
            train_dp_sgd(model, data[i], clients[i], optimizer=make_optimizer("sgd", model.parameters(), lr),
                         generator=gen, rng=rngs[i])
            uploads.append(get_vector(model).numpy())
        vector = momentum.step(vector, np.mean(uploads, axis=0).astype(np.float32))
    set_vector(model, torch.from_numpy(vector.copy()))
    return model


def run_central(x, y, splits, sigma: float, lr: float, seed: int) -> torch.nn.Module:
    rows = np.sort(np.concatenate([s["train"] for s in splits]))
    gen = torch.Generator().manual_seed(seed)
    model = build_model(WIDTH, (), CLASSES, generator=gen)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)
    train_dp_sgd(model, split_of(x, y, rows), dp_client(0, len(rows), sigma, ROUNDS), optimizer=optimizer,
                 generator=gen, rng=np.random.default_rng([seed, 3]))
    return model


def accuracy(model, x, y, rows) -> float:
    return float(evaluate(model, [split_of(x, y, rows)], 4096)[1])


def score(setting: str, result, x, y, splits, which: str) -> tuple[float, list[float]]:
    """Mean accuracy on ``which`` rows of the silos (alone: each silo's own model) and per silo."""
    if setting == "alone":
        per = [accuracy(m, x, y, s[which]) for m, s in zip(result, splits, strict=True)]
    else:
        per = [accuracy(result, x, y, s[which]) for s in splits]
    sizes = [len(s[which]) for s in splits]
    return float(np.average(per, weights=sizes)), per


def test_accuracy(setting: str, result, x, y, rows: np.ndarray) -> tuple[float, list[float] | None]:
    if setting == "alone":
        per = [accuracy(m, x, y, rows) for m in result]
        return float(np.mean(per)), per
    return accuracy(result, x, y, rows), None


RUNNERS = {"alone": run_alone, "federated": run_federated, "central": run_central}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=DATASETS, default="fashion-mnist")
    parser.add_argument("--partitions", nargs="+", default=["iid", "dirichlet-0.5", "dirichlet-0.1"])
    parser.add_argument("--settings", nargs="+", default=["alone", "federated"], choices=sorted(RUNNERS))
    parser.add_argument("--epsilons", nargs="+", type=float, default=[1, 2, 3, 5, 8])
    parser.add_argument("--seeds", type=int, default=3, help="seeds at epsilon 3 (one seed at the others)")
    parser.add_argument("--lr-grid", nargs="+", type=float, default=[4.0, 16.0])
    parser.add_argument("--cache", type=Path, default=None, help="default runs/exp8_cache/DATASET_scatter")
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    cache = args.cache or Path(f"runs/exp8_cache/{'fmnist' if args.dataset == 'fashion-mnist' else args.dataset}"
                               "_scatter")
    x, y = features(cache, args.dataset)
    pool, test_rows = pools(args.dataset, y)
    prefix = "exp8_shared_features" if args.dataset == "fashion-mnist" else f"exp8_shared_features_{args.dataset}"
    args.out.mkdir(parents=True, exist_ok=True)
    for partition in args.partitions:
        for setting in args.settings:
            name = "central" if setting == "central" else partition
            path = args.out / f"{prefix}_{setting}_{name}.json"
            records: list[dict] = json.loads(path.read_text()) if path.exists() else []
            done = {(r["epsilon_add_remove_target"], r["seed"]) for r in records if not r.get("tuning")}
            splits = silo_splits(y, pool, partition, 0)
            tuned = [r for r in records if r.get("tuning")]
            chosen_before = max(tuned, key=lambda r: r["validation_accuracy"])["lr"] if tuned else None
            for lr in args.lr_grid:  # the grid may grow between invocations: only new values are tried
                if any(r["lr"] == lr for r in tuned):
                    continue
                start = time.perf_counter()
                result = RUNNERS[setting](x, y, splits, sigma_for(3.0), lr, 0)
                val, _ = score(setting, result, x, y, splits, "val")
                tuned.append({"tuning": True, "lr": lr, "validation_accuracy": val, "epsilon": 3.0,
                              "seconds": time.perf_counter() - start})
                print(f"{partition} {setting} lr {lr}: validation {val:.4f}", flush=True)
                records = [r for r in records if not r.get("tuning")] + tuned
                path.write_text(json.dumps(records, indent=1))
            if chosen_before is not None and max(tuned, key=lambda r: r["validation_accuracy"])["lr"] != chosen_before:
                records = list(tuned)  # a better learning rate: the runs made with the old one are redone
                done = set()
                path.write_text(json.dumps(records, indent=1))
            lr = max(tuned, key=lambda r: r["validation_accuracy"])["lr"]
            for epsilon in args.epsilons:
                for seed in range(args.seeds if epsilon == 3 else 1):
                    if (epsilon, seed) in done:
                        continue
                    splits = silo_splits(y, pool, partition, seed)
                    sigma = sigma_for(epsilon)
                    start = time.perf_counter()
                    result = RUNNERS[setting](x, y, splits, sigma, lr, seed)
                    test, per_model = test_accuracy(setting, result, x, y, test_rows)
                    held, per_silo = score(setting, result, x, y, splits, "held")
                    event = accounting.DpSgdEvent(sigma, Q, ROUNDS)
                    both = accounting.dp_sgd_epsilons(event, DELTA)
                    records.append({
                        "dataset": args.dataset, "partition": partition if setting != "central" else "pooled",
                        "setting": setting, "seed": seed, "epsilon_add_remove_target": epsilon,
                        "epsilon_add_remove": both[accounting.ADD_REMOVE],
                        "epsilon_replace_one": both[accounting.REPLACE_ONE], "delta": DELTA,
                        "accuracy": test, "accuracy_of": ("the mean over the 10 silos' own models"
                                                          if setting == "alone" else "the one model"),
                        "per_silo_test": per_model, "heldout_accuracy": held, "per_silo_heldout": per_silo,
                        "lr": lr, "noise_multiplier": sigma, "sampling_probability": Q, "clip": CLIP,
                        "steps_per_silo": ROUNDS, "seconds": time.perf_counter() - start,
                        "silo_train_rows": [len(s["train"]) for s in splits]})
                    path.write_text(json.dumps(records, indent=1))
                    print(f"{partition} {setting} eps {epsilon} seed {seed}: test {test:.4f} held-out {held:.4f} "
                          f"({time.perf_counter() - start:.0f} s)", flush=True)
            if setting == "central":
                break


if __name__ == "__main__":
    main()
