"""Local-training throughput of the stage-2 default model against this machine's fp32 GEMM rate.

The model is LDPFL's FMNIST stage-2 DNN (IV-E): input r·l = 11,520 bits → 2,048 (ReLU, dropout 0.1)
→ 10 classes, batch 64, inputs stored as packed bits and unpacked per batch in torch, trained with the
same ``train_local`` the federation uses. Work per sample is counted as 6 × parameters FLOPs (forward
2P, backward 4P); the first layer's input gradient is not needed, so the work actually done is closer
to 4P, and both fractions are printed. The GEMM rate is measured in the same run, on a square fp32
matmul and on the layer's own shapes, before and after the training. The machine is a shared VM whose speed
drifts, so each figure is the best of several short trials (medians are printed too).

Usage::

    .venv/bin/python bench/federate_throughput.py [--threads N] [--samples 2560] [--optimizer adam|sgd] [--raw-env]
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import statistics
import sys
import time

from ldpfl.stage2_federate.runtime import RUNTIME_DEFAULTS, apply_runtime_defaults

# As `ldpfl federate` does, before torch loads (stage2_federate/runtime.py); `--raw-env` measures without.
if "--raw-env" not in sys.argv:
    apply_runtime_defaults()

import numpy as np  # noqa: E402
import torch  # noqa: E402

from ldpfl.stage2_federate.data import ClientSplit  # noqa: E402
from ldpfl.stage2_federate.model import build_model, make_optimizer, parameter_count, train_local  # noqa: E402


def gemm_rates(m: int, k: int, n: int, *, trials: int = 5, seconds: float = 0.6) -> list[float]:
    """fp32 GFLOP/s of (m×k)·(k×n) products, one figure per trial of about ``seconds``."""
    g = torch.Generator().manual_seed(0)
    a = torch.rand(m, k, generator=g)
    b = torch.rand(k, n, generator=g)
    out = torch.empty(m, n)
    for _ in range(3):
        torch.mm(a, b, out=out)
    rates = []
    for _ in range(trials):
        reps = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            torch.mm(a, b, out=out)
            reps += 1
        rates.append(2.0 * m * k * n * reps / (time.perf_counter() - start) / 1e9)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--samples", type=int, default=2560, help="training samples per timed epoch")
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs, one trial each (after a warm-up epoch)")
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    parser.add_argument("--input", type=int, default=11520)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--raw-env", action="store_true",
                        help=f"do not apply the CLI's runtime defaults ({', '.join(RUNTIME_DEFAULTS)})")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    square = gemm_rates(2048, 2048, 2048)
    layer = gemm_rates(64, args.input, args.hidden)

    generator = torch.Generator().manual_seed(1)
    model = build_model(args.input, (args.hidden,), 10, generator=generator)
    params = parameter_count(model)
    rng = np.random.default_rng(2)
    packed = torch.from_numpy(rng.integers(0, 256, size=(args.samples, math.ceil(args.input / 8)), dtype=np.uint8))
    labels = torch.from_numpy(rng.integers(0, 10, size=args.samples, dtype=np.int64))
    split = ClientSplit(packed, labels, args.input, packed=True)
    optimizer = make_optimizer(args.optimizer, model.parameters(), 1e-3)
    train_local(model, split, epochs=1, batch_size=64, optimizer=optimizer, generator=generator)  # warm-up
    rates = []
    for _ in range(args.epochs):  # one timed epoch per trial
        start = time.perf_counter()
        train_local(model, split, epochs=1, batch_size=64, optimizer=optimizer, generator=generator)
        rates.append(args.samples / (time.perf_counter() - start))
    square += gemm_rates(2048, 2048, 2048)  # again after training: the VM is shared, its speed drifts
    layer += gemm_rates(64, args.input, args.hidden)
    rate, gemm, gemm_layer = max(rates), max(square), max(layer)

    def pct(flops_per_sample: float, reference: float) -> str:
        return f"{100.0 * rate * flops_per_sample / 1e9 / reference:.0f}%"

    command = " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv])
    env = ", ".join(f"{k}={os.environ.get(k, 'unset')}" for k in RUNTIME_DEFAULTS)
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"command            {command}")
    print(f"torch              {torch.__version__}, {args.threads} thread(s), optimizer {args.optimizer}, "
          f"{env}, load average {load}")
    print(f"model              {args.input} -> {args.hidden} -> 10, {params:,} parameters, batch 64, packed bits")
    print(f"GEMM fp32          best {gemm:.1f} GFLOP/s (2048^3; median {statistics.median(square):.1f}), best "
          f"{gemm_layer:.1f} GFLOP/s (64x{args.input} . {args.input}x{args.hidden}; median "
          f"{statistics.median(layer):.1f})")
    print(f"local training     best {rate:.0f} samples/s over {len(rates)} epochs of {args.samples} samples "
          f"(median {statistics.median(rates):.0f})")
    print(f"achieved           {rate * 6 * params / 1e9:.1f} GFLOP/s at 6P FLOPs/sample = "
          f"{pct(6 * params, gemm)} of the best square GEMM rate, {pct(6 * params, gemm_layer)} of the best "
          "layer-shape rate")
    print(f"                   ({rate * 4 * params / 1e9:.1f} GFLOP/s at 4P, the work actually done: "
          f"{pct(4 * params, gemm)} / {pct(4 * params, gemm_layer)})")
    fraction = rate * 6 * params / 1e9 / gemm
    print(f"result             samples_per_s={rate:.0f} gemm_gflops={gemm:.1f} fraction_6p={fraction:.3f}")

if __name__ == "__main__":
    main()
