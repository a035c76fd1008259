"""The Flower engine's start-up time and per-round overhead against the local engine, on the same run.

Runs the same seeded federation with ``--engine local`` and with ``--engine flower`` (Flower's simulation
engine: a private SuperLink, Ray, one ClientApp per client file) at 1 and 2 CPUs per client, and
reports for each: the wall time, the time per round (the median of the rounds' ``seconds``, measured
inside the engine from selection to the evaluated record), and the start-up + tear-down time (wall
minus the rounds). It also checks that every engine selected the same clients and reached the same
accuracies. Without RUN_DIR it writes a small synthetic run (``tests/federate_files.py``).

Usage::

    .venv/bin/python bench/flower_overhead.py [RUN_DIR] [--rounds 5] [--clients 4] [--hidden 2048] [--cpus 1,2]

Needs ``pip install -e '.[flower]'``. Time it on an idle machine: Ray's start-up and Flower's per-message
overhead are very sensitive to other load.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(label: str, run) -> dict:
    start = time.perf_counter()
    result = run()
    wall = time.perf_counter() - start
    rounds = [float(r["seconds"]) for r in result.history]
    return {"engine": label, "wall_s": wall, "round_s_median": statistics.median(rounds),
            "startup_and_teardown_s": wall - sum(rounds), "selected": [r["selected"] for r in result.history],
            "test_accuracy": [r["test_accuracy"] for r in result.history]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", nargs="?", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clients", type=int, default=4, help="clients of the synthetic run (without RUN_DIR)")
    parser.add_argument("--hidden", default="2048", help="hidden layer sizes, e.g. 2048 or 64 or none")
    parser.add_argument("--cpus", default="1,2", help="CPUs per simulated client to time, comma-separated")
    args = parser.parse_args()

    from ldpfl.stage2_federate.runtime import apply_runtime_defaults

    apply_runtime_defaults()
    from ldpfl.stage2_federate.config import FederationConfig
    from ldpfl.stage2_federate.federation import run_federation
    from ldpfl.stage2_federate.flower_engine.launch import FlowerOptions, run_flower

    work = Path(tempfile.mkdtemp(prefix="ldpfl-bench-flower-"))
    run_dir = args.run_dir
    if run_dir is None:
        sys.path.insert(0, str(ROOT / "tests"))
        from federate_files import write_run

        run_dir = write_run(work / "run", clients=args.clients, rows=512, features=64)
    hidden = () if args.hidden.lower() == "none" else tuple(int(v) for v in args.hidden.split(","))
    config = FederationConfig(rounds=args.rounds, hidden=hidden, seed=1, device="cpu")
    rows = [timed("local", lambda: run_federation(run_dir, config, out_dir=work / "local", progress=False,
                                                  on_warning=None))]
    for cpus in (int(c) for c in args.cpus.split(",")):
        options = FlowerOptions(cpus_per_client=cpus)
        rows.append(timed(f"flower, {cpus} CPU/client", lambda o=options, c=cpus: run_flower(
            run_dir, config, out_dir=work / f"flower{c}", progress=False, options=o, on_warning=None)))
    same = all(r["selected"] == rows[0]["selected"] for r in rows)
    close = all(max(abs(a - b) for a, b in zip(r["test_accuracy"], rows[0]["test_accuracy"], strict=True)) < 1e-6
                for r in rows)
    print(f"run {run_dir}, {args.rounds} rounds, hidden {hidden or 'none'}; same selections: {same}; "
          f"same accuracies (1e-6): {close}")
    print(f"{'engine':<24}{'wall s':>9}{'per round s':>13}{'start-up + tear-down s':>25}")
    for r in rows:
        print(f"{r['engine']:<24}{r['wall_s']:>9.1f}{r['round_s_median']:>13.3f}{r['startup_and_teardown_s']:>25.1f}")
    print(json.dumps({"rows": rows}, default=float))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
