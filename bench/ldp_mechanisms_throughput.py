"""Throughput of the low-dimensional LDP mechanisms (issue 17) on one core, next to numpy's raw draw rate.

Run from the repository root on an otherwise idle machine:

    .venv/bin/python bench/ldp_mechanisms_throughput.py [--rows 1000000] [--dim 10] [--categories 10]
                                                        [--epsilon 5] [--repeats 3]
    .venv/bin/python bench/ldp_mechanisms_throughput.py --small     # a quick check that it runs

It times, on one pinned core, with inputs generated beforehand (not timed):

* ``krr`` and ``oue-label`` over ``rows`` categorical values (``randomize_labels`` on int64 labels, and
  ``randomize`` on one-hot float32 rows of width k);
* ``duchi``, ``piecewise``, ``hybrid``, ``laplace`` over ``rows`` float32 records of ``dim`` values in [-1, 1];
* numpy's raw draw rates in the same run: ``rng.random(n)`` (float64 uniforms) and
  ``randomness.random_words(n)`` (64-bit integers, what the samplers compare with their thresholds).

Everything runs twice: with the seeded generator (PCG64) and with the default secure one (AES-CTR, or
ChaCha20 without AES-NI), and the secure/PCG64 ratio of each rate is printed.

A "value" is one categorical value (krr, oue-label) or one coordinate of a record (the others; piecewise and
hybrid randomize only k of the d coordinates, k = max(1, min(d, floor(ε/2.5))), and output 0 for the rest). The last
line is ``name=<values/s> ...`` for every mechanism plus ``raw_float64_per_s`` and ``raw_uint64_per_s`` (PCG64),
then ``secure_over_pcg64_<name>=<ratio>`` for each.
"""

from __future__ import annotations

from _bench_common import pin_to_one_core  # first: sets the thread counts to 1 before numpy is imported

# isort: split
import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ldpfl import mechanisms as mech  # noqa: E402
from ldpfl.mechanisms.randomness import random_words  # noqa: E402

CATEGORICAL = ("krr", "oue-label")
BOUNDED = ("duchi", "piecewise", "hybrid", "laplace")


CLOCK = {"clock": time.perf_counter}  # --cpu-time: time.process_time, the process's own CPU time


def median_rate(work: Callable[[], object], values: int, repeats: int) -> tuple[float, list[float]]:
    """values / median seconds of ``repeats`` runs of ``work`` (wall time, or CPU time with ``--cpu-time``)."""
    clock = CLOCK["clock"]
    seconds = []
    for _ in range(repeats):
        t = clock()
        work()
        seconds.append(clock() - t)
    return values / statistics.median(seconds), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="records per timed call")
    parser.add_argument("--dim", type=int, default=10, help="d, values per record of the bounded mechanisms")
    parser.add_argument("--categories", type=int, default=10, help="k of krr and oue-label")
    parser.add_argument("--epsilon", type=float, default=5.0, help="ε per record")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--raw-draws", type=int, default=50_000_000)
    parser.add_argument("--small", action="store_true", help="tiny sizes, one repeat: checks that the script runs")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time with the process's CPU time (one pinned thread) instead of wall time: on a busy "
                             "machine, wall time mostly measures the wait for the core")
    args = parser.parse_args()
    if args.cpu_time:
        CLOCK["clock"] = time.process_time
    if args.small:
        args.rows, args.repeats, args.raw_draws = 2_000, 1, 100_000

    pinned = pin_to_one_core()
    rng = mech.default_rng(20240601)
    print(f"machine: {platform.machine()} {platform.processor() or ''} | os.cpu_count()={os.cpu_count()} | {pinned}")
    print(f"python {platform.python_version()} | numpy {np.__version__}")
    print(f"rows {args.rows:,}, d = {args.dim}, k = {args.categories}, epsilon = {args.epsilon:g} per record; "
          f"{'CPU' if args.cpu_time else 'wall'} time")

    labels = rng.integers(0, args.categories, size=args.rows)
    one_hot = np.eye(args.categories, dtype=np.float32)[labels]
    bounded = rng.uniform(-1.0, 1.0, size=(args.rows, args.dim)).astype(np.float32)

    secure_name = mech.make_randomness().generator_name
    by_generator = {"PCG64": time_everything(args, rng, labels, one_hot, bounded),
                    secure_name: time_everything(args, mech.make_randomness().generator(), labels, one_hot, bounded)}
    rates, secure = by_generator["PCG64"], by_generator[secure_name]
    for name in rates:
        print(f"{name:<18} {rates[name] / rates['raw_float64_per_s']:8.4f} x raw float64 draws (PCG64); "
              f"{secure_name} / PCG64 = {secure[name] / rates[name]:.2f}")
    print(" ".join(f"{name}={rate:.4g}" for name, rate in rates.items()) + " "
          + " ".join(f"secure_over_pcg64_{name}={secure[name] / rate:.3f}" for name, rate in rates.items()))


def time_everything(args: argparse.Namespace, rng: np.random.Generator, labels: np.ndarray, one_hot: np.ndarray,
                    bounded: np.ndarray) -> dict[str, float]:
    """Values per second of every mechanism, and the raw draw rates, drawing from ``rng``."""
    generator = mech.randomness.generator_name_of(rng)
    print(f"-- {generator}")
    rates: dict[str, float] = {}
    for name in CATEGORICAL:
        m = mech.create_mechanism(name, epsilon=args.epsilon, categories=args.categories)
        rate, seconds = median_rate(lambda m=m: m.randomize_labels(labels, rng=rng), args.rows, args.repeats)
        rates[name] = rate
        print(f"{name:<10} randomize_labels: " + ", ".join(f"{s:.3f} s" for s in seconds)
              + f" -> {rate:.3e} values/s")
        rate, seconds = median_rate(lambda m=m: m.randomize(one_hot, rng=rng), args.rows, args.repeats)
        rates[f"{name}_one_hot"] = rate
        print(f"{name:<10} randomize(one-hot): " + ", ".join(f"{s:.3f} s" for s in seconds)
              + f" -> {rate:.3e} values/s")
    for name in BOUNDED:
        m = mech.create_mechanism(name, epsilon=args.epsilon, dim=args.dim)
        rate, seconds = median_rate(lambda m=m: m.randomize(bounded, rng=rng), bounded.size, args.repeats)
        rates[name] = rate
        print(f"{name:<10} randomize: " + ", ".join(f"{s:.3f} s" for s in seconds) + f" -> {rate:.3e} values/s "
              f"(exact epsilon per record {m.report().exact_epsilon_per_record:.6g})")
    raw_float, _ = median_rate(lambda: rng.random(args.raw_draws), args.raw_draws, args.repeats)
    raw_uint, _ = median_rate(lambda: random_words(args.raw_draws, rng), args.raw_draws, args.repeats)
    print(f"rng.random({args.raw_draws:,}): {raw_float:.3e} draws/s; "
          f"random_words({args.raw_draws:,}): {raw_uint:.3e} draws/s")
    return rates | {"raw_float64_per_s": raw_float, "raw_uint64_per_s": raw_uint}

if __name__ == "__main__":
    main()
