"""Issue 13: a fuzz test over the client-file reader.

A few hundred files, each a valid client file with one to three random mutations: attributes replaced by
values of random types (numbers, strings, bytes, arrays, nested JSON, JSON that is not an object, deep
nesting), datasets replaced by others of random shapes, dtypes, filters and declared sizes (up to
terabytes, chunks never written), objects removed or added, soft and external links, truncated or
flipped bytes. Reading each (``read_client_file`` and the validator's ``check_client_file`` with every
chunk read) must either give a clean ``FormatError`` or a valid read, within 2 s and without a large
allocation (tracemalloc sees numpy's buffers). Fixed seed.
"""

from __future__ import annotations

import json
import time
import tracemalloc
from pathlib import Path

import h5py
import numpy as np
import pytest

from ldpfl import mechanisms as mech
from ldpfl.contract.client_reader import read_client_file
from ldpfl.contract.client_writer import write_client_file
from ldpfl.contract.run_dir import check_client_file
from ldpfl.contract.schema import ClientMetadata, FormatError, label_histogram

SEED = 20240613
FILES = 300
SECONDS_PER_FILE = 2.0
PEAK_BYTES = 64 * 2**20
ATTRIBUTES = ("schema", "schema_version", "dataset", "num_classes", "client_index", "client_count", "partition",
              "extractor", "input_shape", "integer_bits", "fraction_bits", "features", "feature_format",
              "mechanism", "mechanism_parameters", "privacy_report", "randomness", "label_histograms",
              "local_accuracy", "package_version", "created_utc", "private", "nominal_epsilon")
JSON_ATTRIBUTES = ("partition", "mechanism_parameters", "privacy_report", "label_histograms")
DATASETS = ("train/features", "train/labels", "test/features", "test/labels")


def valid_file(path: Path, rng: np.random.Generator, packed: bool) -> None:
    r, rows = int(rng.integers(1, 12)), int(rng.integers(0, 20))
    encoding = mech.FixedPointEncoding(2, 3)
    splits = {}
    for split, count in (("train", rows), ("test", rows // 2)):
        values = rng.normal(size=(count, r)).astype(np.float32)
        labels = rng.integers(0, 3, size=count)
        splits[split] = (mech.pack_bits(encoding.encode(values)) if packed else values, labels)
    spec = mech.MechanismSpec.resolve("uer", {"epsilon": 1.0, "integer_bits": 2, "fraction_bits": 3}, features=r) \
        if packed else mech.MechanismSpec.resolve("pdpm", {"epsilon": 1.0}, features=r)
    metadata = ClientMetadata(
        dataset="fuzz", num_classes=3, client_index=0, client_count=1, partition={"kind": "fuzz"},
        extractor="none", input_shape=(r,), integer_bits=spec.integer_bits, fraction_bits=spec.fraction_bits,
        features=r, feature_format=spec.feature_format, mechanism=spec.name,
        mechanism_parameters=spec.recorded_parameters(), privacy_report=spec.report().to_dict(), randomness="seeded",
        label_histograms={s: label_histogram(splits[s][1], 3) for s in splits})
    write_client_file(path, metadata, splits)


def random_json(rng: np.random.Generator, depth: int = 0) -> object:
    kind = int(rng.integers(0, 9 if depth < 4 else 6))
    if kind == 0:
        return None
    if kind == 1:
        return bool(rng.integers(0, 2))
    if kind == 2:
        return int(rng.integers(-2**62, 2**62)) * int(rng.choice([1, 10**30]))
    if kind == 3:
        return float(rng.choice([0.0, -1.0, 1e308, 1e-308, rng.normal()]))
    if kind == 4:
        return str(rng.choice(["", "inf", "nan", "x" * int(rng.integers(0, 100)), "é", "\x00"]))
    if kind == 5:
        return []
    if kind == 6:
        return [random_json(rng, depth + 1) for _ in range(int(rng.integers(0, 4)))]
    keys = ["epsilon", "nominal_epsilon", "mechanism", "private", "train", "test", "kind", "x"]
    return {str(rng.choice(keys)): random_json(rng, depth + 1) for _ in range(int(rng.integers(0, 4)))}


def random_json_text(rng: np.random.Generator) -> str:
    kind = int(rng.integers(0, 6))
    if kind == 0:
        return "[" * int(rng.choice([100, 10_000, 100_000]))  # RecursionError in a naive parser
    if kind == 1:
        return "{" + '"a":' * 0 + "not json"
    if kind == 2:
        return json.dumps([random_json(rng) for _ in range(3)])  # a list, not an object
    if kind == 3:
        return "NaN" if rng.integers(0, 2) else "1e999"
    if kind == 4:
        return json.dumps({"a": [[[[[[1]]]]]] * 10})
    return json.dumps(random_json(rng))


def random_value(rng: np.random.Generator) -> object:
    values: list[object] = [
        np.int64(rng.integers(-5, 5)), np.float64(rng.choice([np.nan, np.inf, -1.0, 1e300, 0.5])), "abc", b"\xff\xfe",
        np.arange(int(rng.integers(0, 5)), dtype=np.int64), np.array(["a", "b"], dtype=h5py.string_dtype()),
        np.int64(2**62), np.bool_(True), random_json_text(rng), np.zeros((2, 2), dtype=np.float32),
        np.array([1.5], dtype=np.float16), np.uint64(2**64 - 1), np.array([], dtype=np.float64), "ldpfl-features",
        h5py.Empty("f"), np.array([2, 2], dtype=np.int64), np.array([[1]], dtype=np.int32), np.float64(2.0),
    ]
    return values[int(rng.integers(0, len(values)))]


def mutate_attribute(handle: h5py.File, rng: np.random.Generator) -> None:
    name = str(rng.choice(ATTRIBUTES))
    if rng.random() < 0.15:
        del handle.attrs[name]
    elif name in JSON_ATTRIBUTES and rng.random() < 0.7:
        handle.attrs[name] = random_json_text(rng)
    else:
        handle.attrs[name] = random_value(rng)


def mutate_dataset(handle: h5py.File, rng: np.random.Generator) -> None:
    name = str(rng.choice(DATASETS))
    old = handle[name]
    if old.size * old.dtype.itemsize > 2**20:  # an earlier mutation declared a huge one: stay small here
        old = np.zeros((3, 2) if name.endswith("features") else (3,), dtype=np.uint8)
    rows = old.shape[0] if old.ndim else 1
    del handle[name]
    kind = int(rng.integers(0, 8))
    dtype = np.dtype(str(rng.choice(["uint8", "float32", "float64", "int64", "int8", "bool", "uint64"])))
    if kind == 0:  # huge declared shape, chunks never written
        shape = (int(rng.choice([50_000, 10**6, 40 * 10**6, 2**40])), int(rng.choice([1, 2, 1_250_000])))
        handle.create_dataset(name, shape=shape[:1] if name.endswith("labels") else shape, dtype=dtype,
                              chunks=True, fletcher32=bool(rng.integers(0, 2)))
    elif kind == 1:  # random small shape and dtype, with data
        ndim = int(rng.integers(0, 4))
        shape = tuple(int(s) for s in rng.integers(0, 6, size=ndim))
        handle.create_dataset(name, data=rng.integers(0, 255, size=shape).astype(dtype))
    elif kind == 2:  # a string or variable-length dataset
        handle.create_dataset(name, data=np.array(["a"] * rows, dtype=h5py.string_dtype()))
    elif kind == 3:  # compressed: a filter other than Fletcher-32
        handle.create_dataset(name, data=np.zeros((rows, *old.shape[1:]), dtype=old.dtype), compression="gzip")
    elif kind == 4:  # the right shape and dtype without a checksum
        handle.create_dataset(name, data=np.zeros(old.shape, dtype=old.dtype))
    elif kind == 5:  # labels out of range
        handle.create_dataset(name, data=np.full(old.shape, -7 if rng.random() < 0.5 else 99, dtype=old.dtype),
                              fletcher32=True, chunks=True if old.ndim and old.size else None)
    elif kind == 6:  # a group where a dataset should be
        handle.create_group(name)
    else:  # a compound dtype
        handle.create_dataset(name, shape=(rows,), dtype=np.dtype([("a", "i4"), ("b", "f8")]))


def mutate_structure(handle: h5py.File, path: Path, rng: np.random.Generator) -> None:
    kind = int(rng.integers(0, 6))
    if kind == 0:
        del handle[str(rng.choice(["train", "test"]))]
    elif kind == 1:
        handle.create_group("extra")
    elif kind == 2:
        handle["test"]["link"] = h5py.SoftLink("/train/features")
    elif kind == 3:
        del handle["train/features"]
        handle["train/features"] = h5py.ExternalLink(str(path.with_name("elsewhere.h5")), "/x")
    elif kind == 4:
        handle.require_group("stats").create_dataset("input_bit_density", shape=(10**9,), dtype="f4", chunks=True)
    else:
        handle.require_group("stats").create_dataset("other", data=[1, 2, 3])


def corrupt_bytes(path: Path, rng: np.random.Generator) -> None:
    data = bytearray(path.read_bytes())
    if rng.random() < 0.5:
        data = data[: int(rng.integers(0, len(data)))]
    else:
        for position in rng.integers(0, len(data), size=int(rng.integers(1, 20))):
            data[int(position)] ^= int(rng.integers(1, 256))
    path.write_bytes(bytes(data))


def make_file(path: Path, rng: np.random.Generator) -> None:
    valid_file(path, rng, packed=bool(rng.integers(0, 2)))
    mutations = int(rng.integers(0, 4))  # 0: the valid file itself
    with h5py.File(path, "r+") as handle:
        for _ in range(mutations):
            kind = int(rng.integers(0, 10))
            try:  # a mutation that does not apply (an object already gone or present) is skipped
                if kind < 4:
                    mutate_attribute(handle, rng)
                elif kind < 7:
                    mutate_dataset(handle, rng)
                elif kind < 9:
                    mutate_structure(handle, path, rng)
            except (AttributeError, KeyError, OSError, OverflowError, TypeError, ValueError):
                pass
    if mutations and rng.random() < 0.1:
        corrupt_bytes(path, rng)


def read_bounded(path: Path) -> str:
    """Read ``path`` both ways; return the validator's 'ok' or 'error'; fail on any other exception or bound.

    The validator (``check_client_file``) also refuses contradictions a plain read does not look for
    (``ldpfl.contract.file_checks``), so it may say 'error' where the reader reads; never the other way round.
    """
    outcomes = []
    for reader in (read_client_file, lambda p: check_client_file(p, read_data=True)):
        tracemalloc.start()
        started = time.perf_counter()
        try:
            result = reader(path)
            outcomes.append("error" if getattr(result, "open_error", None) is not None else "ok")
        except FormatError as error:
            assert str(error).startswith(str(path)), error
            assert "\n" not in str(error), error
            outcomes.append("error")
        finally:
            seconds = time.perf_counter() - started
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        assert seconds < SECONDS_PER_FILE, f"{path.name}: {seconds:.1f} s"
        assert peak < PEAK_BYTES, f"{path.name}: peak {peak / 2**20:.0f} MiB"
    assert not (outcomes[0] == "error" and outcomes[1] == "ok"), path.name  # the validator is the stricter
    return outcomes[1]


@pytest.mark.filterwarnings("error")
def test_fuzzed_files_give_a_clean_error_or_a_valid_read(tmp_path) -> None:
    rng = np.random.default_rng(SEED)
    outcomes: dict[str, int] = {"ok": 0, "error": 0}
    started = time.perf_counter()
    for k in range(FILES):
        path = tmp_path / f"client_{k:03d}.h5"
        make_file(path, rng)
        outcomes[read_bounded(path)] += 1
        path.unlink()
    assert outcomes["ok"] >= FILES // 20 and outcomes["error"] >= FILES // 2, outcomes  # both kinds exercised
    assert time.perf_counter() - started < 120
