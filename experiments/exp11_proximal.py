"""DP fine-tuning tied to the global model (Ditto's λ, ``personalize --proximal``): own records against the pooled set.

exp11's DP fine-tuning (30 more DP-SGD steps at the federation's σ, q and C, SGD momentum 0.9, the silo's accountant
continued: ε 3 → 3.16 add/remove) over exp11's cached global models, with Ditto's tie λ/2·‖θ − θ_global‖²
(``personalize.proximal.ProximalSGD``; the tie uses no record, so every λ has the same ε). For each silo and each
(lr, λ) in {0.1, 0.5, 2, 8} × {0, 0.01, 0.03, 0.1, 0.3, 1}: validation accuracy and its per-row correct marks, own
held-out accuracy and pooled test accuracy. Then two choices, each per silo on its validation rows only:

* ``best``: the best validation accuracy (ties: the lower validation loss);
* ``one-se``: the largest λ whose validation accuracy is within one standard error of the best's (the paired
  difference of the correct marks, as the interpolation's rule), then the best validation accuracy among those.

It prints each fixed λ (lr chosen on validation) and each choice: own held-out (mean over silos), pooled test (mean
over the silos' models). Run exp11 first (it caches each federation's global model in ``runs/exp11_cache``):

    nice -n 19 python experiments/exp11_proximal.py --partition dirichlet-0.1 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import exp8_shared_features as exp8
import numpy as np
import torch
from exp11_personalization import CACHE, DP_FT_GRID, FINE_TUNE_MOMENTUM, FINE_TUNE_STEPS, fresh_copy, loss_acc

from ldpfl.mechanisms import accounting
from ldpfl.stage2_federate.model import FederatedMLP
from ldpfl.stage2_federate.personalize.settings import DP, PersonalizeSettings
from ldpfl.stage2_federate.personalize.training import fine_tune_dp, logits
from ldpfl.stage2_federate.silo_training.accountant import SiloAccountant

LAMBDAS = (0.0, 0.01, 0.03, 0.1, 0.3, 1.0)


def validation_key(table: dict, silo: int):
    """Order (lr, λ) by ``silo``'s validation accuracy, ties by the lower validation loss (exp11's ``pick``)."""
    return lambda key: (table[key][silo]["val"], -table[key][silo]["val_loss"])


def choose(table: dict, silo: int, rule: str) -> tuple[float, float]:
    """The (lr, λ) that ``rule`` picks for ``silo`` from its validation figures."""
    best = max(table, key=validation_key(table, silo))
    if rule == "best":
        return best
    marks = np.asarray(table[best][silo]["marks"], dtype=float)
    close = []
    for key in table:
        diff = marks - np.asarray(table[key][silo]["marks"], dtype=float)
        if diff.mean() <= diff.std() / np.sqrt(len(diff)):
            close.append(key)
    return max(close, key=lambda k: (k[1], *validation_key(table, silo)(k)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=("fashion-mnist", "mnist5k"), default="fashion-mnist")
    parser.add_argument("--partition", default="dirichlet-0.1")
    parser.add_argument("--epsilon", type=float, default=3.0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path("docs/results/exp11_proximal.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    cache = Path(f"runs/exp8_cache/{'fmnist' if args.dataset == 'fashion-mnist' else args.dataset}_scatter")
    x, y = exp8.features(cache, args.dataset)
    pool, test_rows = exp8.pools(args.dataset, y)
    test = exp8.split_of(x, y, test_rows)
    sigma = exp8.sigma_for(args.epsilon)
    rows = []
    for seed in args.seeds:
        splits = exp8.silo_splits(y, pool, args.partition, seed)
        cached = sorted(CACHE.glob(f"{args.dataset}_{args.partition}_eps{args.epsilon:g}_seed{seed}_lr*.pt"))
        if not cached:
            raise SystemExit(f"no cached global model for seed {seed}: run exp11_personalization.py first")
        global_model = FederatedMLP(exp8.WIDTH, [], exp8.CLASSES, 0.0)
        global_model.load_state_dict(torch.load(cached[0], weights_only=True)["state"])
        table: dict[tuple[float, float], list[dict]] = {}
        for i in range(exp8.SILOS):
            train, val, held = (exp8.split_of(x, y, splits[i][part]) for part in ("train", "val", "held"))
            accountant = SiloAccountant(i, "", sigma, exp8.Q, exp8.CLIP, exp8.DELTA, accounting.ADD_REMOVE,
                                        len(splits[i]["train"]), exp8.ROUNDS)
            for lr in DP_FT_GRID:
                for lam in LAMBDAS:
                    model = fresh_copy(global_model)
                    settings = PersonalizeSettings(DP, lr=lr, steps=FINE_TUNE_STEPS, momentum=FINE_TUNE_MOMENTUM,
                                                   proximal=lam)
                    fine_tune_dp(model, train, accountant, settings,
                                 generator=torch.Generator().manual_seed(seed * 1000 + i * 10 + 3),
                                 rng=np.random.default_rng([seed, i, 4, int(lr * 1000)]))
                    val_loss, val_acc = loss_acc(model, val)
                    marks = (logits(model, val).argmax(dim=1) == val.labels).int().tolist()
                    table.setdefault((lr, lam), []).append({"val": val_acc, "val_loss": val_loss, "marks": marks,
                                                            "own": loss_acc(model, held)[1],
                                                            "pooled": loss_acc(model, test)[1]})
        lines = {f"lambda {lam:g}": [max(((lr, lam) for lr in DP_FT_GRID), key=validation_key(table, i))
                                     for i in range(exp8.SILOS)] for lam in LAMBDAS}
        lines |= {rule: [choose(table, i, rule) for i in range(exp8.SILOS)] for rule in ("best", "one-se")}
        for name, picks in lines.items():
            own = float(np.mean([table[k][i]["own"] for i, k in enumerate(picks)]))
            pooled = float(np.mean([table[k][i]["pooled"] for i, k in enumerate(picks)]))
            rows.append({"dataset": args.dataset, "partition": args.partition,
                         "epsilon_add_remove_target": args.epsilon, "seed": seed, "choice": name,
                         "own_heldout": own, "pooled_test": pooled,
                         "lambda": [k[1] for k in picks], "lr": [k[0] for k in picks]})
            print(f"{args.dataset} {args.partition} seed {seed} {name:<12} own {own:.4f} pooled {pooled:.4f}",
                  flush=True)
    args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
