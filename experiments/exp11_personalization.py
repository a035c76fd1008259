"""What a silo gets from joining, judged on its own records (issue 41): the personalization front.

The setup is exp8's shared-features front (``exp8_shared_features``): Fashion-MNIST (or MNIST-5k) through the
weight-free ScatterNet (the cached features), 10 silos, each keeping 90 / 5 / 5 % of its records for training,
validation and its own held-out set (``silo_splits``), a linear head. For each split, at a per-silo ε (add/remove,
δ 1e-5, the front's σ over 300 Poisson steps at q 0.1365):

* ``global``: the DP-SGD federation (``run_federated``: FedAvg, one DP-SGD step per silo a round, 300 rounds,
  server momentum 0.9, exp8's learning rate for the split, read from its ``..._federated_SPLIT.json``);
* ``alone-dp``: each silo's own DP-SGD model at the same ε (``run_alone``, exp8's learning rate);
* ``alone-in-house``: each silo's own model without DP, trained on its training rows
  (``personalize.training.train_alone``: Adam, 10 epochs of batches of 32, from zero), Adam's learning rate
  chosen per silo on its validation rows;
* ``personalized-clear``: the global model fine-tuned in clear on the silo's training rows
  (``personalize.training.fine_tune_clear``), learning rate chosen per silo on its validation rows: local-only;
* ``personalized-dp``: 30 more DP-SGD steps on the silo's training rows with the federation's σ, q and clip
  (``personalize.training.fine_tune_dp``), continuing the silo's accountant
  (``silo_training.accountant.SiloAccountant``: 300 + 30 steps composed by ``ldpfl.mechanisms.accounting``), SGD
  momentum 0.9, learning rate chosen per silo on its validation rows: releasable at the reported total ε;
* ``interpolated``: w·θ_global + (1 − w)·θ_alone-in-house, w in {0, 0.1, ..., 1} chosen per silo by
  cross-fitting (``personalize.training``): each training row scored by the in-house recipe trained on the other
  4 of 5 folds, each validation row by the in-house model; the best w is kept only where it beats w = 0 by more
  than one standard error of the paired difference (else the silo keeps its own model); local-only. Earlier
  runs chose w on the validation rows alone (5-20 rows on MNIST-5k, a noisy choice).

Every model is evaluated on each silo's own held-out rows (``evaluated_on`` ``own-heldout``: the mean over the
silos, unweighted, and the worst silo's gap to its best alone model, the better of alone-dp and alone-in-house)
and on the official pooled test set (``pooled-test``: the mean over the silos' models; the global model is one).
Validation rows make every choice; held-out and test rows make none. Records go to
``docs/results/exp11_personalization.json`` (exp8 front's fields plus ``evaluated_on``), the tables to
``exp11_personalization.md``.

    nice -n 19 python experiments/exp11_personalization.py --partitions iid dirichlet-0.1 shards-1
    nice -n 19 python experiments/exp11_personalization.py --dataset mnist5k --partitions iid dirichlet-0.1
    nice -n 19 python experiments/exp11_personalization.py --partitions dirichlet-0.5
    python experiments/exp11_personalization.py --report     # the markdown tables again, from the JSON

Each split's records replace that split's earlier ones (same dataset, ε and seed). ``--alone-dp exp8`` takes the
alone-DP figures from exp8's records of the same splits, seed, σ and learning rate instead of rerunning them
(the default reruns them; at ε = 3, seed 0 the reruns reproduce exp8's recorded held-out figures).
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import numpy as np
import torch
from exp8_shared_features import (
    CLASSES,
    CLIP,
    DELTA,
    ROUNDS,
    SILOS,
    WIDTH,
    Q,
    features,
    pools,
    run_alone,
    run_federated,
    sigma_for,
    silo_splits,
    split_of,
)

from ldpfl.mechanisms import accounting
from ldpfl.stage2_federate.model import FederatedMLP, evaluate
from ldpfl.stage2_federate.personalize.base_model import BaseModel
from ldpfl.stage2_federate.personalize.own_accuracy import class_accuracy
from ldpfl.stage2_federate.personalize.records import fold_assignment
from ldpfl.stage2_federate.personalize.settings import CLEAR, DP, INTERPOLATE, PersonalizeSettings
from ldpfl.stage2_federate.personalize.training import (
    choose_weight,
    fine_tune_clear,
    fine_tune_dp,
    interpolate,
    logits,
    out_of_fold_logits,
    train_alone,
)
from ldpfl.stage2_federate.silo_training.accountant import SiloAccountant, check_budget

FOLDS = 5  # the interpolation weight's cross-fitting
CHOICE = f"{FOLDS}-fold cross-fitting over training and validation rows, one-SE rule against w = 0"
CACHE = Path("runs/exp11_cache")  # each federation's global model, reused by a rerun of the same split, ε and seed
SETTINGS = ("alone-dp", "alone-in-house", "global", "personalized-clear", "personalized-dp", "interpolated")
LOCAL_ONLY = ("alone-in-house", "personalized-clear", "interpolated")
FINE_TUNE_STEPS, FINE_TUNE_MOMENTUM = 30, 0.9
ADAM_GRID = (3e-4, 1e-3, 3e-3, 1e-2)  # in-house training and clear fine-tuning (Adam), chosen per silo on validation
DP_FT_GRID = (0.1, 0.5, 2.0, 8.0)  # DP fine-tuning (SGD, momentum 0.9), chosen per silo on validation


def exp8_lr(results: Path, prefix: str, setting: str, partition: str) -> float:
    """The learning rate exp8 chose for (setting, partition) on the validation rows (its tuning records)."""
    records = json.loads((results / f"{prefix}_{setting}_{partition}.json").read_text())
    return float(max((r for r in records if r.get("tuning")), key=lambda r: r["validation_accuracy"])["lr"])


def exp8_alone_record(results: Path, prefix: str, partition: str, epsilon: float, seed: int) -> dict | None:
    path = results / f"{prefix}_alone_{partition}.json"
    if not path.exists():
        return None
    found = [r for r in json.loads(path.read_text())
             if not r.get("tuning") and r["epsilon_add_remove_target"] == epsilon and r["seed"] == seed]
    return found[0] if found else None


def linear_base(model: FederatedMLP) -> BaseModel:
    """The global model as the personalization library's ``BaseModel`` (shape and parameters; no file here)."""
    return BaseModel(Path("<in memory>"), {k: v.clone() for k, v in model.state_dict().items()}, {},
                     model.input_width, model.hidden, model.num_classes, 0.0, "")


def fresh_copy(model: FederatedMLP) -> FederatedMLP:
    out = FederatedMLP(model.input_width, model.hidden, model.num_classes, 0.0)
    out.load_state_dict(copy.deepcopy(model.state_dict()))
    return out


def loss_acc(model, split) -> tuple[float, float]:
    loss, acc = evaluate(model, [split], 4096)
    return float(loss), float(acc)


@torch.no_grad()
def test_class_accuracy(model, test, classes: int) -> np.ndarray:
    """The model's accuracy on each class's records of the official test set (``classes`` values)."""
    model.eval()
    figures = class_accuracy(model(test.inputs(slice(None))).argmax(dim=1).numpy(), test.labels.numpy(), classes)
    return np.array([np.nan if a is None else a for a in figures.per_class])


def own_mix(per_class: np.ndarray, mix: np.ndarray) -> float:
    """Σ_c π_ic·acc_c: the accuracy on silo i's label mix π_i, estimated on the official test records.

    The partitions split by label only, so within a class a silo's records and the test records follow one
    distribution: this is the silo's expected own-record accuracy, over every official test record of each class
    (about 1,000 a class on Fashion-MNIST) instead of its 5-1,072 held-out records.
    """
    return float(mix @ per_class)


def per_silo_choice(grid, val, fit) -> tuple[list[FederatedMLP], list[dict]]:
    """Each silo's model fitted at every learning rate of ``grid`` (``fit(i, lr)``): the one its validation picks."""
    models, choices = [], []
    for i in range(SILOS):
        lr, model, table = pick([(lr, fit(i, lr)) for lr in grid], val[i])
        models.append(model)
        choices.append({"lr": lr, "table": table})
    return models, choices


def pick(candidates: list[tuple[float, FederatedMLP]], val) -> tuple[float, FederatedMLP, list[dict]]:
    """The candidate with the best validation accuracy (ties: lower validation loss), and every candidate's."""
    table = []
    for lr, model in candidates:
        loss, acc = loss_acc(model, val)
        table.append({"lr": lr, "validation_accuracy": acc, "validation_loss": loss})
    best = max(range(len(table)), key=lambda j: (table[j]["validation_accuracy"], -table[j]["validation_loss"]))
    return candidates[best][0], candidates[best][1], table


def run_split(x, y, dataset: str, partition: str, pool, test_rows, epsilon: float, seed: int, results: Path,
              prefix: str, alone_dp_source: str) -> list[dict]:
    splits = silo_splits(y, pool, partition, seed)
    sigma = sigma_for(epsilon)
    fed_lr = exp8_lr(results, prefix, "federated", partition)
    alone_lr = exp8_lr(results, prefix, "alone", partition)
    train = [split_of(x, y, s["train"]) for s in splits]
    val = [split_of(x, y, s["val"]) for s in splits]
    held = [split_of(x, y, s["held"]) for s in splits]
    test = split_of(x, y, test_rows)
    models: dict[str, list[FederatedMLP] | None] = {}
    seconds: dict[str, float] = {}
    chosen: dict[str, list] = {}
    tag = f"{dataset} {partition} eps {epsilon:g} seed {seed}"

    cache = CACHE / f"{dataset}_{partition}_eps{epsilon:g}_seed{seed}_lr{fed_lr:g}.pt"
    cached = cache.exists()
    if cached:  # the same deterministic federation, run before (its state and its time)
        saved = torch.load(cache, weights_only=True)
        global_model = FederatedMLP(WIDTH, [], CLASSES, 0.0)
        global_model.load_state_dict(saved["state"])
        seconds["global"] = float(saved["seconds"])
    else:
        start = time.perf_counter()
        global_model = run_federated(x, y, splits, sigma, fed_lr, seed)
        seconds["global"] = time.perf_counter() - start
        CACHE.mkdir(parents=True, exist_ok=True)
        torch.save({"state": global_model.state_dict(), "seconds": seconds["global"]}, cache)
    print(f"{tag}: federation ({seconds['global']:.0f} s{', cached' if cached else ''})", flush=True)

    start = time.perf_counter()
    recorded = exp8_alone_record(results, prefix, partition, epsilon, seed) if alone_dp_source == "exp8" else None
    if recorded is not None and recorded["lr"] == alone_lr:
        models["alone-dp"] = None  # exp8's figures of the same run_alone at the same splits, seed, σ and lr
        alone_dp_figures = (recorded["per_silo_heldout"], recorded["per_silo_test"])
        seconds["alone-dp"] = float(recorded["seconds"])
    else:
        models["alone-dp"] = run_alone(x, y, splits, sigma, alone_lr, seed)
        alone_dp_figures = None
        seconds["alone-dp"] = time.perf_counter() - start
    print(f"{tag}: alone-dp ({seconds['alone-dp']:.0f} s{', from exp8' if recorded else ''})", flush=True)

    base = linear_base(global_model)
    start = time.perf_counter()
    models["alone-in-house"], chosen["alone-in-house"] = per_silo_choice(
        ADAM_GRID, val, lambda i, lr: train_alone(base, train[i], PersonalizeSettings(CLEAR, lr=lr),
                                                  generator=torch.Generator().manual_seed(seed * 1000 + i * 10 + 1)))
    seconds["alone-in-house"] = time.perf_counter() - start
    print(f"{tag}: alone-in-house ({seconds['alone-in-house']:.0f} s)", flush=True)

    start = time.perf_counter()
    def clear_fine_tuned(i: int, lr: float) -> FederatedMLP:
        model = fresh_copy(global_model)
        fine_tune_clear(model, train[i], PersonalizeSettings(CLEAR, lr=lr),
                        generator=torch.Generator().manual_seed(seed * 1000 + i * 10 + 2))
        return model

    models["personalized-clear"], chosen["personalized-clear"] = per_silo_choice(ADAM_GRID, val, clear_fine_tuned)
    seconds["personalized-clear"] = time.perf_counter() - start
    print(f"{tag}: personalized-clear ({seconds['personalized-clear']:.0f} s)", flush=True)

    start = time.perf_counter()
    dp_models, choices, totals = [], [], []
    for i in range(SILOS):
        accountant = SiloAccountant(i, "", sigma, Q, CLIP, DELTA, accounting.ADD_REMOVE, len(splits[i]["train"]),
                                    ROUNDS)
        candidates = []
        for lr in DP_FT_GRID:
            settings = PersonalizeSettings(DP, lr=lr, steps=FINE_TUNE_STEPS, momentum=FINE_TUNE_MOMENTUM)
            check_budget(accountant, settings.steps, None)
            model = fresh_copy(global_model)
            fine_tune_dp(model, train[i], accountant, settings,
                         generator=torch.Generator().manual_seed(seed * 1000 + i * 10 + 3),
                         rng=np.random.default_rng([seed, i, 4, int(lr * 1000)]))
            candidates.append((lr, model))
        lr, model, table = pick(candidates, val[i])
        after = accountant.after(FINE_TUNE_STEPS)
        dp_models.append(model)
        choices.append({"lr": lr, "table": table})
        totals.append(after.epsilons())
    models["personalized-dp"], chosen["personalized-dp"] = dp_models, choices
    seconds["personalized-dp"] = time.perf_counter() - start
    print(f"{tag}: personalized-dp ({seconds['personalized-dp']:.0f} s; silo epsilon "
          f"{totals[0][accounting.ADD_REMOVE]:.4g} add/remove after {ROUNDS} + {FINE_TUNE_STEPS} steps)", flush=True)

    start = time.perf_counter()
    mixed, choices = [], []
    grid = PersonalizeSettings(INTERPOLATE).grid()
    for i in range(SILOS):
        own = models["alone-in-house"][i]
        # cross-fitting (personalize.training): every training row scored by the in-house recipe (its chosen lr)
        # trained on the other folds, every validation row by the in-house model; held-out rows play no part
        rows = splits[i]["train"]
        fold = fold_assignment(len(rows), FOLDS, np.random.default_rng([seed, i, 5]))
        recipe = PersonalizeSettings(CLEAR, lr=chosen["alone-in-house"][i]["lr"])
        alone_logits = torch.cat([
            out_of_fold_logits(base, x[rows], y[rows], fold, recipe, width=train[i].width, packed=False,
                               generator=torch.Generator().manual_seed(seed * 1000 + i * 10 + 5)),
            logits(own, val[i])])
        global_logits = torch.cat([logits(global_model, train[i]), logits(global_model, val[i])])
        weight, table = choose_weight(global_logits, alone_logits, torch.cat([train[i].labels, val[i].labels]), grid)
        mixed.append(interpolate(global_model, own, weight))
        choices.append({"weight": weight, "chosen_on": f"{len(rows)} training rows ({FOLDS}-fold cross-fitted) and "
                                                        f"{len(val[i])} validation rows", "table": table})
    models["interpolated"], chosen["interpolated"] = mixed, choices
    seconds["interpolated"] = time.perf_counter() - start + seconds["alone-in-house"]

    # evaluation: each silo's own held-out rows, and the pooled test set
    own: dict[str, list[float]] = {}
    pooled: dict[str, list[float]] = {}
    mixed_own: dict[str, list[float]] = {}
    classes = int(y.max()) + 1
    mixes = [np.bincount(y[s["train"]], minlength=classes) / len(s["train"]) for s in splits]
    for setting in SETTINGS:
        if setting == "alone-dp" and alone_dp_figures is not None:
            own[setting], pooled[setting] = list(alone_dp_figures[0]), list(alone_dp_figures[1])
            continue
        per = [global_model] * SILOS if setting == "global" else models[setting]
        own[setting] = [loss_acc(m, held[i])[1] for i, m in enumerate(per)]
        mixed_own[setting] = [own_mix(test_class_accuracy(m, test, classes), mixes[i]) for i, m in enumerate(per)]
        pooled[setting] = ([loss_acc(global_model, test)[1]] if setting == "global"
                           else [loss_acc(m, test)[1] for m in per])
    best_alone = np.maximum(own["alone-dp"], own["alone-in-house"])
    best_alone_mix = (np.maximum(mixed_own["alone-dp"], mixed_own["alone-in-house"])
                      if "alone-dp" in mixed_own else None)
    held_sizes = [len(s["held"]) for s in splits]
    fed_eps = accounting.dp_sgd_epsilons(accounting.DpSgdEvent(sigma, Q, ROUNDS), DELTA)
    records = []
    for setting in SETTINGS:
        eps = totals[0] if setting == "personalized-dp" else None if setting in LOCAL_ONLY else fed_eps
        steps = ROUNDS + FINE_TUNE_STEPS if setting == "personalized-dp" else ROUNDS
        lr: float | list[float] | None = {"global": fed_lr, "alone-dp": alone_lr}.get(setting)
        if setting in chosen and setting != "interpolated":
            lr = [c["lr"] for c in chosen[setting]]
        common = {
            "dataset": dataset, "partition": partition, "setting": setting, "seed": seed,
            "epsilon_add_remove": None if eps is None else eps[accounting.ADD_REMOVE],
            "epsilon_replace_one": None if eps is None else eps[accounting.REPLACE_ONE], "delta": DELTA,
            "epsilon_add_remove_target": epsilon, "local_only": setting in LOCAL_ONLY,
            "privacy": ("local-only: trained on the silo's records in clear (epsilon = inf if shipped)"
                        if setting in LOCAL_ONLY else
                        f"DP-SGD, {steps} steps per silo record set ({ROUNDS} federation"
                        + (f" + {FINE_TUNE_STEPS} fine-tuning" if setting == "personalized-dp" else "") + ")"),
            "lr": lr, "noise_multiplier": None if setting in LOCAL_ONLY else sigma,
            "sampling_probability": None if setting in LOCAL_ONLY else Q,
            "clip": None if setting in LOCAL_ONLY else CLIP,
            "steps_per_silo": None if setting in LOCAL_ONLY else steps,
            "seconds": seconds[setting] + (seconds["global"] if setting.startswith(("personalized", "interp"))
                                           else 0.0),
            "silo_train_rows": [len(s["train"]) for s in splits]}
        if setting == "interpolated":
            common["interpolation_weight_of_global"] = [c["weight"] for c in chosen[setting]]
            common["interpolation_weight_chosen_by"] = CHOICE
        if setting in chosen:
            common["chosen_on_validation"] = chosen[setting]
        if setting == "alone-dp" and alone_dp_figures is not None:
            common["source"] = "exp8_shared_features run_alone, same splits, seed, sigma and lr (its recorded figures)"
        gaps = np.asarray(own[setting]) - best_alone
        records.append({**common, "evaluated_on": "own-heldout", "accuracy": float(np.mean(own[setting])),
                        "accuracy_of": "the mean over the 10 silos (each on its own held-out rows, unweighted)",
                        "heldout_accuracy": float(np.average(own[setting], weights=held_sizes)),
                        "per_silo_heldout": own[setting], "best_alone_mean": float(np.mean(best_alone)),
                        "gap_to_best_alone": float(np.mean(own[setting]) - np.mean(best_alone)),
                        "worst_silo_gap_to_best_alone": float(gaps.min()), "worst_silo": int(gaps.argmin()),
                        "silo_heldout_rows": held_sizes})
        if best_alone_mix is not None:
            mix_gaps = np.asarray(mixed_own[setting]) - best_alone_mix
            records.append({**common, "evaluated_on": "own-mix-test", "accuracy": float(np.mean(mixed_own[setting])),
                            "accuracy_of": ("the mean over the 10 silos of sum_c pi_ic acc_c: the model's accuracy "
                                            "on each official test class weighted by the silo's training label mix"),
                            "per_silo_own_mix": mixed_own[setting], "best_alone_mean": float(np.mean(best_alone_mix)),
                            "gap_to_best_alone": float(np.mean(mixed_own[setting]) - np.mean(best_alone_mix)),
                            "worst_silo_gap_to_best_alone": float(mix_gaps.min()),
                            "worst_silo": int(mix_gaps.argmin())})
        records.append({**common, "evaluated_on": "pooled-test", "accuracy": float(np.mean(pooled[setting])),
                        "accuracy_of": ("the one model" if setting == "global"
                                        else "the mean over the 10 silos' own models"),
                        "per_silo_test": None if setting == "global" else pooled[setting]})
    for r in records:
        if r["evaluated_on"] == "own-heldout":
            print(f"{tag}: {r['setting']:<19} own {r['accuracy']:.4f} (worst gap "
                  f"{r['worst_silo_gap_to_best_alone']:+.4f})", flush=True)
    return records


def find(records: list[dict], key: tuple, setting: str, on: str) -> list[dict]:
    """The records of one (dataset, split, ε) and setting, one per seed (sorted by seed)."""
    return sorted((r for r in records if (r["dataset"], r["partition"], r["epsilon_add_remove_target"]) == key
                   and (r["setting"], r["evaluated_on"]) == (setting, on)), key=lambda r: r["seed"])


def mean_of(found: list[dict], field: str) -> float:
    return float(np.mean([r[field] for r in found]))


def spread(found: list[dict], field: str = "accuracy") -> str:
    """A mean over seeds in %, with its standard error where there is more than one seed."""
    values = 100 * np.asarray([r[field] for r in found])
    if len(values) < 2:
        return f"{values[0]:.1f}"
    return f"{values.mean():.1f} ± {values.std(ddof=1) / np.sqrt(len(values)):.1f}"


def cell(found: list[dict], on: str) -> str:
    """Own held-out: the mean over seeds and, in brackets, the worst silo's gap over every seed."""
    if not found:
        return "–"
    text = spread(found)
    if on == "own-heldout" and found[0]["setting"] not in ("alone-dp", "alone-in-house"):
        text += f" ({100 * min(r['worst_silo_gap_to_best_alone'] for r in found):+.1f})"
    return text


PERSONALIZED = ("personalized-clear", "personalized-dp", "interpolated")


def targets(records: list[dict], key: tuple) -> str:
    """Issue 41's Done-when on one split: the best personalization (by its mean over seeds) against the best alone
    (and global) model; the worst silo is the worst over every seed, with that silo's held-out rows."""
    own = {s: find(records, key, s, "own-heldout") for s in SETTINGS}
    pooled = {s: find(records, key, s, "pooled-test") for s in SETTINGS}
    if not all((*own.values(), *pooled.values())):
        return ""
    best = max(PERSONALIZED, key=lambda s: mean_of(own[s], "accuracy"))
    gap = 100 * mean_of(own[best], "gap_to_best_alone")
    worst_record = min(own[best], key=lambda r: r["worst_silo_gap_to_best_alone"])
    worst = 100 * worst_record["worst_silo_gap_to_best_alone"]
    rows = worst_record["silo_heldout_rows"][worst_record["worst_silo"]]
    seeds = {r["seed"] for r in own[best]}
    versus_global = 100 * (mean_of(own[best], "accuracy")
                           - mean_of([r for r in own["global"] if r["seed"] in seeds], "accuracy"))
    alone = max(mean_of(pooled["alone-dp"], "accuracy"), mean_of(pooled["alone-in-house"], "accuracy"))
    dp_gain = 100 * (mean_of(pooled["personalized-dp"], "accuracy") - alone)
    ok = "met" if gap >= -0.5 and worst >= -2 else "missed"
    mix = find(records, key, best, "own-mix-test")
    on_mix = (f"{100 * mean_of(mix, 'gap_to_best_alone'):+.1f} / "
              f"{100 * min(r['worst_silo_gap_to_best_alone'] for r in mix):+.1f} ({len(mix)})" if mix else "–")
    return (f"| {key[0]} | {key[1]} | {key[2]:g} | {len(own[best])} | {best} | {spread(own[best])} | "
            f"{100 * mean_of(own[best], 'best_alone_mean'):.1f} | {gap:+.1f} | {worst:+.1f} "
            f"(silo {worst_record['worst_silo']}, seed {worst_record['seed']}: {rows} rows, one = "
            f"{100 / rows:.1f} pp) | {versus_global:+.1f} | {dp_gain:+.1f} | {ok} | {on_mix} |")


def own_table(records: list[dict], keys: list[tuple], on: str) -> list[str]:
    """The rows of an own-record table (``own-heldout`` or ``own-mix-test``): each setting, then the best alone."""
    names = " | ".join(SETTINGS)
    lines = [f"| dataset | split | ε | seeds | {names} | best alone |",
             "|---|---|---:|---:|" + "---:|" * (len(SETTINGS) + 1)]
    for key in keys:
        anchor = find(records, key, "global", on)
        best = "–" if not anchor else f"{100 * mean_of(anchor, 'best_alone_mean'):.1f}"
        lines.append(f"| {key[0]} | {key[1]} | {key[2]:g} | {len(anchor)} | "
                     + " | ".join(cell(find(records, key, s, on), "own-heldout") for s in SETTINGS) + f" | {best} |")
    return lines


def current(records: list[dict]) -> list[dict]:
    """The records with each run's interpolation as this script makes it now (``CHOICE``): earlier runs chose w on
    the validation rows alone, or without the one-SE rule; their rows become ``interpolated-earlier`` (not shown)."""
    return [r | {"setting": "interpolated-earlier"}
            if r["setting"] == "interpolated" and r.get("interpolation_weight_chosen_by") != CHOICE else r
            for r in records]


def markdown(records: list[dict]) -> str:
    records = current(records)
    order = {p: j for j, p in enumerate(("iid", "dirichlet-0.5", "dirichlet-0.1", "shards-1"))}
    rows = sorted({(r["dataset"], r["partition"], r["epsilon_add_remove_target"]) for r in records},
                  key=lambda k: (k[0] != "fashion-mnist", k[0], order.get(k[1], 9), k[1], k[2]))
    names = " | ".join(SETTINGS)
    out = ["Own held-out accuracy (%), the mean over the 10 silos (unweighted), then over the seeds (± its standard "
           "error over seeds); in brackets the worst silo's gap (pp) to its best alone model, the worst over every "
           "seed (per silo the better of alone-dp and alone-in-house; `best alone` is the mean of those):", "",
           *own_table(records, rows, "own-heldout")]
    out += ["", "Pooled official test set (%) (the mean over the silos' own models; global: the one model; then over "
            "the seeds):", "",
            f"| dataset | split | ε | seeds | {names} |", "|---|---|---:|---:|" + "---:|" * len(SETTINGS)]
    for key in rows:
        out.append(f"| {key[0]} | {key[1]} | {key[2]:g} | {len(find(records, key, 'global', 'pooled-test'))} | "
                   + " | ".join(cell(find(records, key, s, "pooled-test"), "pooled-test") for s in SETTINGS) + " |")
    mixed = [key for key in rows if find(records, key, "global", "own-mix-test")]
    if mixed:
        out += ["", "Each silo's own label mix on the official test set (%): Σ_c π_ic·acc_c, the model's accuracy on "
                "each test class weighted by the silo's training label mix (the partitions split by label only, so "
                "this estimates the silo's own-record accuracy over every official test record of its classes "
                "instead of its 5-1,072 held-out records); the mean over the silos, then over the seeds, in brackets "
                "the worst silo's gap to its best alone model over every seed (runs that recorded it):", "",
                *own_table(records, mixed, "own-mix-test")]
    out += ["", "Issue 41's Done-when (the best personalization by its own held-out mean over seeds; its mean minus "
            "the best-alone mean, target ≥ −0.5 pp; its worst silo over every seed, target ≥ −2 pp, with that silo's "
            "held-out rows; minus the global model, target ≥ −0.3 pp on IID; personalized-dp's pooled-test accuracy "
            "minus the better alone model's, target ≥ +20 pp on skewed splits):", "",
            "| dataset | split | ε | seeds | best personalization | own held-out | best alone | gap | worst silo | "
            "vs global | DP-personalized pooled − alone | own-record targets | on the own label mix: gap / worst "
            "silo (seeds) |",
            "|---|---|---:|---:|---|---:|---:|---:|---|---:|---:|---|---|"]
    out += [line for line in (targets(records, key) for key in rows) if line]
    dp = sorted({(r["epsilon_add_remove_target"], round(r["epsilon_add_remove"], 3), round(r["epsilon_replace_one"], 3))
                 for r in records if r["setting"] == "personalized-dp" and r["evaluated_on"] == "own-heldout"})
    if dp:
        totals = "; ".join(f"ε {t:g} → {a:.3g} add/remove ({b:.3g} replace-one)" for t, a, b in dp)
        out += ["", f"personalized-dp: the silo's total over {ROUNDS} federation + {FINE_TUNE_STEPS} fine-tuning "
                f"DP-SGD steps, δ 1e-5: {totals}. Local-only (ε = ∞ if shipped): alone-in-house, personalized-clear, "
                "interpolated."]
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=("fashion-mnist", "mnist5k"), default="fashion-mnist")
    parser.add_argument("--partitions", nargs="+", default=["iid", "dirichlet-0.1", "shards-1"])
    parser.add_argument("--epsilon", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--alone-dp", choices=("rerun", "exp8"), default="rerun",
                        help="rerun exp8's run_alone, or take its recorded figures at the same splits/seed/eps/lr")
    parser.add_argument("--results", type=Path, default=Path("docs/results"), help="where exp8's records are")
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument("--report", action="store_true", help="only rewrite the markdown tables from the JSON")
    args = parser.parse_args()
    path = args.out / "exp11_personalization.json"
    if args.report:
        (args.out / "exp11_personalization.md").write_text(markdown(json.loads(path.read_text())))
        return
    torch.set_num_threads(1)
    cache = Path(f"runs/exp8_cache/{'fmnist' if args.dataset == 'fashion-mnist' else args.dataset}_scatter")
    x, y = features(cache, args.dataset)
    pool, test_rows = pools(args.dataset, y)
    prefix = "exp8_shared_features" if args.dataset == "fashion-mnist" else f"exp8_shared_features_{args.dataset}"
    for partition in args.partitions:
        new = run_split(x, y, args.dataset, partition, pool, test_rows, args.epsilon, args.seed, args.results,
                        prefix, args.alone_dp)
        key = (args.dataset, partition, args.epsilon, args.seed)
        records: list[dict] = json.loads(path.read_text()) if path.exists() else []  # read late: runs side by side
        records = [r for r in records
                   if (r["dataset"], r["partition"], r["epsilon_add_remove_target"], r["seed"]) != key] + new
        args.out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(records, indent=1))
        (args.out / "exp11_personalization.md").write_text(markdown(records))


if __name__ == "__main__":
    main()
