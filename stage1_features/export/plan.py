"""The export's plan: everything decided before any client runs (no TensorFlow needed).

The dataset is loaded, the extractor and its flatten width r fixed, the mechanism resolved once into a
``MechanismSpec`` and its privacy report made; the partition of the pool among the clients (IV-B) is
drawn from the root stream.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from ldpfl import mechanisms
from ldpfl.common.errors import ParameterError
from ldpfl.contract.file_checks import float32_overflow
from ldpfl.contract.label_release import CLEAR_LABELS, SYNTHETIC_LABELS, LabelRelease
from ldpfl.contract.release_point import STATS
from ldpfl.mechanisms.randomness import SEEDED
from ldpfl.mechanisms.report import format_epsilon
from ldpfl.stage1_features.export import from_models, silo
from ldpfl.stage1_features.export.config import COMPARED_FIELDS, ExportConfig
from ldpfl.stage1_features.export.partition import make_partition
from ldpfl.stage1_features.export.release import (
    ReleasePoint,
    StoredLayout,
    local_layout,
    noise_variance,
    parse_release,
    release_notes,
    stored_layout,
)
from ldpfl.stage1_features.export.silo import silo_partition
from ldpfl.stage1_features.models import cnn
from ldpfl.stage1_features.models.dp_training import check_dp_extractor
from ldpfl.stage1_features.models.keras_backend import SEEDED_THREADS

OPTIONAL_COMPARED = {"release": "flatten", "from_models": None, "keep_clean_test": False, "noise_aware": False,
                     "label_epsilon": None, "local_only": False,
                     "cnn_epsilon": None, "cnn_delta": None}
"""Config fields compared on resume only when they differ from these defaults (runs exported before they
existed have fingerprints without them, and keep resuming)."""


@dataclass(frozen=True)
class ExportPlan:
    """A validated export: config, dataset, release and width, mechanism spec, privacy report, layout, source.

    ``layout`` says how the files store the release; ``source`` is the earlier run of ``from_models``.
    ``features`` is the values per record of the release: r (flatten), K (bottleneck:K) or k (scores, label).
    ``label_release`` is how the files release their labels (``ldpfl.contract.label_release``).
    ``extractor_options`` are a weight-free extractor's options (``scatter``: ``scatter_j``, ``scatter_l``).
    """

    config: ExportConfig
    dataset: Any  # stage1_features.datasets.Dataset
    extractor: str
    features: int
    spec: mechanisms.MechanismSpec
    randomness: mechanisms.Randomness
    privacy: mechanisms.PrivacyReport
    release: ReleasePoint = ReleasePoint("flatten")
    layout: StoredLayout | None = None
    source: Any = None  # stage1_features.export.from_models.SourceRun with ``from_models``
    label_release: LabelRelease = CLEAR_LABELS
    extractor_options: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        """Fill in the stored layout of the release (flatten: as the mechanism says)."""
        if self.layout is None:
            object.__setattr__(self, "layout", stored_layout(self.release, self.spec))

    @property
    def feature_width(self) -> int:
        """Return the model's input width: r·l bits (packed) or the values per record (float32)."""
        assert self.layout is not None
        if self.layout.feature_format != mechanisms.PACKED_BITS:
            return self.features
        width = self.spec.feature_width
        assert width is not None  # the spec is resolved with r
        return width

    @property
    def uses_keras(self) -> bool:
        """Return whether the clients train or run a Keras CNN (a CNN extractor, ``from_models``' CNNs, DP-SGD)."""
        return cnn.is_cnn(self.extractor) or self.source is not None or self.config.dp_budget() is not None

    @property
    def seeded_threads(self) -> int | None:
        """Return the CPU threads a seed fixes for each client's CNN on every executor, or None (issue 40).

        ``SEEDED_THREADS`` in a seeded run that uses Keras; None without a seed (each executor's fastest
        count) or without a CNN (nothing rounds with the thread count).
        """
        if self.uses_keras and self.randomness.mode == SEEDED:
            return SEEDED_THREADS
        return None

    @property
    def feature_format(self) -> str:
        """Return how the files store the release (``packed-bits`` or ``float32``)."""
        assert self.layout is not None
        return self.layout.feature_format

    def fingerprint(self) -> dict[str, Any]:
        """Return the resolved values that a resumed run must share (``COMPARED_FIELDS``), JSON-normalized."""
        public = self.config.public_dict()
        values = {key: public.get(key) for key in COMPARED_FIELDS}
        values.update(extractor=self.extractor, mechanism_params=self.spec.recorded_parameters(),
                      randomness=self.randomness.mode)
        values.update({key: public.get(key) for key, default in OPTIONAL_COMPARED.items()
                       if public.get(key) != default})
        if not cnn.is_cnn(self.extractor):  # no CNN is trained: the training settings change nothing
            values.update(epochs=None, batch_size=None, augment=None)
        if self.extractor_options:  # scatter's J and L (runs of other extractors keep their fingerprints)
            values["extractor_options"] = dict(self.extractor_options)
        return json.loads(json.dumps(values, sort_keys=True, default=str))


def make_plan(config: ExportConfig) -> ExportPlan:
    """Validate ``config``, load the dataset, fix r and resolve the mechanism. Raises ``ValueError``."""
    randomness = mechanisms.make_randomness(config.seed)
    # Fail fast on mechanism parameters before the (possibly slow) dataset load; r is not known yet.
    config.mechanism_spec(2)
    source = None
    if config.from_models is not None:  # the records, models and settings of an earlier run (issue 15 item 2)

        source = from_models.read_source_run(config.from_models)
        config = from_models.adopt_source_settings(config, source)
        from_models.check_release_fits(source, config.release)
        from_models.check_models(source, config.exported_clients())
    dataset = silo.load_export_data(config.dataset, config.data_dir, config.data, config.data_options,
                                    None if config.plan is None else config.plan.classes)  # own data: issue 16
    dp = config.dp_budget() is not None
    extractor = silo.resolve_extractor(config.extractor, dataset, config.data is not None, dp=dp)
    if dp and source is None:  # DP-SGD (issue 22): a CNN without batch-mixing layers, refused before any write

        check_dp_extractor(extractor, tuple(dataset.input_shape), dataset.num_classes)
    config.check_extractor_options(extractor)
    options = config.extractor_options(extractor)
    r = cnn.flatten_width(extractor, tuple(dataset.input_shape), options)
    point = parse_release(config.release)
    if point.kind == STATS and cnn.is_cnn(extractor):  # issue 40: the weights would be a function of the records
        raise ParameterError(f"`release` {point} needs an extractor no record trained (scatter, or none on tables): "
                             f"`extractor` {extractor!r} is trained on the silo's records")
    if not point.is_flatten and point.kind != STATS and not cnn.is_cnn(extractor):
        raise ParameterError(f"`release` {point} is a layer of the client CNN; `extractor` {extractor!r} trains "
                             "none (use mnist-cnn or cifar-cnn)")
    if point.units is not None and point.units > r:
        raise ParameterError(f"`release` {point}: K = {point.units} exceeds the flatten width r = {r} of "
                             f"{extractor!r} on {dataset.name}")
    width = point.width(r, dataset.num_classes)
    if cnn.is_cnn(extractor) and dataset.num_classes < 2:
        raise ValueError(f"dataset {dataset.name!r} has {dataset.num_classes} class; a CNN needs >= 2")
    if config.limit is not None and config.limit > len(dataset):
        raise ValueError(f"limit must be in [1, {len(dataset)}] (the pooled size of {dataset.name}), "
                         f"got {config.limit}")
    spec = config.mechanism_spec(width)
    if config.noise_aware:
        noise_variance(spec)  # refuses a mechanism without a noise variance to train against
    overflow = None if spec.encodes_bits else float32_overflow(spec.build().noise_scale())
    if overflow is not None:  # every released value would be ±inf (issue 13: refused, nothing written)
        raise ParameterError(f"mechanism {spec.name!r} with `epsilon` {spec.parameters.get('epsilon')}: {overflow}; "
                             "choose a larger `epsilon`")
    if config.store_input_density and not spec.encodes_bits:
        raise ParameterError(f"`store_input_density` applies to bit encodings only; mechanism {config.mechanism!r} "
                             "writes float32 features")
    if config.plan is not None:  # the shared plan of separate silos (issue 16): refuse what contradicts it
        silo.require_plan(config.plan, "the plan", dataset=dataset, extractor=extractor, features=width, spec=spec,
                          release=config.release, extractor_options=options)
    planned_labels = None if config.plan is None else config.plan.label_epsilon
    if config.plan is not None and config.label_epsilon != planned_labels:
        raise ParameterError(f"`label_epsilon` = {config.label_epsilon} contradicts the plan ({planned_labels})")
    privacy = spec.report().with_randomness(randomness.mode, randomness.generator_name)
    notes = release_notes(point, dataset.num_classes)
    labels = (SYNTHETIC_LABELS if point.kind == STATS
              else LabelRelease.for_epsilon(config.label_epsilon, dataset.num_classes))
    if not labels.clear and not labels.synthetic:  # issue 22 item 2: k-RR of each label, its own stream
        notes = (*notes, label_note(privacy.exact_epsilon_per_record, labels, point))
    if notes:
        privacy = dataclasses.replace(privacy, notes=(*privacy.notes, *notes))
    layout = local_layout() if config.local_only else None  # clean float32 features, never shared
    return ExportPlan(config, dataset, extractor, width, spec, randomness, privacy, point, layout=layout,
                      source=source, label_release=labels, extractor_options=options)


def label_note(feature_epsilon: float | None, labels: LabelRelease, point: ReleasePoint) -> str:
    """Return the note of a report whose labels are randomized: the label's ε and the per-record sum."""
    what = "the predicted class (k-RR) and the label" if point.kind == "label" else "the features and the label"
    total = labels.composed_epsilon(float("inf") if feature_epsilon is None else feature_epsilon)["epsilon"]
    assert labels.p_keep is not None
    return (f"labels: k-RR over {labels.num_classes} classes, exact epsilon {labels.epsilon:.6g} per record "
            f"(p_keep {labels.p_keep:.6g}); each record releases {what}: their epsilons add, "
            f"{total:.6g} per record")


def make_client_partition(plan: ExportPlan) -> tuple[list[np.ndarray], dict[str, Any]]:
    """IV-B: return the clients' rows in the pool (root stream) and the ``partition`` attribute describing them."""
    config, dataset = plan.config, plan.dataset
    rng = plan.randomness.generator()  # the root stream; the clients use its children
    if config.client_index is not None:  # single-silo mode: the whole input is this silo's (issue 16)

        clients, described = silo_partition(dataset.y, config.client_index, config.clients, rng, config.limit)
        return clients, described | {"test_fraction": config.test_fraction}
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
        return format_epsilon(value, digits=6, infinite="inf (NOT private)")

    return (f"nominal ε = {fmt(report.get('nominal_epsilon'))}; "
            f"exact ε = {fmt(report.get('exact_epsilon_per_record'))} "
            f"per {report.get('record', 'record')} ({fmt(report.get('exact_epsilon_per_coordinate'))} per "
            f"{report.get('coordinate', 'coordinate')})")
