"""The export's plan: everything decided before any client runs (no TensorFlow needed).

The dataset is loaded, the extractor and its flatten width r fixed, the mechanism resolved once into a
``MechanismSpec`` and its privacy report made; the partition of the pool among the clients (IV-B) is
drawn from the root stream.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

import mechanisms
from mechanisms.base import ParameterError
from stage1_features import cnn
from stage1_features.export_config import COMPARED_FIELDS, ExportConfig


@dataclass(frozen=True)
class ExportPlan:
    """A validated export: the config, the loaded dataset, r, the mechanism spec and its privacy report."""

    config: ExportConfig
    dataset: Any  # stage1_features.datasets.Dataset
    extractor: str
    features: int
    spec: mechanisms.MechanismSpec
    randomness: mechanisms.Randomness
    privacy: mechanisms.PrivacyReport

    @property
    def feature_width(self) -> int:
        """Return the model's input width: r·l bits (packed) or r (float32)."""
        width = self.spec.feature_width
        assert width is not None  # the spec is resolved with r
        return width

    def fingerprint(self) -> dict[str, Any]:
        """Return the resolved values that a resumed run must share (``COMPARED_FIELDS``), JSON-normalized."""
        public = self.config.public_dict()
        values = {key: public.get(key) for key in COMPARED_FIELDS}
        values.update(extractor=self.extractor, mechanism_params=self.spec.recorded_parameters(),
                      randomness=self.randomness.mode)
        if not cnn.is_cnn(self.extractor):  # no CNN is trained: the training settings change nothing
            values.update(epochs=None, batch_size=None, augment=None)
        return json.loads(json.dumps(values, sort_keys=True, default=str))


def make_plan(config: ExportConfig) -> ExportPlan:
    """Validate ``config``, load the dataset, fix r and resolve the mechanism. Raises ``ValueError``."""
    from stage1_features.datasets import load_dataset

    randomness = mechanisms.make_randomness(config.seed)
    # Fail fast on mechanism parameters before the (possibly slow) dataset load; r is not known yet.
    config.mechanism_spec(1)
    dataset = load_dataset(config.dataset, config.data_dir)
    extractor = cnn.resolve_extractor(config.extractor, dataset.name)
    r = cnn.flatten_width(extractor, tuple(dataset.input_shape))
    if cnn.is_cnn(extractor) and dataset.num_classes < 2:
        raise ValueError(f"dataset {dataset.name!r} has {dataset.num_classes} class; a CNN needs >= 2")
    if config.limit is not None and config.limit > len(dataset):
        raise ValueError(f"limit must be in [1, {len(dataset)}] (the pooled size of {dataset.name}), "
                         f"got {config.limit}")
    spec = config.mechanism_spec(r)
    if config.store_input_density and not spec.encodes_bits:
        raise ParameterError(f"`store_input_density` applies to bit encodings only; mechanism {config.mechanism!r} "
                             "writes float32 features")
    privacy = spec.report().with_randomness(randomness.mode)
    return ExportPlan(config, dataset, extractor, r, spec, randomness, privacy)


def make_client_partition(plan: ExportPlan) -> tuple[list[np.ndarray], dict[str, Any]]:
    """IV-B: return the clients' rows in the pool (root stream) and the ``partition`` attribute describing them."""
    from stage1_features.partition import make_partition

    config, dataset = plan.config, plan.dataset
    rng = plan.randomness.generator()  # the root stream; the clients use its children
    pool = np.arange(len(dataset), dtype=np.int64)
    if config.limit is not None and config.limit < len(dataset):
        pool = np.sort(rng.choice(len(dataset), size=config.limit, replace=False))
    partition = make_partition(dataset.y[pool], config.clients, kind=config.partition, rng=rng,
                               max_clients=config.max_clients, beta=config.beta, unb=config.unb,
                               shards_per_client=config.shards_per_client)
    described = partition.describe() | {"test_fraction": config.test_fraction, "pooled_records": len(dataset),
                                        "limit": config.limit}
    return [pool[c] for c in partition.clients], described


def describe_privacy(privacy: mechanisms.PrivacyReport) -> str:
    """Return one line: the nominal and exact ε of a privacy report."""
    report = privacy.to_dict()

    def fmt(value: Any) -> str:
        if value is None:
            return "n/a"
        if value == "inf" or (isinstance(value, float) and math.isinf(value)):
            return "inf (NOT private)"
        return f"{float(value):.6g}"

    return (f"nominal ε = {fmt(report.get('nominal_epsilon'))}; "
            f"exact ε = {fmt(report.get('exact_epsilon_per_record'))} "
            f"per {report.get('record', 'record')} ({fmt(report.get('exact_epsilon_per_coordinate'))} per "
            f"{report.get('coordinate', 'coordinate')})")
