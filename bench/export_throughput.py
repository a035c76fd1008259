"""Stage-1 export throughput on full Fashion-MNIST (70,000 pooled samples), LDPFL's FMNIST setting.

Run from the repository root (needs the IDX files in /usr/share/datasets/fashion-mnist or data/):

    .venv/bin/python bench/export_throughput.py [--rows 70000] [--train-batches 300] [--predict-rows 10000]

Each phase runs in its own process, so its peak RSS (``ru_maxrss``) is its own:

* ``cnn``: the Fig. 4 net on 28×28×1 (r = 1,152) trained for ``--train-batches`` batches of 64 on
  Fashion-MNIST (RMSprop, augmentation on; the first batch, which traces the graph, is not timed), then
  prediction (flatten + softmax) over ``--predict-rows`` samples. It saves a pool of real flatten
  features of this short-trained model for the next phases.
* ``stream``: what ``ldpfl export`` does after prediction: ``features.write_split`` on 1,024-row
  batches, released in 256-row steps and written once per batch. Fixed-point encode (m = 4, n = 5,
  eq. 14) → UER (ε = 0.5, α = 10, eq. 17) → pack bits → write into an HDF5 client file (Fletcher-32,
  the real ``ClientFileWriter``). ``--rows`` rows are streamed by cycling through the feature pool, so
  no prediction time is included. Timed without tracing, ``--stream-repeats`` times with the seeded
  generator (PCG64) and as many with the default secure one (AES-CTR, or ChaCha20 without AES-NI),
  alternating (medians); run again under tracemalloc for the peak; a last pass times each stage.
* ``float64``: the reference implementation's approach for the same rows: every flatten feature of the
  dataset held in RAM as float64 (tracemalloc peak and RSS). Its per-bit Python randomizer is also timed
  on ``--reference-rows`` rows (a re-implementation of its algorithm: string formatting per value and one
  ``random.random()`` per bit).

The last line is ``export_rows_per_s=<x> train_samples_per_s=<y> predict_samples_per_s=<z>
stream_peak_mib=<a> float64_peak_mib=<b> reference_rows_per_s=<c> secure_export_rows_per_s=<s>
secure_over_pcg64=<s/x>``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PAPER = {"epsilon": 0.5, "alpha": 10.0, "integer_bits": 4, "fraction_bits": 5}
R = 1152  # Fig. 4 flatten width on 28×28×1 (IV-D)
MIB = 2**20


def rss_mib() -> float:
    """Peak resident set size of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def phase_cnn(args: argparse.Namespace) -> dict:
    from ldpfl.stage1_features.datasets.loaders import load_dataset
    from ldpfl.stage1_features.models import cnn

    keras = cnn.import_keras()
    dataset = load_dataset("fashion-mnist")
    rng = np.random.default_rng(0)
    rows = rng.permutation(len(dataset))[: args.train_batches * 64 + 64]
    x = dataset.features(rows)
    y = dataset.y[rows]
    keras.utils.set_random_seed(int(rng.integers(2**31)))
    model = cnn.build_model(cnn.CIFAR_CNN, (28, 28, 1), 10)
    config = cnn.TrainingConfig(epochs=1, batch_size=64)
    clock: dict[str, float] = {}

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            clock.setdefault("first", time.perf_counter())  # batch 0 traces the graph: not timed
            clock["last"] = time.perf_counter()

    cnn.train_model(model, x, y, config, rng=rng, callbacks=[Clock()])
    train_s = clock["last"] - clock["first"]
    extractor = cnn.FeatureExtractor(model)
    predict_rows = rng.permutation(len(dataset))[: args.predict_rows]
    extractor.predict(dataset.features(predict_rows[:1024]))  # trace
    start = time.perf_counter()
    pool = []
    for begin in range(0, len(predict_rows), 1024):
        features, _ = extractor.predict(dataset.features(predict_rows[begin:begin + 1024]))
        if sum(len(p) for p in pool) < args.pool:
            pool.append(features)
    predict_s = time.perf_counter() - start
    pool_array = np.concatenate(pool)[: args.pool]
    np.save(args.pool_file, pool_array)
    return {"train_samples": args.train_batches * 64, "train_s": train_s,
            "train_samples_per_s": args.train_batches * 64 / train_s,
            "predict_samples": len(predict_rows), "predict_s": predict_s,
            "predict_samples_per_s": len(predict_rows) / predict_s,
            "feature_min": float(pool_array.min()), "feature_max": float(pool_array.max()),
            "feature_mean": float(pool_array.mean()), "rss_mib": rss_mib()}


def phase_stream(args: argparse.Namespace) -> dict:
    from ldpfl import mechanisms
    from ldpfl.contract.client_writer import ClientFileWriter
    from ldpfl.contract.schema import ClientMetadata
    from ldpfl.stage1_features.export.write import BATCH_ROWS, RELEASE_ROWS, ReleasePipeline, write_split

    pool = np.load(args.pool_file)
    mech = mechanisms.create_mechanism("uer", features=R, **PAPER)
    pipeline = ReleasePipeline(mech, mech.fixed_point_encoding(), mechanisms.PACKED_BITS)
    report = mech.report().with_randomness("seeded").to_dict()
    meta = ClientMetadata(dataset="fashion-mnist", num_classes=10, client_index=0, client_count=1,
                          partition={"kind": "bench"}, extractor="cifar-cnn", input_shape=(28, 28, 1),
                          integer_bits=4, fraction_bits=5, features=R, feature_format=mechanisms.PACKED_BITS,
                          mechanism="uer", mechanism_parameters=mech.parameters(), privacy_report=report,
                          randomness="seeded", label_histograms={"train": [0] * 10, "test": [0] * 10})

    def batches():  # what the CNN yields: 1,024-row batches of flatten features (cycled from the pool)
        for begin in range(0, args.rows, BATCH_ROWS):
            rows = np.arange(begin, min(args.rows, begin + BATCH_ROWS)) % len(pool)
            yield np.take(pool, rows, axis=0), np.zeros(len(rows), dtype=np.int32)

    def export_path(path: Path, rng: np.random.Generator) -> float:
        """The export's own path: ``features.write_split`` into a ``ClientFileWriter``; seconds."""
        start = time.perf_counter()
        with ClientFileWriter(path, meta, {"train": args.rows, "test": 0}) as writer:
            write_split(writer, "train", batches(), pipeline, rng)
            writer.commit()
        return time.perf_counter() - start

    stages = {"encode": 0.0, "randomize": 0.0, "pack": 0.0, "write": 0.0}
    secure_name = mechanisms.make_randomness().generator_name
    seconds: dict[str, list[float]] = {"PCG64": [], secure_name: []}
    cpu: dict[str, list[float]] = {"PCG64": [], secure_name: []}  # process CPU time: robust to a busy machine
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        for repeat in range(args.stream_repeats):  # timed, no tracing; the two generators in turn
            for name in seconds:
                path = Path(tmp) / f"timed_{name}_{repeat}.h5"
                rng = (np.random.default_rng(1 + repeat) if name == "PCG64"
                       else mechanisms.make_randomness().generator())  # what an unseeded export draws from
                started = time.process_time()
                seconds[name].append(export_path(path, rng))
                cpu[name].append(time.process_time() - started)
                size = path.stat().st_size
                path.unlink()
        total, secure_total = (float(np.median(seconds[name])) for name in ("PCG64", secure_name))
        cpu_ratio = float(np.median(cpu["PCG64"]) / np.median(cpu[secure_name]))
        tracemalloc.start()  # the same path again, for its peak of Python/numpy allocations
        export_path(Path(tmp) / "client_001.h5", np.random.default_rng(2))
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        rng = np.random.default_rng(3)  # per-stage breakdown of the same work, in RELEASE_ROWS steps
        with ClientFileWriter(Path(tmp) / "client_002.h5", meta, {"train": args.rows, "test": 0}) as writer:
            start = 0
            for features, labels in batches():
                parts = []
                for offset in range(0, len(features), RELEASE_ROWS):
                    t0 = time.perf_counter()
                    bits = pipeline.encoding.encode(features[offset:offset + RELEASE_ROWS])
                    t1 = time.perf_counter()
                    noisy = mech.randomize(bits, rng=rng)
                    t2 = time.perf_counter()
                    parts.append(mechanisms.pack_bits(noisy))
                    t3 = time.perf_counter()
                    for key, a, b in (("encode", t0, t1), ("randomize", t1, t2), ("pack", t2, t3)):
                        stages[key] += b - a
                t3 = time.perf_counter()
                packed = np.concatenate(parts)
                writer.write_rows("train", start, packed, labels)
                stages["write"] += time.perf_counter() - t3
                start += len(packed)
            writer.commit()
    return {"rows": args.rows, "seconds": total, "rows_per_s": args.rows / total,
            "secure_generator": secure_name, "secure_seconds": secure_total,
            "secure_rows_per_s": args.rows / secure_total, "all_seconds": seconds, "all_cpu_seconds": cpu,
            "secure_over_pcg64_cpu": cpu_ratio,
            "bits_per_s": args.rows * R * 10 / total, "stage_seconds": stages, "file_mib": size / MIB,
            "tracemalloc_peak_mib": peak / MIB, "rss_mib": rss_mib(), "release_rows": RELEASE_ROWS}


def _reference_bits(value: float) -> str:
    """The reference code's encoding of one value: sign + m + n bits of round(x·2^n), as a string."""
    scaled = round(value * 2 ** PAPER["fraction_bits"])
    width = PAPER["integer_bits"] + PAPER["fraction_bits"]
    return ("1" if scaled < 0 else "0") + format(abs(scaled), f"0{width}b")[:width]


def phase_float64(args: argparse.Namespace) -> dict:
    import math

    pool = np.load(args.pool_file)
    tracemalloc.start()
    everything = np.empty((args.rows, R), dtype=np.float64)  # the reference holds all features as float64
    for begin in range(0, args.rows, len(pool)):
        count = min(len(pool), args.rows - begin)
        everything[begin:begin + count] = pool[:count]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # The reference's per-bit randomizer (eq. 17 with its s = r·l/2), timed on a few rows.
    sensitivity = R * 10 / 2
    keep_even, keep_odd = PAPER["alpha"] / (1 + PAPER["alpha"]), 1 / (1 + PAPER["alpha"] ** 3)
    a_e = PAPER["alpha"] * math.exp(PAPER["epsilon"] / sensitivity)
    keep_zero = a_e / (a_e + 1)
    generator = random.Random(2)
    start = time.perf_counter()
    out_rows = []
    for row in everything[: args.reference_rows]:
        bits = [float(b) for b in "".join(_reference_bits(float(v)) for v in row)]
        out = []
        for i, bit in enumerate(bits):
            if bit == 1:
                out.append(1 if generator.random() < (keep_even if i % 2 == 0 else keep_odd) else 0)
            else:
                out.append(0 if generator.random() < keep_zero else 1)
        out_rows.append(np.array(out))  # int64 per bit, as in the reference
    reference_s = time.perf_counter() - start
    return {"rows": args.rows, "float64_array_mib": everything.nbytes / MIB, "tracemalloc_peak_mib": peak / MIB,
            "rss_mib": rss_mib(), "reference_rows": args.reference_rows,
            "reference_rows_per_s": args.reference_rows / reference_s,
            "reference_int64_bits_mib_for_all_rows": args.rows * R * 10 * 8 / MIB}


PHASES = {"cnn": phase_cnn, "stream": phase_stream, "float64": phase_float64}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=70_000, help="rows streamed / held (full pooled FMNIST)")
    parser.add_argument("--train-batches", type=int, default=300)
    parser.add_argument("--predict-rows", type=int, default=10_000)
    parser.add_argument("--pool", type=int, default=4096, help="real CNN feature rows reused by later phases")
    parser.add_argument("--reference-rows", type=int, default=20)
    parser.add_argument("--stream-repeats", type=int, default=3, help="timed stream passes per generator")
    parser.add_argument("--tmp", default=None, help="directory for the temporary HDF5 file")
    parser.add_argument("--phase", choices=sorted(PHASES), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--pool-file", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        print(json.dumps(PHASES[args.phase](args)))
        return
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        pool_file = str(Path(tmp) / "pool.npy")
        for phase in ("cnn", "stream", "float64"):
            command = [sys.executable, __file__, "--phase", phase, "--pool-file", pool_file, *sys.argv[1:]]
            done = subprocess.run(command, capture_output=True, text=True, check=False,
                                  env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
            if done.returncode != 0:
                sys.exit(f"phase {phase} failed:\n{done.stderr[-3000:]}")
            results[phase] = json.loads(done.stdout.strip().splitlines()[-1])
    cnn, stream, ref = results["cnn"], results["stream"], results["float64"]
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}, numpy {np.__version__}; load average at the end {load}")
    print(f"CNN (Fig. 4, 28x28x1): train {cnn['train_samples_per_s']:.0f} samples/s ({cnn['train_samples']} samples),"
          f" predict {cnn['predict_samples_per_s']:.0f} samples/s ({cnn['predict_samples']} samples); "
          f"flatten features in [{cnn['feature_min']:.3g}, {cnn['feature_max']:.3g}], mean {cnn['feature_mean']:.3g}")
    stages = ", ".join(f"{k} {v:.2f} s" for k, v in stream["stage_seconds"].items())
    print(f"encode+randomize+pack+write (UER, r=1152, m=4, n=5): {stream['rows']} rows in {stream['seconds']:.2f} s "
          f"= {stream['rows_per_s']:.0f} rows/s ({stream['bits_per_s'] / 1e6:.0f} Mbit/s; {stages}); "
          f"file {stream['file_mib']:.0f} MiB")
    secure_ratio = stream["secure_rows_per_s"] / stream["rows_per_s"]
    print(f"the same with {stream['secure_generator']} (an unseeded export): {stream['secure_rows_per_s']:.0f} rows/s "
          f"= {secure_ratio:.2f} x PCG64 (medians of wall time), {stream['secure_over_pcg64_cpu']:.2f} x (medians of "
          "CPU time) (target >= 0.7); wall / CPU seconds per pass: "
          + "; ".join(f"{k} " + ", ".join(f"{v:.2f}/{c:.2f}" for v, c in zip(vs, stream["all_cpu_seconds"][k],
                                                                           strict=True))
                      for k, vs in stream["all_seconds"].items()))
    print(f"memory, streaming: tracemalloc peak {stream['tracemalloc_peak_mib']:.1f} MiB, process peak RSS "
          f"{stream['rss_mib']:.0f} MiB")
    print(f"memory, reference (all {ref['rows']} x {R} features as float64): array {ref['float64_array_mib']:.0f} MiB,"
          f" tracemalloc peak {ref['tracemalloc_peak_mib']:.0f} MiB, process peak RSS {ref['rss_mib']:.0f} MiB; its "
          f"int64-per-bit output would take {ref['reference_int64_bits_mib_for_all_rows']:.0f} MiB")
    print(f"reference per-bit Python randomizer: {ref['reference_rows_per_s']:.2f} rows/s "
          f"({ref['reference_rows']} rows timed)")
    print(f"export_rows_per_s={stream['rows_per_s']:.0f} train_samples_per_s={cnn['train_samples_per_s']:.0f} "
          f"predict_samples_per_s={cnn['predict_samples_per_s']:.0f} "
          f"stream_peak_mib={stream['tracemalloc_peak_mib']:.1f} float64_peak_mib={ref['tracemalloc_peak_mib']:.0f} "
          f"reference_rows_per_s={ref['reference_rows_per_s']:.2f} "
          f"secure_export_rows_per_s={stream['secure_rows_per_s']:.0f} secure_over_pcg64={secure_ratio:.3f} "
          f"secure_over_pcg64_cpu={stream['secure_over_pcg64_cpu']:.3f}")


if __name__ == "__main__":
    main()
