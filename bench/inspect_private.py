"""`ldpfl inspect` of private files against a default file, measured in the same run (issue 33: goal on an idle
machine <= 1.5 s for one private file, <= 3 s for a 10-file private run).

    .venv/bin/python bench/inspect_private.py --runs 5 [--work DIR]

Builds, once (seeded, small; kept in ``--work``): one private client file (mnist5k, the DP-SGD extractor trained by
jax-privacy, k-RR labels and k-RR values of the predicted class), a 10-file private run of the same kind, and one
default file (the same export without DP). Then times ``ldpfl inspect`` of each (the default check: the stored
guarantee against the numpy bracket) and of the private file with ``--recompute`` (the exact accountant), each a
fresh process, interleaved so that all see the same load, and prints the median and the fastest wall time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PRIVATE = ("--dataset", "mnist5k", "--epochs", "1", "--cnn-epsilon", "4", "--cnn-delta", "1e-5", "--label-epsilon",
           "1", "--release", "label", "--mechanism", "krr", "--epsilon", "2", "--seed", "5", "--quiet")
DEFAULT = ("--dataset", "mnist5k", "--epochs", "1", "--seed", "5", "--quiet")


def ldpfl() -> str:
    return str(Path(sys.executable).with_name("ldpfl"))


def build(out: Path, *args: str) -> Path:
    """Export ``out`` unless it holds a manifest already."""
    if not (out / "manifest.json").is_file():
        env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
        subprocess.run([ldpfl(), "export", *args, "--out", str(out)], check=True, env=env)
    return out


def wall(command: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--work", type=Path, default=Path("/tmp/ldpfl_bench_inspect_private"))
    args = parser.parse_args()
    one = build(args.work / "one", *PRIVATE, "--limit", "256", "--clients", "1")
    ten = build(args.work / "ten", *PRIVATE, "--limit", "2560", "--clients", "10")
    default = build(args.work / "default", *DEFAULT, "--limit", "256", "--clients", "1")
    commands = {
        "default file": [ldpfl(), "inspect", str(default / "client_000.h5")],
        "private file": [ldpfl(), "inspect", str(one / "client_000.h5")],
        "10-file private run": [ldpfl(), "inspect", str(ten)],
        "private file --recompute": [ldpfl(), "inspect", str(one / "client_000.h5"), "--recompute"],
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    load = os.getloadavg()[0]
    for _ in range(args.runs):
        for name, command in commands.items():
            times[name].append(wall(command))
    print(f"load average before: {load:.2f}, after: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    for name, values in times.items():
        print(f"{name:<26} median {statistics.median(values):6.2f} s   fastest {min(values):6.2f} s")


if __name__ == "__main__":
    main()
