"""Writers of small client files and run directories for the inspect tests.

Files go through ``ldpfl.contract.client_writer.write_client_file`` and ``write_manifest``; their bits are
real fixed-point encodings of skewed synthetic activations, randomized by real mechanisms, so the
densities that inspect reports are meaningful. The corrupters below make the bad files.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ldpfl import mechanisms as mech
from ldpfl.contract.client_writer import write_client_file
from ldpfl.contract.layout import client_file_name
from ldpfl.contract.manifest import FileRecord, record_for, write_manifest
from ldpfl.contract.schema import ClientMetadata, label_histogram
from ldpfl.mechanisms import FLOAT32, PACKED_BITS

NUM_CLASSES = 4
FEATURES = 12  # r; with m = 4, n = 5 (l = 10) a record has 120 bits = 15 packed bytes
ROWS = (240, 80)  # train, test
UER_PARAMS = {"epsilon": 0.5, "alpha": 10.0, "integer_bits": 4, "fraction_bits": 5, "features": FEATURES}
PDPM_PARAMS = {"epsilon": 1.0, "dim": FEATURES, "safe_range_length": 2.0, "center": 0.5}


def activations(rng: np.random.Generator, rows: int, features: int = FEATURES) -> np.ndarray:
    """ReLU-like float32 features with a few negatives; each feature has its own scale, so every digit
    position of the encoding has its own density."""
    scale = np.linspace(0.1, 9.0, features)
    x = rng.gamma(2.0, 0.5, size=(rows, features)) * scale - 0.15
    return x.astype(np.float32)


def make_mechanism(name: str, params: dict[str, Any] | None = None) -> Any:
    if params is None:
        params = {"uer": UER_PARAMS, "pdpm": PDPM_PARAMS}.get(name, {})
        if mech.mechanism_class(name).DOMAIN == "bits" and name != "uer":
            params = {"epsilon": 0.5, "features": FEATURES}
    return mech.create_mechanism(name, **params)


def write_client(path: Path, *, mechanism: str = "uer", params: dict[str, Any] | None = None, client_index: int = 0,
                 client_count: int = 3, rows: tuple[int, int] = ROWS, store_density: bool = False, seed: int = 0,
                 feature_format: str | None = None, bits_from: str | None = None,
                 privacy_report: dict[str, Any] | None = None) -> FileRecord:
    """Write one client file; return its manifest record.

    ``bits_from`` names a different mechanism to randomize with than the one the attributes state
    (a mislabelled file); ``privacy_report`` replaces the stored report (a tampered one).
    """
    rng = np.random.default_rng(seed)
    m = make_mechanism(mechanism, params)
    if feature_format is None:
        feature_format = FLOAT32 if m.DOMAIN == "real" else PACKED_BITS
    encoding = mech.FixedPointEncoding(4, 5)
    x = activations(rng, sum(rows))
    p = np.full(NUM_CLASSES, 0.5 / (NUM_CLASSES - 1))
    p[client_index % NUM_CLASSES] = 0.5  # a dominant class per client
    labels = rng.choice(NUM_CLASSES, size=sum(rows), p=p).astype(np.int32)
    density = None
    if feature_format == PACKED_BITS:
        bits = encoding.encode(x)
        density = bits[:rows[0]].mean(axis=0, dtype=np.float64)  # as ldpfl export: the train split only
        randomizer = m if bits_from is None else make_mechanism(bits_from)
        out = mech.pack_bits(randomizer.randomize(bits, rng=rng))
    else:
        out = m.randomize(x, rng=rng).astype(np.float32)
    splits = {"train": (out[:rows[0]], labels[:rows[0]]), "test": (out[rows[0]:], labels[rows[0]:])}
    parameters = m.parameters()
    if feature_format == PACKED_BITS and "integer_bits" not in parameters:  # as ldpfl export records `none`
        parameters.update(integer_bits=encoding.integer_bits, fraction_bits=encoding.fraction_bits)
    metadata = ClientMetadata(
        dataset="synthetic", num_classes=NUM_CLASSES, client_index=client_index, client_count=client_count,
        partition={"scheme": "dominant-class", "share": 0.5}, extractor="synthetic-activations",
        input_shape=(28, 28, 1), integer_bits=4, fraction_bits=5, features=FEATURES,
        feature_format=feature_format, mechanism=mechanism, mechanism_parameters=parameters,
        privacy_report=privacy_report or m.report().with_randomness("seeded").to_dict(), randomness="seeded",
        label_histograms={s: label_histogram(y, NUM_CLASSES) for s, (_, y) in splits.items()},
        local_accuracy=0.9 + 0.01 * client_index, package_version="test",
    )
    digest = write_client_file(path, metadata, splits,
                               input_bit_density=density if store_density and density is not None else None)
    return record_for(path, client_index, digest, {s: len(y) for s, (_, y) in splits.items()})


def write_run(run_dir: Path, *, mechanism: str = "uer", clients: int = 3, store_density: bool = False,
              seed: int = 0, **kwargs: Any) -> list[FileRecord]:
    """A run directory of ``clients`` files and its manifest."""
    run_dir.mkdir(parents=True, exist_ok=True)
    records = [write_client(run_dir / client_file_name(i), mechanism=mechanism, client_index=i, client_count=clients,
                            store_density=store_density, seed=seed + i, **kwargs) for i in range(clients)]
    write_manifest(run_dir, records, {"dataset": "synthetic", "mechanism": mechanism})
    return records


def write_metrics(run_dir: Path, accuracies: list[float]) -> Path:
    """``federation/metrics.json`` as stage 2 writes it."""
    path = run_dir / "federation" / "metrics.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    rounds = [{"round": i + 1, "test_accuracy": a, "test_loss": 1.0 - a, "train_loss": 1.1 - a}
              for i, a in enumerate(accuracies)]
    path.write_text(json.dumps({"config": {}, "privacy": [], "rounds": rounds}))
    return path


# ----------------------------------------------------------------------------------------------------
# Corrupters. Each returns the path of the bad file.


def truncated_copy(source: Path, target: Path, keep: float = 0.6) -> Path:
    data = source.read_bytes()
    target.write_bytes(data[:int(len(data) * keep)])
    return target


def flip_data_bytes(source: Path, target: Path, dataset: str = "train/features", count: int = 3) -> Path:
    """Copy ``source`` and invert ``count`` single bytes inside the first stored chunk of ``dataset``.

    One inverted byte changes one 16-bit word by a non-zero amount below 65535, which Fletcher-32 always
    detects (inverting both bytes of a zero word would not be).
    """
    shutil.copyfile(source, target)
    with h5py.File(target, "r") as handle:
        info = handle[dataset].id.get_chunk_info(0)
    with open(target, "r+b") as f:
        for k in range(count):
            offset = info.byte_offset + (k + 1) * info.size // (count + 2)
            f.seek(offset)
            byte = f.read(1)[0]
            f.seek(offset)
            f.write(bytes([byte ^ 0xFF]))
    return target


def foreign_hdf5(target: Path) -> Path:
    """A plain HDF5 file without the schema attributes."""
    with h5py.File(target, "w") as handle:
        handle.create_dataset("data", data=np.arange(10))
        handle.attrs["title"] = "not ldpfl"
    return target


def non_hdf5(target: Path) -> Path:
    target.write_text("client_index,features\n0,1 0 1\n")
    return target


def _crafted(source: Path, target: Path, replace: str, make) -> Path:
    """Copy every object of ``source`` except dataset ``replace``, which ``make(group, name, like)`` creates."""
    with h5py.File(source, "r") as src, h5py.File(target, "w", libver="latest") as dst:
        for key, value in src.attrs.items():
            dst.attrs[key] = value
        for split in src:
            group = dst.create_group(split)
            for name, dset in src[split].items():
                if f"{split}/{name}" == replace:
                    make(group, name, dset)
                else:
                    group.create_dataset(name, data=dset[()], fletcher32=True)
    return target


def external_storage(source: Path, target: Path) -> Path:
    """``train/features`` stored in a raw file next to ``target`` (HDF5 external storage)."""
    raw = target.with_suffix(".raw")

    def make(group: h5py.Group, name: str, like: h5py.Dataset) -> None:
        raw.write_bytes(like[()].tobytes())
        group.create_dataset(name, shape=like.shape, dtype=like.dtype, external=[(raw.name, 0, like[()].nbytes)])

    return _crafted(source, target, "train/features", make)


def huge_shape(source: Path, target: Path, rows: int = 10**9) -> Path:
    """``train`` declares ``rows`` rows (chunked, nothing written): reading it would take gigabytes."""

    def make(group: h5py.Group, name: str, like: h5py.Dataset) -> None:
        shape = (rows, *like.shape[1:])
        group.create_dataset(name, shape=shape, dtype=like.dtype, chunks=(1024, *like.shape[1:]), fletcher32=True)

    _crafted(source, target, "train/features", make)
    with h5py.File(target, "r+") as handle:
        del handle["train/labels"]
        handle["train"].create_dataset("labels", shape=(rows,), dtype=np.int32, chunks=(4096,), fletcher32=True)
    return target
