"""Peak RSS of a federation over one large client file (>= 5 GB) against one of 50 MB (issue 13).

Stage 2 holds a client split in memory only when it is small (``ldpfl.stage2_federate.streaming``); a larger
one is read in row blocks at every pass, so the federation's memory should not grow with the file. This
writes two runs of one client each, packed bits of r = 2000 values · 10 bits (2,500 bytes per row), the
large one of ``--size-gb`` and the small one of ``--small-mb`` (written in row blocks, random bytes: a
real file, every chunk stored with its Fletcher-32 checksum), then federates each in a fresh process
(1 round, 1 local epoch, hidden 32) and prints the peak RSS (``getrusage`` ru_maxrss) of each, and their
ratio. Before the streaming change, the large run had to hold the whole file (its RSS would exceed
``--size-gb``).

Usage (the lead times it on an idle machine; it needs about ``--size-gb`` of free disk)::

    .venv/bin/python bench/federate_memory.py [--size-gb 5] [--small-mb 50] [--dir DIR] [--keep]
    .venv/bin/python bench/federate_memory.py --size-gb 0.2 --small-mb 5     # a quick smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ldpfl import mechanisms as mech
from ldpfl.contract.client_writer import ClientFileWriter
from ldpfl.contract.layout import client_file_name
from ldpfl.contract.manifest import record_for, write_manifest
from ldpfl.contract.schema import ClientMetadata

FEATURES = 2000
INTEGER_BITS, FRACTION_BITS = 4, 5  # l = 10 bits per value: 20,000 bits = 2,500 bytes per row
NUM_CLASSES = 10
WRITE_ROWS = 4096

CHILD = """
import json, resource, sys, time
from ldpfl.stage2_federate.runtime import apply_runtime_defaults
apply_runtime_defaults()
from ldpfl.stage2_federate.federation import FederationConfig, run_federation
started = time.perf_counter()
config = FederationConfig(rounds=1, local_epochs=1, hidden=(32,), batch_size=1024, threads=int(sys.argv[3]),
                          seed=1, optimizer="sgd")
result = run_federation(sys.argv[1], config, out_dir=sys.argv[2], progress=False, overwrite=True, on_warning=None)
print(json.dumps({"seconds": time.perf_counter() - started, "accuracy": result.final_accuracy,
                  "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def write_client(run_dir: Path, total_bytes: int, rng: np.random.Generator) -> tuple[int, float]:
    """Write a one-client run of about ``total_bytes`` of packed features; return its rows and seconds."""
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = mech.MechanismSpec.resolve("none", {"integer_bits": INTEGER_BITS, "fraction_bits": FRACTION_BITS},
                                      features=FEATURES)
    metadata_args = dict(
        dataset="bench", num_classes=NUM_CLASSES, client_index=0, client_count=1, partition={"kind": "bench"},
        extractor="none", input_shape=(FEATURES,), integer_bits=INTEGER_BITS, fraction_bits=FRACTION_BITS,
        features=FEATURES, feature_format=spec.feature_format, mechanism=spec.name,
        mechanism_parameters=spec.recorded_parameters(), privacy_report=spec.report().to_dict(), randomness="seeded")
    stored_width = -(-FEATURES * (INTEGER_BITS + FRACTION_BITS + 1) // 8)
    train = max(2, int(total_bytes // stored_width * 0.9))
    test = max(1, int(total_bytes // stored_width) - train)
    rows = {"train": train, "test": test}
    histograms = {s: [0] * NUM_CLASSES for s in rows}
    labels_of = {s: rng.integers(0, NUM_CLASSES, size=n, dtype=np.int32) for s, n in rows.items()}
    for split, labels in labels_of.items():
        histograms[split] = np.bincount(labels, minlength=NUM_CLASSES).tolist()
    metadata = ClientMetadata(**metadata_args, label_histograms=histograms)
    path = run_dir / client_file_name(0)
    started = time.perf_counter()
    with ClientFileWriter(path, metadata, rows) as writer:
        for split, count in rows.items():
            for start in range(0, count, WRITE_ROWS):
                n = min(WRITE_ROWS, count - start)
                block = rng.integers(0, 256, size=(n, stored_width), dtype=np.uint8)
                writer.write_rows(split, start, block, labels_of[split][start:start + n])
        digest = writer.commit()
    write_manifest(run_dir, [record_for(path, 0, digest, rows)], {"dataset": "bench"})
    return train + test, time.perf_counter() - started


def federate(run_dir: Path, threads: int) -> dict[str, float]:
    """Federate ``run_dir`` in a fresh process; return its seconds, accuracy and peak RSS."""
    done = subprocess.run([sys.executable, "-c", CHILD, str(run_dir), str(run_dir / "federation"), str(threads)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"federation of {run_dir} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=5.0, help="Size of the large client file (GB).")
    parser.add_argument("--small-mb", type=float, default=50.0, help="Size of the small client file (MB).")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each federation.")
    parser.add_argument("--dir", type=Path, default=None, help="Where to write the runs (default: a temp dir).")
    parser.add_argument("--keep", action="store_true", help="Keep the runs afterwards.")
    args = parser.parse_args()
    base = args.dir if args.dir is not None else Path(tempfile.mkdtemp(prefix="ldpfl-federate-memory-"))
    rng = np.random.default_rng(13)
    figures = {}
    try:
        for name, size in (("small", args.small_mb * 1e6), ("large", args.size_gb * 1e9)):
            run_dir = base / name
            if run_dir.exists():
                shutil.rmtree(run_dir)
            rows, write_seconds = write_client(run_dir, int(size), rng)
            file_bytes = (run_dir / client_file_name(0)).stat().st_size
            result = federate(run_dir, args.threads)
            figures[name] = {"file_bytes": file_bytes, "rows": rows, "write_seconds": round(write_seconds, 1),
                             "federate_seconds": round(result["seconds"], 1),
                             "peak_rss_mib": round(result["peak_rss_kib"] / 1024, 1)}
            print(f"{name:>5}: file {file_bytes / 1e9:8.3f} GB ({rows:,} rows), written in {write_seconds:6.1f} s; "
                  f"federation (1 round, 1 epoch) {result['seconds']:7.1f} s, peak RSS "
                  f"{result['peak_rss_kib'] / 1024:8.1f} MiB", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    small, large = figures["small"], figures["large"]
    print(f"file size ratio {large['file_bytes'] / small['file_bytes']:.0f}x, peak RSS ratio "
          f"{large['peak_rss_mib'] / small['peak_rss_mib']:.2f}x "
          f"(machine: {os.cpu_count()} CPUs; threads {args.threads})")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
