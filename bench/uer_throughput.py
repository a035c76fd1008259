"""UER throughput on one core: the FMNIST stage-1 workload of LDPFL (60,000 records × r·l = 11,520 bits).

Run from the repository root:

    .venv/bin/python bench/uer_throughput.py [--rows 60000] [--repeats 3] [--naive-bits 200000]

It times three things on one pinned core:
* ``UER.randomize`` over the whole 60,000 × 11,520 uint8 bit matrix (α = 10, ε = 0.5, m = 4, n = 5,
  r = 1152); input generation is not timed;
* a naive per-bit Python loop (one ``rng.random()`` per bit, compared with the class probability) over a
  slice of the same input;
* numpy's raw uniform float32 draw rate, ``rng.random(n, dtype=np.float32)``.

The last line is ``uer_bits_per_s=<x> naive_bits_per_s=<y> raw_draws_per_s=<z>``.
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

    # UER over the full matrix.
    seconds = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        y = uer.randomize(x, rng=rng)
        seconds.append(time.perf_counter() - t)
        del y
    uer_rate = x.size / statistics.median(seconds)
    print(
        f"UER.randomize, {args.repeats} runs: "
        + ", ".join(f"{s:.2f} s" for s in seconds)
        + f" -> median {uer_rate:.3e} bits/s (best {x.size / min(seconds):.3e})"
    )

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

    # numpy's raw float32 uniform draw rate.
    t = time.perf_counter()
    rng.random(args.raw_draws, dtype=np.float32)
    raw_rate = args.raw_draws / (time.perf_counter() - t)
    print(f"rng.random({args.raw_draws:,}, dtype=float32): {raw_rate:.3e} draws/s")

    print(
        f"UER / naive = {uer_rate / naive_rate:.0f}x (target >= 200x); "
        f"UER {uer_rate / 1e6:.0f} Mbit/s (target >= 300); "
        f"UER / raw float32 draws = {uer_rate / raw_rate:.2f}"
    )
    print(f"uer_bits_per_s={uer_rate:.4g} naive_bits_per_s={naive_rate:.4g} raw_draws_per_s={raw_rate:.4g}")


if __name__ == "__main__":
    main()
