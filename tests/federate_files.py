"""Small synthetic export runs for the stage-2 tests, written through ``ldpfl.contract``.

Each client gets ``rows`` training and ``rows // 2`` test records of r = ``features`` values. The label
is a function of the signs of the first two values (4 classes), so the packed sign bits carry it and a
model can learn it: a federation that works reaches well above chance.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ldpfl import mechanisms as mech
from ldpfl.contract.client_writer import write_client_file
from ldpfl.contract.layout import client_file_name
from ldpfl.contract.manifest import record_for, write_manifest
from ldpfl.contract.schema import ClientMetadata, label_histogram

INTEGER_BITS = 2
FRACTION_BITS = 3  # l = 6 bits per value; r = 8 values → 48 bits = 6 bytes per record
NUM_CLASSES = 4
FLOAT_MECHANISM = "gaussian"  # named by float32 runs (their values are left unperturbed: synthetic)


def _records(rng: np.random.Generator, rows: int, features: int, noise: float) -> tuple[np.ndarray, np.ndarray]:
    values = rng.normal(0.0, 1.0, size=(rows, features)).astype(np.float32)
    labels = (values[:, 0] < 0).astype(np.int64) * 2 + (values[:, 1] < 0).astype(np.int64)
    flip = rng.random(rows) < noise
    labels[flip] = rng.integers(0, NUM_CLASSES, size=int(flip.sum()))
    return values, labels


def write_run(run_dir: str | Path, *, clients: int = 4, rows: int = 64, features: int = 8,
              feature_format: str = mech.PACKED_BITS, dataset: str = "mnist5k", seed: int = 7,
              label_noise: float = 0.05, features_of: dict[int, int] | None = None,
              class_skew: dict[int, int] | None = None) -> Path:
    """Write ``clients`` client files and a manifest into ``run_dir``; return ``run_dir``.

    ``features_of`` overrides r for some clients (to make a mismatched run); ``class_skew`` keeps only
    rows of one class for some clients ({client: class}), for label-distribution weights.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    rng = mech.default_rng(seed)
    encoding = mech.FixedPointEncoding(INTEGER_BITS, FRACTION_BITS)
    records = []
    for index in range(clients):
        r = (features_of or {}).get(index, features)
        splits = {}
        for split, count in (("train", rows), ("test", rows // 2)):
            values, labels = _records(rng, count, r, label_noise)
            if class_skew and index in class_skew:
                keep = labels == class_skew[index]
                values, labels = values[keep], labels[keep]
            if feature_format == mech.PACKED_BITS:
                stored = mech.pack_bits(encoding.encode(values))
            else:
                stored = values
            splits[split] = (stored, labels)
        # packed bits: 'none' (no randomization); float32: a float mechanism's attributes (files must be
        # consistent, the validator refuses a mechanism whose format contradicts the file's)
        spec = mech.MechanismSpec.resolve("none", {"integer_bits": INTEGER_BITS, "fraction_bits": FRACTION_BITS},
                                          features=r) if feature_format == mech.PACKED_BITS else \
            mech.MechanismSpec.resolve(FLOAT_MECHANISM, {"epsilon": 1.0}, features=r)
        metadata = ClientMetadata(
            dataset=dataset, num_classes=NUM_CLASSES, client_index=index, client_count=clients,
            partition={"kind": "synthetic"}, extractor="synthetic", input_shape=(r,),
            integer_bits=INTEGER_BITS if spec.encoding else 0, fraction_bits=FRACTION_BITS if spec.encoding else 0,
            features=r, feature_format=feature_format, mechanism=spec.name,
            mechanism_parameters=spec.recorded_parameters(), privacy_report=spec.report().to_dict(),
            randomness="seeded", generator="PCG64",
            label_histograms={s: label_histogram(splits[s][1], NUM_CLASSES) for s in splits},
        )
        path = run_dir / client_file_name(index)
        digest = write_client_file(path, metadata, splits)
        records.append(record_for(path, index, digest, {s: len(splits[s][1]) for s in splits}))
    write_manifest(run_dir, records, {"dataset": dataset, "mechanism": "none"})
    return run_dir
