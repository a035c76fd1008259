"""End to end on shared features: a ScatterNet export of 10 Fashion-MNIST silos + a 300-round DP-SGD federation.

Issue 34's target: the whole path (``ldpfl export --extractor scatter --local-only`` of 10 silos, then
``ldpfl federate --dp-sgd`` for 300 rounds, one local step each) in at most 10 minutes on 2 cores. Baseline,
measured in the same process: the pooled central DP-SGD run (the same 300 steps at the same Poisson rate over
all the silos' training rows together, read from the same files), which needs no federation at all.

    .venv/bin/python bench/shared_features_e2e.py --out runs/bench-e2e

Prints each phase's seconds, the federated model's accuracy as the run reports it (the silos' evaluation replies,
noised under DP-SGD; evaluated every ``--eval-every`` rounds, as the README recommends) and as this script
measures it in clear on the same held-out records, the central model's, and the total against the 600 s target.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import time
from pathlib import Path

import numpy as np
import torch

import ldpfl
from ldpfl.stage2_federate.data import ClientSplit, load_run
from ldpfl.stage2_federate.model import build_model, evaluate
from ldpfl.stage2_federate.model_file import read_model
from ldpfl.stage2_federate.silo_training.dp_sgd import train_dp_sgd
from ldpfl.stage2_federate.silo_training.dp_sgd_budget import plan_client

TARGET_SECONDS = 600.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/bench-e2e"))
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--epsilon", type=float, default=3.0, help="per-silo target, add-remove, delta 1e-5")
    parser.add_argument("--lr", type=float, default=4.0)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--clients-parallel", type=int, default=2)
    args = parser.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)

    start = time.perf_counter()
    ldpfl.export(dataset="fashion-mnist", clients=10, extractor="scatter", mechanism="none", local_only=True,
                 clients_parallel=args.clients_parallel, seed=args.seed, out=args.out)
    exported = time.perf_counter()
    result = ldpfl.federate(args.out, rounds=args.rounds, hidden=(), dp_sgd=True, target_epsilon=args.epsilon,
                            neighbours="add-remove", server_momentum=0.9, lr=args.lr, seed=args.seed,
                            eval_every=args.eval_every)
    federated = time.perf_counter()
    metrics = json.loads(Path(result.outputs.metrics_json).read_text())
    guarantee = metrics["release_guarantee"]

    # baseline: the pooled central run over the same training rows, the same q, steps, clip and epsilon
    data = load_run(args.out, torch.device("cpu"))
    features = torch.cat([c.train.features for c in data.clients])
    labels = torch.cat([c.train.labels for c in data.clients])
    pooled = ClientSplit(features, labels, data.input_width, False)
    per_silo = metrics["privacy"][0]["dp_sgd"]
    dp = plan_client(0, len(pooled), clip=per_silo["clip"], delta=per_silo["delta"], neighbours="add-remove",
                     rounds=args.rounds, local_steps=1, sample_rate=per_silo["sampling_probability"],
                     batch_size=0, noise_multiplier=None, target_epsilon=args.epsilon)
    dp = dataclasses.replace(dp, local_steps=args.rounds)  # one silo of all the rows, every step in one go
    generator = torch.Generator().manual_seed(args.seed)
    model = build_model(data.input_width, (), 10, generator=generator)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    train_dp_sgd(model, pooled, dp, optimizer=optimizer, generator=generator, rng=np.random.default_rng(args.seed))
    central_accuracy = evaluate(model, [c.test for c in data.clients])[1]
    central = time.perf_counter()
    federated_model = build_model(data.input_width, (), 10, generator=torch.Generator().manual_seed(0))
    federated_model.load_state_dict(read_model(result.outputs.model).state_dict)
    federated_clear = evaluate(federated_model, [c.test for c in data.clients])[1]  # the bench's check, in clear

    total = federated - start
    print(f"export (scatter, 10 silos, local-only)   {exported - start:8.1f} s")
    print(f"federate (DP-SGD, {args.rounds} rounds)          {federated - exported:8.1f} s   accuracy "
          f"{result.final_accuracy:.4f}  (eps {guarantee['epsilon']:.3g} replace-one, "
          f"{guarantee['epsilon_add_remove']:.3g} add-remove, delta {guarantee['delta']:g}; noised replies, "
          f"every {args.eval_every} rounds)")
    print(f"  the same model measured here in clear                accuracy {federated_clear:.4f}")
    print(f"end to end                                {total:8.1f} s   target <= {TARGET_SECONDS:.0f} s: "
          f"{'met' if total <= TARGET_SECONDS else 'NOT met'}")
    print(f"baseline: central pooled DP-SGD           {central - federated:8.1f} s   accuracy {central_accuracy:.4f} "
          f"(same steps, q, clip, eps per record)")


if __name__ == "__main__":
    main()
