"""UER throughput on one core: the FMNIST stage-1 workload of LDPFL (60,000 records × r·l = 11,520 bits).

Run from the repository root:

    .venv/bin/python bench/uer_throughput.py [--rows 60000] [--repeats 3] [--naive-bits 200000]

It times three things on one pinned core:
* ``UER.randomize`` over the whole 60,000 × 11,520 uint8 bit matrix (α = 10, ε = 0.5, m = 4, n = 5,
  r = 1152); input generation is not timed. It runs with the seeded generator (PCG64) and with the default
  secure one (AES-CTR, or ChaCha20 without AES-NI), alternating, in the same run;
* a naive per-bit Python loop (one ``rng.random()`` per bit, compared with the class probability) over a
  slice of the same input;
* numpy's raw uniform float32 draw rate, ``rng.random(n, dtype=np.float32)``, and the 64-bit word rate
  (``randomness.random_words``, what the threshold samplers draw), for both generators.

The last line is ``uer_bits_per_s=<x> naive_bits_per_s=<y> raw_draws_per_s=<z> secure_uer_bits_per_s=<s>
secure_over_pcg64=<s/x>``.
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
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ldpfl import mechanisms as mech  # noqa: E402
from ldpfl.mechanisms.randomness import random_words  # noqa: E402

PAPER = {"epsilon": 0.5, "alpha": 10.0, "integer_bits": 4, "fraction_bits": 5, "features": 1152}
INPUT_DENSITY = 0.3  # share of 1s in the input bits (does not change UER's speed: it has no branches)
GENERATION_ROWS = 2000


def make_input(rows: int, width: int, rng: np.random.Generator) -> np.ndarray:
    """Bits with INPUT_DENSITY ones, generated in chunks of rows to bound temporary memory."""
    bits = np.empty((rows, width), dtype=np.uint8)
    for start in range(0, rows, GENERATION_ROWS):
        chunk = bits[start : start + GENERATION_ROWS]
        np.less(rng.random(chunk.shape, dtype=np.float32), INPUT_DENSITY, out=chunk.view(np.bool_))
    return bits


def naive_loop(
    bits: np.ndarray,
    classes: np.ndarray,
    p_if_zero: list[float],
    p_if_one: list[float],
    rng: np.random.Generator,
) -> list[int]:
    """The per-bit Python loop UER replaces: one uniform draw per bit, compared with its probability."""
    random = rng.random
    out = []
    for bit, cls in zip(bits.tolist(), classes.tolist(), strict=True):
        p = p_if_one[cls] if bit else p_if_zero[cls]
        out.append(1 if random() < p else 0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=60_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--naive-bits", type=int, default=200_000)
    parser.add_argument("--raw-draws", type=int, default=100_000_000)
    args = parser.parse_args()

    pinned = pin_to_one_core()
    uer = mech.create_mechanism("uer", **PAPER)
    width = uer.width
    rng = mech.default_rng(20240601)

    print(
        f"machine: {platform.machine()} {platform.processor() or ''} | "
        f"os.cpu_count()={os.cpu_count()} | {pinned}"
    )
    print(f"python {platform.python_version()} | numpy {np.__version__}")
    print(
        f"UER {PAPER}, r*l = {width} bits per record, {args.rows} records "
        f"= {args.rows * width:,} bits ({args.rows * width / 1e6:.0f} MB as uint8)"
    )

    t = time.perf_counter()
    x = make_input(args.rows, width, rng)
    print(f"input generated in {time.perf_counter() - t:.1f} s (not timed below); density {x.mean():.3f}")

    # UER over the full matrix, with PCG64 and the secure generator in turn (run-to-run noise hits both).
    secure = mech.make_randomness().generator()  # what an unseeded run draws from
    secure_name = mech.make_randomness().generator_name
    seconds: dict[str, list[float]] = {"PCG64": [], secure_name: []}
    cpu: dict[str, list[float]] = {"PCG64": [], secure_name: []}  # process CPU time: robust to a busy machine
    for _ in range(args.repeats):
        for name, generator in (("PCG64", rng), (secure_name, secure)):
            t, c = time.perf_counter(), time.process_time()
            y = uer.randomize(x, rng=generator)
            seconds[name].append(time.perf_counter() - t)
            cpu[name].append(time.process_time() - c)
            del y
    rates = {name: x.size / statistics.median(times) for name, times in seconds.items()}
    uer_rate, secure_rate = rates["PCG64"], rates[secure_name]
    for name, times in seconds.items():
        print(f"UER.randomize ({name}), {args.repeats} runs: " + ", ".join(f"{s:.2f} s" for s in times)
              + f" -> median {rates[name]:.3e} bits/s (best {x.size / min(times):.3e})")
    best = min(seconds["PCG64"]) / min(seconds[secure_name])
    cpu_ratio = statistics.median(cpu["PCG64"]) / statistics.median(cpu[secure_name])
    print(f"UER {secure_name} / PCG64 = {secure_rate / uer_rate:.2f} (medians of wall time), {best:.2f} (best runs), "
          f"{cpu_ratio:.2f} (medians of CPU time; median CPU s: PCG64 {statistics.median(cpu['PCG64']):.3f}, "
          f"{secure_name} {statistics.median(cpu[secure_name]):.3f}) (target >= 0.7)")

    # Naive per-bit loop over a slice of the same input (row-major, whole records first).
    flat = x.reshape(-1)[: args.naive_bits]
    classes = uer.position_classes()[np.arange(flat.size) % width]
    effective = uer.effective_bit_classes()
    p_if_zero = [c.p_one_given_zero for c in effective]
    p_if_one = [c.p_one_given_one for c in effective]
    t = time.perf_counter()
    naive_loop(flat, classes, p_if_zero, p_if_one, rng)
    naive_rate = flat.size / (time.perf_counter() - t)
    print(f"naive per-bit Python loop over {flat.size:,} bits: {naive_rate:.3e} bits/s")

    # numpy's raw float32 uniform draw rate and the 64-bit word rate, for both generators.
    raw = {}
    for name, generator in (("PCG64", rng), (secure_name, secure)):
        t = time.perf_counter()
        generator.random(args.raw_draws, dtype=np.float32)
        raw[name] = args.raw_draws / (time.perf_counter() - t)
        t = time.perf_counter()
        random_words(args.raw_draws // 2, generator)
        words = args.raw_draws // 2 / (time.perf_counter() - t)
        print(f"{name}: rng.random({args.raw_draws:,}, dtype=float32): {raw[name]:.3e} draws/s; "
              f"random_words({args.raw_draws // 2:,}): {words:.3e} words/s")
    raw_rate = raw["PCG64"]

    print(
        f"UER / naive = {uer_rate / naive_rate:.0f}x (target >= 200x); "
        f"UER {uer_rate / 1e6:.0f} Mbit/s (target >= 300); "
        f"UER / raw float32 draws = {uer_rate / raw_rate:.2f}"
    )
    print(f"uer_bits_per_s={uer_rate:.4g} naive_bits_per_s={naive_rate:.4g} raw_draws_per_s={raw_rate:.4g} "
          f"secure_uer_bits_per_s={secure_rate:.4g} secure_over_pcg64={secure_rate / uer_rate:.3f} "
          f"secure_over_pcg64_best={best:.3f} secure_over_pcg64_cpu={cpu_ratio:.3f}")


if __name__ == "__main__":
    main()
