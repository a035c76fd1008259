"""`ldpfl --help` wall time against `python -c pass`, measured in the same run (issue 33: goal <= 0.3 s idle).

    .venv/bin/python bench/cli_startup.py --runs 15

Prints the median and the fastest wall time of each over ``--runs`` runs, interleaved so both see the same load.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path


def wall(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    ldpfl = str(Path(sys.executable).with_name("ldpfl"))
    commands = {"python -c pass": [sys.executable, "-c", "pass"], "ldpfl --help": [ldpfl, "--help"]}
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.runs):
        for name, command in commands.items():
            times[name].append(wall(command))
    for name, values in times.items():
        print(f"{name:<16} median {statistics.median(values):.3f} s   fastest {min(values):.3f} s")


if __name__ == "__main__":
    main()
