"""ScatterNet features of all 70,000 Fashion-MNIST images (``--extractor scatter``), against kymatio's own call.

Run from the repository root (needs the IDX files in /usr/share/datasets/fashion-mnist or data/):

    .venv/bin/python bench/scatter_throughput.py [--batch 64] [--threads 2] [--processes 1] [--baseline-rows 10000]
                                                 [--tune]

* ``ours``: ``ScatterNet(J=2, L=8).transform`` (``ldpfl.stage1_features.models.scatter``) streamed over the pooled
  dataset, ``--batch`` images at a time, each batch converted to float32 in [0, 1] as the export does
  (``Dataset.features``). The features are consumed (a running sum), not kept, as the export writes them to its
  file batch by batch: memory is O(batch). Images/s, total seconds and the process's peak RSS (psutil's RSS sampled
  every 20 ms, and the kernel's ``ru_maxrss``) are printed, with the CPU seconds. ``--processes P`` runs P
  one-thread processes at once, each on 70,000/P images (as ``ldpfl export --clients-parallel P`` spreads clients).
* ``baseline``: kymatio's ``Scattering2D`` (torch frontend, default settings) called once on ``--baseline-rows``
  images in one batch, then torch's ``group_norm`` (27 groups, no affine), in a process of its own (its peak RSS is
  its own), with ``--threads`` threads. On a subset (default 10,000: the whole array in one call needs several GB)
  its time is extrapolated to 70,000 and labelled so. Both build their filters and run 8 images before the clock starts.
* ``--tune``: ours on 8,192 images for batch sizes 32-512 and 1 or 2 torch threads, before the full run.

The last line is ``scatter_images_per_s=<x> scatter_seconds=<s> peak_rss_mib=<m> baseline_images_per_s=<b>
baseline_seconds_70000=<t> speedup=<x/b>``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TOTAL = 70_000
MIB = 2**20


class PeakRss:
    """The process's peak RSS: psutil's RSS sampled every 20 ms in a thread, and the kernel's ``ru_maxrss``."""

    def __init__(self) -> None:
        import threading

        import psutil

        self.process, self.peak, self.done = psutil.Process(), 0, threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self.done.wait(0.02):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def mib(self) -> dict:
        """Stop sampling; return {"psutil": sampled peak, "ru_maxrss": the kernel's} in MiB."""
        import resource

        self.done.set()
        self.thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)
        return {"psutil": round(self.peak / MIB, 1),
                "ru_maxrss": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}  # Linux: KiB


def ours(rows: int, batch: int, threads: int | None, first: int = 0) -> dict:
    """Stream ``rows`` Fashion-MNIST images (from ``first``) through the extractor; return the rate and peak RSS."""
    import torch

    from ldpfl.stage1_features.datasets.loaders import load_dataset
    from ldpfl.stage1_features.models.scatter import ScatterNet

    rss = PeakRss()
    if threads is not None:
        torch.set_num_threads(threads)
    dataset = load_dataset("fashion-mnist")
    net = ScatterNet()
    net.transform(dataset.features(slice(0, 8)))  # builds the filters once (cached per process): not timed
    checksum = 0.0
    start, cpu = time.perf_counter(), time.process_time()
    for low in range(first, first + rows, batch):
        features = net.transform(dataset.features(slice(low, min(first + rows, low + batch))), batch=batch)
        checksum += float(features.sum(dtype=np.float64))
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"rows": rows, "batch": batch, "threads": torch.get_num_threads(), "seconds": round(seconds, 2),
            "cpu_seconds": round(cpu, 2), "images_per_s": round(rows / seconds, 1), "peak_rss_mib": rss.mib(),
            "checksum": checksum}


def baseline(rows: int, threads: int | None) -> dict:
    """kymatio's Scattering2D on ``rows`` images in one call, then group_norm; time and peak RSS."""
    import torch

    from ldpfl.stage1_features.datasets.loaders import load_dataset
    from ldpfl.stage1_features.models.scatter import scattering2d_class

    rss = PeakRss()
    if threads is not None:
        torch.set_num_threads(threads)
    dataset = load_dataset("fashion-mnist")
    x = torch.from_numpy(dataset.features(slice(0, rows))[..., 0].copy())  # (rows, 28, 28)
    scattering = scattering2d_class()(J=2, shape=(28, 28), L=8)  # kymatio.torch.Scattering2D, default settings
    with torch.inference_mode():
        scattering(x[:8])  # the first call's one-time costs, as ours warms up on 8 images: not timed
    start, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        s = scattering(x)  # (rows, 81, 7, 7)
        features = torch.nn.functional.group_norm(s, 27).reshape(rows, -1)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"rows": rows, "seconds": round(seconds, 2), "cpu_seconds": round(cpu, 2),
            "images_per_s": round(rows / seconds, 1),
            "seconds_70000": round(seconds * TOTAL / rows, 1), "extrapolated": rows < TOTAL,
            "peak_rss_mib": rss.mib(), "threads": torch.get_num_threads(),
            "width": int(features.shape[1])}


def in_subprocess(phase: str, **kwargs: object) -> dict:
    """Run one phase in a process of its own (its peak RSS is its own) and return its JSON."""
    return in_subprocesses(phase, [kwargs])[0]


def in_subprocesses(phase: str, each: list[dict]) -> list[dict]:
    """Run one process of ``phase`` per entry of ``each`` at the same time; return their JSON outputs."""
    procs = [subprocess.Popen([sys.executable, __file__, "--phase", phase, "--kwargs", json.dumps(kwargs)],
                              stdout=subprocess.PIPE, text=True) for kwargs in each]
    outputs = [proc.communicate()[0] for proc in procs]
    if any(proc.returncode for proc in procs):
        raise RuntimeError(f"a {phase} process failed")
    return [json.loads(out.strip().splitlines()[-1]) for out in outputs]


def ours_in_processes(rows: int, batch: int, processes: int) -> dict:
    """Ours in ``processes`` one-thread processes at once, each on its share of the rows (as --clients-parallel)."""
    share = -(-rows // processes)
    start = time.perf_counter()
    runs = in_subprocesses("ours", [{"rows": min(share, rows - i * share), "batch": batch, "threads": 1,
                                     "first": i * share} for i in range(processes)])
    seconds = time.perf_counter() - start  # includes each process's start-up and data loading
    return {"rows": rows, "batch": batch, "threads": f"{processes} processes x 1",
            "seconds": round(max(r["seconds"] for r in runs), 2), "wall_with_startup": round(seconds, 2),
            "cpu_seconds": round(sum(r["cpu_seconds"] for r in runs), 2),
            "images_per_s": round(rows / max(r["seconds"] for r in runs), 1),
            "peak_rss_mib": {"psutil": max(r["peak_rss_mib"]["psutil"] for r in runs),
                             "ru_maxrss": max(r["peak_rss_mib"]["ru_maxrss"] for r in runs)}}


def main() -> None:
    """Parse the options, run the phases, print one line per phase and the summary line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, = cores)")
    parser.add_argument("--rows", type=int, default=TOTAL)
    parser.add_argument("--baseline-rows", type=int, default=10_000)
    parser.add_argument("--processes", type=int, default=1,
                        help="run ours in this many one-thread processes at once (as --clients-parallel)")
    parser.add_argument("--tune", action="store_true")
    parser.add_argument("--phase", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--kwargs", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase is not None:
        print(json.dumps({"ours": ours, "baseline": baseline}[args.phase](**json.loads(args.kwargs))))
        return
    if args.tune:
        for threads in (1, 2):
            for batch in (32, 64, 128, 256, 512):
                tuned = in_subprocess("ours", rows=8192, batch=batch, threads=threads)
                print(f"tune threads={threads} batch={batch}: {tuned['images_per_s']} images/s, "
                      f"peak RSS {tuned['peak_rss_mib']['psutil']} MiB")
    base = in_subprocess("baseline", rows=args.baseline_rows, threads=args.threads)
    label = f" (extrapolated from {base['rows']} images)" if base["extrapolated"] else ""
    print(f"baseline: kymatio Scattering2D in one call + group_norm, {base['rows']} images: {base['seconds']} s, "
          f"{base['images_per_s']} images/s ({base['cpu_seconds']} CPU s, {base['threads']} threads); 70,000 images: "
          f"{base['seconds_70000']} s{label}; peak RSS "
          f"{base['peak_rss_mib']['psutil']} MiB (ru_maxrss {base['peak_rss_mib']['ru_maxrss']})")
    if args.processes > 1:
        run = ours_in_processes(args.rows, args.batch, args.processes)
    else:
        run = in_subprocess("ours", rows=args.rows, batch=args.batch, threads=args.threads)
    print(f"ours: ScatterNet.transform streamed, batch {run['batch']}, {run['threads']} torch threads: {run['rows']} "
          f"images in {run['seconds']} s ({run['cpu_seconds']} CPU s), {run['images_per_s']} images/s; peak RSS "
          f"{run['peak_rss_mib']['psutil']} MiB (ru_maxrss {run['peak_rss_mib']['ru_maxrss']})")
    print(f"scatter_images_per_s={run['images_per_s']} scatter_seconds={run['seconds']} "
          f"peak_rss_mib={run['peak_rss_mib']['psutil']} baseline_images_per_s={base['images_per_s']} "
          f"baseline_seconds_70000={base['seconds_70000']} "
          f"speedup={run['images_per_s'] / base['images_per_s']:.2f}")


if __name__ == "__main__":
    main()
