"""DP-SGD training throughput of the client CNN (issue 22 item 6) next to non-DP training, in one run.

Run from the repository root (needs Fashion-MNIST's IDX files in /usr/share/datasets/fashion-mnist or data/):

    .venv/bin/python bench/dp_cnn_training.py [--steps 150] [--variants tf-fig4,jax-dp-cnn,dp-dp-cnn-64,...]

Every measurement runs in its own process with one thread, pinned to one CPU (as bench/cnn_training.py):

* ``tf-fig4``: the export's default, ``cnn.train_model`` of the paper's Fig. 4 net (``cifar-cnn``) on
  TensorFlow (RMSprop, the IV-C schedule, augmentation, batch 64): the baseline of the goal;
* ``jax-<net>``: ``cnn.train_model`` of ``<net>`` on Keras' JAX backend, without DP and augmentation;
* ``dp-<net>-<b>[-mb<m>]``: ``dp_training.train_model_dp`` (jax-privacy, Poisson sampling with expected
  batch b, σ calibrated for ε = 4, δ = 1e-5; ``mb`` is jax-privacy's microbatch size) of ``<net>``.

One epoch of ``--steps`` batches of Fashion-MNIST images; the first two batches (tracing, compilation) are not timed
(DP-SGD's Poisson batches are padded to a multiple of 32, so a new padded size compiles once more during the
timed part: counted). Figures: samples/s of wall time (DP: expected batch b × timed steps), of process CPU
time (robust to other load on the shared machine), ``steady``: b / the median step time (without the
recompilations), and memory: the process's peak RSS, and its growth over
the RSS measured after the dataset and model were loaded (bounded by the batch, not the dataset: the
images are the only dataset-sized buffer, and the ``--memory-check`` row trains on twice as many).

The last line is ``dp_samples_per_s=<best DP variant> tf_samples_per_s=<tf-fig4> ratio=<dp / tf>``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_VARIANTS = "tf-fig4,jax-dp-cnn,dp-dp-cnn-64,dp-dp-cnn-128,dp-dp-cnn-256,dp-dp-cnn-256-mb64,dp-cifar-cnn-gn-64"


def parse_variant(name: str) -> tuple[str, str, int, int | None]:
    """Return (kind, net, batch, microbatch) of a variant name."""
    if name == "tf-fig4":
        return "tf", "cifar-cnn", 64, None
    if name.startswith("jax-"):
        return "jax", name[4:], 64, None
    if name.startswith("dp-"):
        parts = name[3:].split("-")
        micro = None
        if parts[-1].startswith("mb"):
            micro = int(parts.pop()[2:])
        batch = int(parts.pop())
        return "dp", "-".join(parts), batch, micro
    raise SystemExit(f"Error: unknown variant {name!r}")


def _rss_mib() -> float:
    return psutil.Process().memory_info().rss / 2**20


def child_train(variant: str, samples: int) -> dict:
    """One epoch of ``variant`` on ``samples`` images, in this (one-thread, pinned) process."""
    import numpy as np

    from ldpfl.stage1_features.datasets.loaders import load_dataset
    from ldpfl.stage1_features.models import cnn, dp_training

    kind, net, batch, micro = parse_variant(variant)
    keras = cnn.import_keras(1)
    dataset = load_dataset("fashion-mnist")
    rng = np.random.default_rng(0)
    rows = rng.choice(len(dataset), size=samples, replace=samples > len(dataset))
    x, y = dataset.features(rows).astype(np.float32).reshape(-1, 28, 28, 1), dataset.y[rows]
    del dataset
    keras.utils.set_random_seed(1)
    model = cnn.build_model(net, (28, 28, 1), 10)
    rss_loaded = _rss_mib()
    clock: dict[str, float] = {}

    steps: list[float] = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, index: int, logs: dict | None = None) -> None:
            now, cpu = time.perf_counter(), time.process_time()
            if index >= 2:
                steps.append(now - clock["stop"])
            if index == 1:  # batches 0 and 1 trace and compile: not timed
                clock.update(start=now, cpu_start=cpu, first=index)
            clock.update(stop=now, cpu_stop=cpu, last=index)

    config = cnn.TrainingConfig(epochs=1, batch_size=batch, augment=kind == "tf")
    record: dict = {}
    if kind == "dp":
        result, record = dp_training.train_model_dp(model, x, y, config, dp_training.DPBudget(4.0, 1e-5), rng=rng,
                                                    extractor=net, callbacks=[Clock()], microbatch_size=micro)
    else:
        result = cnn.train_model(model, x, y, config, rng=rng, callbacks=[Clock()])
    timed = (clock["last"] - clock["first"]) * batch
    return {"variant": variant, "backend": keras.backend.backend(), "net": net, "batch": batch, "microbatch": micro,
            "samples": samples, "samples_per_s": timed / (clock["stop"] - clock["start"]),
            "samples_per_cpu_s": timed / (clock["cpu_stop"] - clock["cpu_start"]),
            "steady_samples_per_s": batch / float(np.median(steps)), "timed_steps": len(steps),
            "rss_loaded_mib": rss_loaded, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "final_loss": result.history["loss"][-1], "noise_multiplier": record.get("noise_multiplier"),
            "epsilon": record.get("epsilon")}


def _run_child(variant: str, samples: int, cpu: int | None) -> dict:
    kind = parse_variant(variant)[0]
    env = dict(os.environ, KERAS_BACKEND="tensorflow" if kind == "tf" else "jax", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=str(ROOT))
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[variable] = "1"

    def pin() -> None:
        if cpu is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {cpu})

    done = subprocess.run([sys.executable, __file__, "--child", variant, str(samples)], env=env, capture_output=True,
                          text=True, preexec_fn=pin)
    if done.returncode != 0:
        raise SystemExit(f"variant {variant} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150, help="optimizer steps per measurement (one epoch of "
                        "steps × batch samples)")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS, help="comma-separated (module docstring)")
    parser.add_argument("--memory-check", default="dp-dp-cnn-128",
                        help="variant run again on twice the samples (peak RSS growth); '' to skip")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child_train(args.child[0], int(args.child[1]))))
        return
    variants = [v for v in args.variants.split(",") if v]
    for variant in variants:
        parse_variant(variant)
    cpu = min(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    rows = []
    runs = [(v, args.steps * parse_variant(v)[2]) for v in variants]
    if args.memory_check:
        runs.append((args.memory_check, 2 * args.steps * parse_variant(args.memory_check)[2]))
    for variant, samples in runs:
        r = _run_child(variant, samples, cpu)
        rows.append(r)
        growth = r["peak_rss_mib"] - r["rss_loaded_mib"]
        sigma = f"  σ={r['noise_multiplier']:.3f}" if r["noise_multiplier"] else ""
        print(f"{variant:22s} n={samples:6d} {r['timed_steps']:4d} steps {r['samples_per_s']:7.1f} samples/s "
              f"({r['samples_per_cpu_s']:7.1f} per CPU-s, steady {r['steady_samples_per_s']:7.1f})  peak RSS "
              f"{r['peak_rss_mib']:6.0f} MiB (+{growth:5.0f} over loaded)  loss {r['final_loss']:.3f}{sigma}",
              flush=True)
    tf = next((r["samples_per_s"] for r in rows if r["variant"] == "tf-fig4"), float("nan"))
    dp = max((r["samples_per_s"] for r in rows if r["variant"].startswith("dp-")), default=float("nan"))
    print(json.dumps({"runs": rows}))
    print(f"dp_samples_per_s={dp:.1f} tf_samples_per_s={tf:.1f} ratio={dp / tf:.3f}")


if __name__ == "__main__":
    main()
