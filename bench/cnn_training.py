"""Client CNN training throughput (LDPFL stage 1, IV-C) against the machine's convolution and GEMM rates.

Run from the repository root (needs Fashion-MNIST's IDX files in /usr/share/datasets/fashion-mnist or data/):

    .venv/bin/python bench/cnn_training.py [--samples 3200] [--repeats 2] [--variants tf,torch,...]

Every measurement runs in its own process with one thread, pinned to one CPU, so the variants are
compared on equal terms and in the same run:

* ``peak``: the rates the CNN could reach on this core: a float32 GEMM (1,024³, ``tf.linalg.matmul``) and
  the forward + backward convolution of Fig. 4's widest layer (batch 64, 14×14×64 → 64, 3×3, same), both
  in TensorFlow, the backend the CNN uses by default.
* one process per variant: ``cnn.train_model`` (the export's own training function: RMSprop, the IV-C
  schedule, augmentation) on ``--samples`` Fashion-MNIST images for one epoch; the first two batches
  (tracing, compilation) are not timed. Figures: samples/s of wall time and of process CPU time (the
  latter is robust to other load on the machine), and the FLOP rate = training FLOPs per sample × samples/s.
* ``parallel``: the export's two ways of using both cores for the default variant: one process with two
  threads, against two single-thread processes pinned to one core each (``--clients-parallel 2``), run at
  the same time. Figure: samples/s of the whole machine.

Training FLOPs per sample are counted from the model: 2·k²·C_in·C_out per output pixel for each Conv2D and
2·in·out for each Dense, forward; training ≈ 3 × forward (forward, gradient of the input, gradient of the
weights). Pooling, BatchNormalization, activations and augmentation are not counted, so the FLOP rate is a
lower bound of the work done.

The last line is ``cnn_samples_per_s=<tf, one core> two_threads_samples_per_s=<x> two_processes_samples_per_s=<y>``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# name -> (Keras backend, XLA, augmentation, batch size). ``tf`` is the export's default (TrainingConfig()).
# Keras refuses XLA for a model with the augmentation layers ("Model doesn't support jit_compile=True"), so
# XLA on TensorFlow is measured without augmentation, against tf-noaug; jax always compiles with XLA.
VARIANTS = {
    "tf": ("tensorflow", False, True, 64),
    "torch": ("torch", False, True, 64),
    "jax": ("jax", True, True, 64),
    "tf-noaug": ("tensorflow", False, False, 64),
    "tf-xla-noaug": ("tensorflow", True, False, 64),
    "tf-batch128": ("tensorflow", False, True, 128),
}
EXTRACTORS = ("cifar-cnn", "mnist-cnn")


def _one_thread_env(backend: str, threads: int = 1) -> dict[str, str]:
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[variable] = str(threads)
    return env


def _child(args: list[str], backend: str, cpus: set[int] | None, threads: int = 1) -> subprocess.Popen:
    def pin() -> None:
        if cpus is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cpus)

    return subprocess.Popen([sys.executable, __file__, *args], env=_one_thread_env(backend, threads),
                            stdout=subprocess.PIPE, text=True, preexec_fn=pin)


def _result(proc: subprocess.Popen) -> dict:
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"benchmark child failed with exit code {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1])


def training_flops(model) -> float:
    """3 × the forward FLOPs of the model's Conv2D and Dense layers, per sample."""
    import numpy as np

    forward = 0.0
    for layer in model._flatten_layers(include_self=False, recursive=True):
        kind = type(layer).__name__
        if kind == "Conv2D":
            k = int(np.prod(layer.kernel_size))
            forward += 2.0 * k * layer.input.shape[-1] * layer.filters * np.prod(layer.output.shape[1:3])
        elif kind == "Dense":
            forward += 2.0 * layer.input.shape[-1] * layer.units
    return 3.0 * forward


def child_peak(threads: int) -> dict:
    """GEMM and convolution rates (FLOP/s) of TensorFlow on this process's cores."""
    from ldpfl.stage1_features.models import cnn

    cnn.import_keras(threads)
    import tensorflow as tf

    def rate(step, flops: float) -> float:
        step()  # warm-up and tracing
        best = 0.0
        for _ in range(5):
            start = time.perf_counter()
            step()
            best = max(best, flops / (time.perf_counter() - start))
        return best

    a, b = tf.random.normal((1024, 1024)), tf.random.normal((1024, 1024))
    gemm = tf.function(lambda: tf.reduce_sum(tf.linalg.matmul(a, b)))
    x, w = tf.Variable(tf.random.normal((64, 14, 14, 64))), tf.Variable(tf.random.normal((3, 3, 64, 64)))

    @tf.function
    def conv_step():
        with tf.GradientTape() as tape:
            y = tf.nn.conv2d(x, w, 1, "SAME")
            loss = tf.reduce_sum(y * y)
        return tape.gradient(loss, [x, w])

    conv_flops = 3 * 2.0 * 9 * 64 * 64 * 14 * 14 * 64  # forward + input gradient + weight gradient
    return {"gemm_flop_per_s": rate(lambda: gemm().numpy(), 2.0 * 1024**3),
            "conv_flop_per_s": rate(lambda: [g.numpy() for g in conv_step()], conv_flops)}


def child_train(variant: str, extractor: str, samples: int, threads: int) -> dict:
    """One epoch of ``cnn.train_model`` for ``variant``; wall and CPU samples/s from the third batch on."""
    import numpy as np

    from ldpfl.stage1_features.datasets.loaders import load_dataset
    from ldpfl.stage1_features.models import cnn

    backend, xla, augment, batch = VARIANTS[variant]
    keras = cnn.import_keras(threads)
    dataset = load_dataset("fashion-mnist")
    rng = np.random.default_rng(0)
    rows = rng.permutation(len(dataset))[:samples]
    x, y = dataset.features(rows).astype(np.float32), dataset.y[rows]
    keras.utils.set_random_seed(1)
    model = cnn.build_model(extractor, (28, 28, 1), 10)
    clock: dict[str, float] = {}

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, index: int, logs: dict | None = None) -> None:
            now, cpu = time.perf_counter(), time.process_time()
            if index == 1:  # batches 0 and 1 trace and compile: not timed
                clock.update(start=now, cpu_start=cpu, first=index)
            clock.update(stop=now, cpu_stop=cpu, last=index)

    config = cnn.TrainingConfig(epochs=1, batch_size=batch, augment=augment, xla=xla)
    result = cnn.train_model(model, x, y, config, rng=rng, callbacks=[Clock()])
    timed = (clock["last"] - clock["first"]) * batch
    flops = training_flops(model)
    wall = timed / (clock["stop"] - clock["start"])
    return {"variant": variant, "extractor": extractor, "backend": backend, "threads": threads,
            "samples_per_s": wall, "samples_per_cpu_s": timed / (clock["cpu_stop"] - clock["cpu_start"]),
            "train_flop_per_sample": flops, "flop_per_s": flops * wall,
            "final_loss": result.history["loss"][-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3200, help="training samples per measurement")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each variant (interleaved)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, from " + ", ".join(VARIANTS))
    parser.add_argument("--extractors", default="cifar-cnn,mnist-cnn")
    parser.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        kind, *rest = args.child
        out = child_peak(int(rest[0])) if kind == "peak" else child_train(rest[0], rest[1], int(rest[2]), int(rest[3]))
        print(json.dumps(out))
        return

    cpu = min(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    one = {cpu} if cpu is not None else None
    default = "tf"  # TrainingConfig()'s settings on the default backend
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"Error: unknown --variants {', '.join(unknown)}; valid: {', '.join(VARIANTS)}")
    peak = _result(_child(["--child", "peak", "1"], "tensorflow", one))
    print(f"one core: GEMM {peak['gemm_flop_per_s'] / 1e9:.1f} GFLOP/s, "
          f"conv fwd+bwd {peak['conv_flop_per_s'] / 1e9:.1f} GFLOP/s", flush=True)
    rows: list[dict] = []
    for extractor in args.extractors.split(","):
        for _ in range(args.repeats):
            for variant in variants:
                r = _result(_child(["--child", "train", variant, extractor, str(args.samples), "1"],
                                   VARIANTS[variant][0], one))
                r["of_conv_peak"] = r["flop_per_s"] / peak["conv_flop_per_s"]
                rows.append(r)
                print(f"{extractor:10s} {variant:16s} {r['samples_per_s']:7.1f} samples/s "
                      f"({r['samples_per_cpu_s']:7.1f} per CPU-s)  {r['flop_per_s'] / 1e9:5.1f} GFLOP/s "
                      f"= {r['of_conv_peak']:.0%} of conv, {r['flop_per_s'] / peak['gemm_flop_per_s']:.0%} of GEMM",
                      flush=True)
    # Both cores: one process with two threads against two one-thread processes at once.
    both = sorted(os.sched_getaffinity(0))[:2] if hasattr(os, "sched_getaffinity") else [None, None]
    backend = VARIANTS[default][0]
    two_threads = _result(_child(["--child", "train", default, "cifar-cnn", str(args.samples), "2"], backend,
                                 set(both), threads=2))["samples_per_s"]
    pair = [_child(["--child", "train", default, "cifar-cnn", str(args.samples), "1"], backend, {c} if c is not None
                   else None) for c in both]
    two_procs = sum(_result(p)["samples_per_s"] for p in pair)
    print(f"both cores, cifar-cnn {default}: one process × 2 threads {two_threads:.1f} samples/s; "
          f"two processes × 1 thread {two_procs:.1f} samples/s")

    def median(variant: str) -> float:
        values = sorted(r["samples_per_s"] for r in rows if r["variant"] == variant and r["extractor"] == "cifar-cnn")
        return values[len(values) // 2] if values else float("nan")

    print(json.dumps({"peak": peak, "runs": rows, "two_threads": two_threads, "two_processes": two_procs}))
    print(f"cnn_samples_per_s={median(default):.1f} two_threads_samples_per_s={two_threads:.1f} "
          f"two_processes_samples_per_s={two_procs:.1f}")


if __name__ == "__main__":
    main()
