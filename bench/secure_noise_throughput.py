"""Throughput of the secure samplers against the plain float Gaussian, measured in the same run.

Run from the repository root (on an idle machine; the numbers mean nothing under load):

    .venv/bin/python bench/secure_noise_throughput.py [--size 1000000] [--repeats 3]
    .venv/bin/python bench/secure_noise_throughput.py --small          # a quick check that it runs

It times, on one pinned core, for a batch of ``--size`` coordinates uniform in [-4, 4]:
* ``float``: the old sampler, ``x + sigma * rng.standard_normal(x.shape)`` (float64);
* ``secure-gaussian``: ``add_discrete_gaussian`` (randomized rounding to the grid + N_Z noise + exact
  float64 lattice values) with σ = 38.76 (gaussian, ε = 1, δ = 1e-5, c = 4) on the grid 2^(⌊log2 σ⌋ - 20);
* ``secure-laplace``: ``add_discrete_laplace`` with scale 8 on the grid 2^-17;
* ``dgauss-noise`` / ``dlap-noise``: the integer samplers alone (no rounding, no lattice conversion);
* with ``--opendp``, OpenDP's discrete Gaussian on a list of ``--opendp-size`` int64 zeros, for reference.

Each line is ``<name> <values/s> (best of N, <seconds> s)``; the last line holds all rates as key=value.
"""

from __future__ import annotations

from _bench_common import pin_to_one_core  # first: sets the thread counts to 1 before numpy is imported

# isort: split
import argparse
import math
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ldpfl.mechanisms import secure_noise as sn  # noqa: E402

SIGMA = 38.758442100843  # gaussian's σ at ε = 1, δ = 1e-5, c = 4 (WU eq. 7, Δ = 2c)
LAPLACE_SCALE = 8.0


def best_time(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1_000_000, help="coordinates per batch")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--small", action="store_true", help="size 10,000 and 1 repeat: only checks that it runs")
    parser.add_argument("--opendp", action="store_true", help="also time OpenDP's sampler (slow: per element)")
    parser.add_argument("--opendp-size", type=int, default=20_000)
    args = parser.parse_args(argv)
    if args.small:
        args.size, args.repeats, args.opendp_size = 10_000, 1, 1_000
    if args.size < 1 or args.repeats < 1:
        parser.error("--size and --repeats must be >= 1")

    print(f"python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}, {pin_to_one_core()}")
    rng = np.random.default_rng(2024)
    x = rng.uniform(-4.0, 4.0, size=args.size)
    gauss_grid = 2.0 ** (math.floor(math.log2(SIGMA)) - 20)
    lap_grid = 2.0**-17
    cases: dict[str, Callable[[], object]] = {
        "float": lambda: x + SIGMA * rng.standard_normal(x.shape),
        "secure-gaussian": lambda: sn.add_discrete_gaussian(x, SIGMA, gauss_grid, rng=rng),
        "secure-laplace": lambda: sn.add_discrete_laplace(x, LAPLACE_SCALE, lap_grid, rng=rng),
        "dgauss-noise": lambda: sn.discrete_gaussian(SIGMA / gauss_grid, args.size, rng=rng),
        "dlap-noise": lambda: sn.discrete_laplace(LAPLACE_SCALE / lap_grid, args.size, rng=rng),
    }
    rates: dict[str, float] = {}
    for name, run in cases.items():
        seconds = best_time(run, args.repeats)
        rates[name] = args.size / seconds
        print(f"{name:<16} {rates[name]:>14,.0f} values/s  (best of {args.repeats}, {seconds:.4f} s)")
    if args.opendp:
        import opendp.prelude as dp

        dp.enable_features("contrib")
        meas = dp.m.make_gaussian(dp.vector_domain(dp.atom_domain(T="i64")), dp.l2_distance(T="i64"),
                                  scale=SIGMA / gauss_grid)
        zeros = [0] * args.opendp_size
        seconds = best_time(lambda: meas(zeros), args.repeats)
        rates["opendp-dgauss"] = args.opendp_size / seconds
        print(f"{'opendp-dgauss':<16} {rates['opendp-dgauss']:>14,.0f} values/s  (best of {args.repeats}, "
              f"{seconds:.4f} s, {args.opendp_size} values)")
    slowdown = rates["float"] / rates["secure-gaussian"]
    print(f"secure-gaussian is {slowdown:.1f}x slower than the float sampler")
    print("result " + " ".join(f"{k.replace('-', '_')}_per_s={v:.0f}" for k, v in rates.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
