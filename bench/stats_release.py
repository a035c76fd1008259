"""The one-shot statistics release of 10 Fashion-MNIST silos against the ScatterNet export alone (issue 40).

Issue 40's target: releasing the 70,000 records' statistics (``ldpfl export --release stats:K --keep-clean-test``:
every record through the ScatterNet, projected, clipped, summed; one noisy release per silo; synthetic records;
the clean test records kept locally) costs at most 1.5× the ScatterNet export alone (``--local-only``: every
record through the ScatterNet, written as clean features), both measured in this run, the same executor
(``--clients-parallel``), one after the other.

    .venv/bin/python bench/stats_release.py --out runs/bench-stats

Prints each export's seconds and peak memory of this process tree, the ratio against the 1.5 target, and the
released files' sizes.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import psutil

import ldpfl

TARGET_RATIO = 1.5


def tree_rss_mib() -> float:
    """Return the resident memory of this process and its children, MiB."""
    me = psutil.Process()
    return sum(p.memory_info().rss for p in [me, *me.children(recursive=True)]) / 2**20


def timed(label: str, **fields: object) -> float:
    start = time.perf_counter()
    ldpfl.export(dataset="fashion-mnist", clients=10, extractor="scatter", progress_bars=False, **fields)
    seconds = time.perf_counter() - start
    print(f"{label}: {seconds:.1f} s", flush=True)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/bench-stats"))
    parser.add_argument("--width", type=int, default=384, help="K of stats:K (the front's, chosen on validation)")
    parser.add_argument("--epsilon", type=float, default=3.0)
    parser.add_argument("--clients-parallel", type=int, default=2)
    args = parser.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    scatter = timed("scatter export alone (--local-only)", mechanism="none", local_only=True,
                    clients_parallel=args.clients_parallel, out=args.out / "scatter")
    released = timed(f"stats:{args.width} release (--keep-clean-test)", release=f"stats:{args.width}",
                     mechanism_params={"epsilon": args.epsilon}, keep_clean_test=True,
                     clients_parallel=args.clients_parallel, out=args.out / "stats")
    sizes = {name: sum(p.stat().st_size for p in (args.out / name).glob("client_???.h5")) / 2**20
             for name in ("scatter", "stats")}
    ratio = released / scatter
    print(f"files: scatter {sizes['scatter']:.0f} MiB (clean, never shared), stats {sizes['stats']:.1f} MiB "
          "(shareable)")
    print(f"stats_seconds={released:.1f} scatter_seconds={scatter:.1f} ratio={ratio:.3f} target<={TARGET_RATIO} "
          f"{'met' if ratio <= TARGET_RATIO else 'MISSED'} peak_rss_mib_now={tree_rss_mib():.0f}")


if __name__ == "__main__":
    main()
