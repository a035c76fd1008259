"""Stage 1 on a 2-worker local Ray cluster against ``--clients-parallel 2``, in the same run (issue 32).

Starts a Ray head of its own on this machine (``tests/ray_head.py``: ``ray start --head`` with
``--workers`` × c CPUs, c = cpu_count // workers, each client task declaring c CPUs: at most ``--workers``
tasks at once, each with the c threads a ``--clients-parallel`` worker gets), then exports the same seeded
mnist5k run ``--repeats`` times each way, alternating, with ``ldpfl export`` in a fresh process:

* local: ``--clients-parallel WORKERS`` (spawned processes, as today);
* ray:   ``--ray-address <the head>`` (each client a Ray task, files written by the driver).

Both run the paper's MNIST CNN (``mnist-cnn``, Fig. 3) for ``--epochs`` epochs on each client, and both
start cold: the local workers and Ray's workers import TensorFlow in the run. The head's start-up is a
cluster's, not an export's: it is timed and reported apart. For each way it prints the wall time of the
command (median over repeats), the export's own time (``ExportResult.seconds``), and the overhead of Ray
over local in percent (target: at most 10 %); it checks that the two ways wrote the same client files
(every dataset and attribute but the creation time) and stops every process of the head.

Usage::

    .venv/bin/python bench/ray_export.py [--clients 4] [--workers 2] [--epochs 3] [--repeats 1]

The last line is ``local_s=<x> ray_s=<y> overhead_pct=<z> same_files=<bool> head_start_s=<h>``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from ray_head import start_head, stop_head  # noqa: E402 - tests/ on the path first

CREATION = ("created_utc",)


def export(args: argparse.Namespace, out: Path, executor: list[str]) -> tuple[float, float]:
    """Run one seeded ``ldpfl export`` in a fresh process; return (wall seconds, the export's own seconds)."""
    command = [str(ROOT / ".venv" / "bin" / "ldpfl"), "export", "--dataset", "mnist5k", "--extractor", "mnist-cnn",
               "--clients", str(args.clients), "--epochs", str(args.epochs), "--seed", str(args.seed), "--quiet",
               "--json", "--overwrite", "--out", str(out), *executor]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed: {done.stderr[-2000:]}")
    return wall, float(json.loads(done.stdout)["seconds"])


def contents(path: Path) -> dict[str, object]:
    """Every attribute (the creation time left out) and every dataset's bytes of an HDF5 file, by path."""
    found: dict[str, object] = {}
    with h5py.File(path, "r") as f:
        def attrs(obj: h5py.HLObject) -> dict[str, object]:
            return {k: (v.dtype.str, v.shape, v.tobytes()) if isinstance(v, np.ndarray | np.generic) else v
                    for k, v in obj.attrs.items() if k not in CREATION}

        found["/"] = attrs(f)
        f.visititems(lambda name, obj: found.__setitem__(
            name, (attrs(obj), obj[()].tobytes()) if isinstance(obj, h5py.Dataset) else attrs(obj)))
    return found


def same_files(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.glob("client_*.h5"))
    return names == sorted(p.name for p in b.glob("client_*.h5")) and all(
        contents(a / n) == contents(b / n) for n in names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    per_client = max(1, (os.cpu_count() or 1) // args.workers)  # the threads a --clients-parallel worker gets
    print(f"mnist5k, {args.clients} clients, mnist-cnn, {args.epochs} epochs; {args.workers} workers each way, "
          f"{per_client} CPU(s) each; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}", flush=True)
    started = time.perf_counter()
    head = start_head(args.workers * per_client)
    head_start = time.perf_counter() - started
    print(f"ray head up at {head.address} in {head_start:.1f} s (not counted below)", flush=True)
    times: dict[str, list[tuple[float, float]]] = {"local": [], "ray": []}
    try:
        with tempfile.TemporaryDirectory(prefix="ldpfl-bench-ray-") as tmp:
            outs = {"local": Path(tmp) / "local", "ray": Path(tmp) / "ray"}
            executors = {"local": ["--clients-parallel", str(args.workers)],
                         "ray": ["--ray-address", head.address, "--ray-cpus-per-client", str(per_client)]}
            for repeat in range(args.repeats):
                for way in ("local", "ray") if repeat % 2 == 0 else ("ray", "local"):
                    wall, seconds = export(args, outs[way], executors[way])
                    times[way].append((wall, seconds))
                    print(f"  {way:>5}: wall {wall:6.1f} s, export {seconds:6.1f} s "
                          f"(load average {os.getloadavg()[0]:.2f})", flush=True)
            identical = same_files(outs["local"], outs["ray"])
    finally:
        left = stop_head(head)
    local_s = statistics.median(w for w, _ in times["local"])
    ray_s = statistics.median(w for w, _ in times["ray"])
    overhead = 100.0 * (ray_s - local_s) / local_s
    print(f"local --clients-parallel {args.workers}: {local_s:.1f} s (export "
          f"{statistics.median(s for _, s in times['local']):.1f} s); ray, {args.workers} workers: {ray_s:.1f} s "
          f"(export {statistics.median(s for _, s in times['ray']):.1f} s); overhead {overhead:+.1f} % "
          f"(target <= 10 %); same client files: {identical}; Ray processes left: {len(left)}")
    print(f"local_s={local_s:.2f} ray_s={ray_s:.2f} overhead_pct={overhead:.1f} same_files={identical} "
          f"head_start_s={head_start:.1f}")


if __name__ == "__main__":
    main()
