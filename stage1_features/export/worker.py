"""One client of the export (LDPFL Algorithm 1 lines 2-10), in this process or in a spawned worker.

The client's stream is split with ``Generator.spawn`` into three independent streams: hold-out split,
CNN training, randomization. So its output does not depend on which process runs it or in which order,
and the randomization draws do not depend on how much randomness the training consumed. Private labels
(``label_release`` krr, issue 22) draw from a child of the randomization stream, so the features' draws
are the same with clear or randomized labels.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ldpfl import mechanisms
from ldpfl.common.errors import ParameterError
from ldpfl.contract.client_writer import ClientFileWriter
from ldpfl.contract.label_release import CLEAR_LABELS, LabelRelease
from ldpfl.contract.layout import client_file_name, local_file_name
from ldpfl.contract.manifest import FileRecord, record_for
from ldpfl.contract.release_guarantee import file_guarantee
from ldpfl.contract.release_history import ReleaseEntry
from ldpfl.contract.release_point import ReleasePoint, parse_release
from ldpfl.contract.schema import ClientMetadata, label_histogram
from ldpfl.contract.version import package_version
from ldpfl.mechanisms.randomness import stream_generator
from ldpfl.stage1_features.export.clamping import ClampCounter
from ldpfl.stage1_features.export.errors import ExportError
from ldpfl.stage1_features.export.partition import holdout_split
from ldpfl.stage1_features.export.release import clean_layout, local_layout, release_values, stored_layout
from ldpfl.stage1_features.export.silo import load_export_data
from ldpfl.stage1_features.export.statistics_release import export_statistics, is_statistics_release
from ldpfl.stage1_features.export.stored import model_file_name
from ldpfl.stage1_features.export.worker_guard import die_with_parent, require_parent
from ldpfl.stage1_features.export.write import BATCH_ROWS, BitDensity, raw_feature_batches, write_split
from ldpfl.stage1_features.models import cnn, cnn_release
from ldpfl.stage1_features.models.dp_training import NO_TRAINING, non_private_training, train_model_dp


@dataclass(frozen=True)
class ClientTask:
    """Everything a worker needs to export one client (picklable; holds no seed, only its stream)."""

    index: int
    client_count: int
    dataset: str
    data_dir: str | None
    indices: np.ndarray
    stream: np.random.SeedSequence
    test_fraction: float
    extractor: str
    training: cnn.TrainingConfig
    mechanism: Mapping[str, Any]  # MechanismSpec.to_dict() of the plan's spec
    partition: Mapping[str, Any]
    privacy: mechanisms.PrivacyReport
    randomness: str
    run_dir: str
    save_model: bool
    store_input_density: bool
    progress: bool
    position: int = 1
    data: str | None = None  # own data (issue 16): the user's file or folder, read with data_options
    data_options: Mapping[str, Any] = field(default_factory=dict)
    classes: tuple[str, ...] | None = None  # the shared plan's class list
    plan_fingerprint: str | None = None
    release: str = "flatten"  # the release point (stage1_features.export.release)
    model_path: str | None = None  # from_models: the source run's trained CNN of this client
    holdout: tuple[np.ndarray, np.ndarray] | None = None  # (train, test) rows, when fixed by the parent
    release_number: int = 1  # the how-many-th release of this client's records (from_models: > 1)
    keep_clean_test: bool = False  # also write the local-only client_NNN.local.h5
    noise_variance: tuple[float, float] | None = None  # noise_aware: (a, b) of the variance a + b·x² to train with
    prior_releases: tuple[ReleaseEntry, ...] = ()  # from_models: earlier releases of these records
    label_release: LabelRelease = CLEAR_LABELS  # how the files release their labels
    dp: Any = None  # dp_training.DPBudget: train the CNN with DP-SGD (``cnn_epsilon``)
    extractor_training: Mapping[str, Any] | None = None  # from_models: the source CNN's training record
    extractor_options: Mapping[str, Any] = field(default_factory=dict)  # scatter: scatter_j, scatter_l
    local_only: bool = False  # clean float32 features and true labels, every file marked local_only

    def spec(self) -> mechanisms.MechanismSpec:
        """Return the plan's mechanism spec, as it crossed the process boundary."""
        return mechanisms.MechanismSpec.from_dict(self.mechanism)


@dataclass(frozen=True)
class ClientOutcome:
    """A finished client: its manifest record, local accuracy, model file, timings and local-only file."""

    index: int
    record: FileRecord
    local_accuracy: float | None
    model_file: str | None
    seconds: float
    train_samples_per_s: float | None
    local_record: FileRecord | None = None  # keep_clean_test: client_NNN.local.h5 (never shared)


def client_streams(stream: np.random.SeedSequence, mode: str, release_number: int = 1
                   ) -> tuple[np.random.Generator, ...]:
    """Return a client's (hold-out, training, release) generators, from its child stream of the root.

    ``mode`` is the run's randomness mode: PCG64 when ``seeded``, the secure generator when ``csprng``
    (``mechanisms.randomness.stream_generator``). The client's stream is split with ``Generator.spawn``:
    children 0 (hold-out split), 1 (CNN training) and 2 (release). Release n > 1 (``from_models``) uses
    child 1 + n, so no release repeats another's draws.
    """
    client_rng = stream_generator(stream, mode)  # = randomness.child_generators(N)[i]
    holdout_rng, train_rng, release_rng = client_rng.spawn(3)
    if release_number > 1:
        child = np.random.SeedSequence(stream.entropy, spawn_key=(*stream.spawn_key, 1 + int(release_number)),
                                       pool_size=stream.pool_size)
        release_rng = stream_generator(child, mode)
    return holdout_rng, train_rng, release_rng


def client_holdout(indices: np.ndarray, test_fraction: float, stream: np.random.SeedSequence, mode: str
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Return a client's (train, test) rows (IV-C: 90 % / 10 %), drawn from its hold-out stream."""
    return holdout_split(indices, test_fraction, client_streams(stream, mode)[0])


_DATASETS: dict[str, Any] = {}


def _cached_dataset(task: ClientTask) -> Any:
    """Workers load the dataset (a benchmark set or the user's own data) once per process."""
    key = repr((task.dataset, task.data_dir, task.data, sorted(task.data_options.items()), task.classes))
    if key not in _DATASETS:
        _DATASETS[key] = load_export_data(task.dataset, task.data_dir, task.data, task.data_options, task.classes)
    return _DATASETS[key]


def progress_bar(**kwargs: Any) -> Any:
    """Return a tqdm bar on stderr that follows the terminal's width."""
    from tqdm.auto import tqdm

    return tqdm(dynamic_ncols=True, **kwargs)


def export_client(task: ClientTask, dataset: Any = None) -> ClientOutcome:
    """Algorithm 1 lines 2-10 for one client; write ``client_XXX.h5`` atomically and return its record."""
    start = time.perf_counter()
    dataset = dataset if dataset is not None else _cached_dataset(task)
    holdout_rng, train_rng, release_rng = client_streams(task.stream, task.randomness, task.release_number)
    if task.holdout is not None:  # fixed by the parent (stored in partition.npz, or the source run's)
        train_idx, test_idx = (np.asarray(a, dtype=np.int64) for a in task.holdout)
    else:
        train_idx, test_idx = holdout_split(task.indices, task.test_fraction, holdout_rng)  # IV-C: 90 % / 10 %
    splits = {"train": train_idx, "test": test_idx}
    labels = {s: dataset.y[idx] for s, idx in splits.items()}  # the true labels: CNN training, local file
    released = release_labels(task.label_release, labels, int(dataset.num_classes), release_rng)
    input_shape = tuple(dataset.input_shape)
    run_dir = Path(task.run_dir)
    name = f"client {task.index}"

    accuracy: float | None = None
    model_file: str | None = None
    rate: float | None = None
    batches: Any
    point = parse_release(task.release)
    training_record: Mapping[str, Any] = NO_TRAINING  # extractor_training: how the extractor was trained
    if cnn.is_cnn(task.extractor):
        keras = cnn.import_keras()
        if task.model_path is not None:  # from_models: the source run's trained CNN (issue 15 item 2)
            model = cnn_release.load_model(task.model_path)
            if point.units is not None and cnn_release.bottleneck_units(model) != point.units:
                raise ExportError(f"{task.model_path} has no {point.units}-unit {cnn.BOTTLENECK_LAYER} layer "
                                  f"(it has {cnn_release.bottleneck_units(model)}); `release` {point} cannot use it")
            training_record = (task.extractor_training if task.extractor_training is not None
                               else non_private_training(len(train_idx)))
        else:
            # Keras needs integer seeds: derive them from this client's training stream (Algorithm 1 line 2-3).
            keras.utils.set_random_seed(int(train_rng.integers(2**31)))
            model = cnn.build_model(task.extractor, input_shape, dataset.num_classes, bottleneck=point.units)
            x_train = dataset.features(train_idx).reshape(len(train_idx), *input_shape)
            trainer = model  # noise_aware: the same layers with the mechanism's noise after the bottleneck
            if task.noise_variance is not None:
                trainer = cnn_release.noise_aware_model(model, task.noise_variance, int(train_rng.integers(2**31)))
            if task.dp is not None:  # record-level DP-SGD (issue 22): jax-privacy on the JAX backend

                trained, training_record = train_model_dp(
                    trainer, x_train, labels["train"], task.training, task.dp, rng=train_rng,
                    extractor=task.extractor, progress=task.progress, description=name, position=task.position)
            else:
                trained = cnn.train_model(trainer, x_train, labels["train"], task.training, rng=train_rng,
                                          progress=task.progress, description=name, position=task.position)
                training_record = non_private_training(len(train_idx))
            rate = trained.samples_per_s
            del x_train
        # Algorithm 1 line 4: CNM_i, cut at the flatten layer (or at the bottleneck of bottleneck:K)
        extractor = cnn.FeatureExtractor(model, cnn.BOTTLENECK_LAYER if point.units else cnn.FLATTEN_LAYER)

        def images(idx: np.ndarray) -> np.ndarray:
            return dataset.features(idx).reshape(len(idx), *input_shape)

        # Local accuracy on the client's own hold-out (IV-C). The same predictions give the test split's
        # features, kept (10 % of the client) so that the split is not predicted a second time below.
        test_features: list[np.ndarray] = []
        if len(test_idx):
            correct = 0
            for start_row in range(0, len(test_idx), BATCH_ROWS):
                rows = test_idx[start_row:start_row + BATCH_ROWS]
                features, probabilities = extractor.predict(images(rows))
                test_features.append(release_values(point, features, probabilities))
                correct += int(np.sum(np.argmax(probabilities, axis=1) == dataset.y[rows]))
            accuracy = correct / len(test_idx)
        if task.save_model:
            model_file = cnn.save_model(model, run_dir / model_file_name(task.index)).name

        def cnn_batches(split: str, labels_of: Mapping[str, np.ndarray]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
            idx = splits[split]
            for batch, start_row in enumerate(range(0, len(idx), BATCH_ROWS)):  # Algorithm 1 line 6
                if split == "test" and test_features:
                    values = test_features[batch]
                else:
                    values = release_values(point, *extractor.predict(images(idx[start_row:start_row + BATCH_ROWS])))
                yield values, labels_of[split][start_row:start_row + BATCH_ROWS]

        batches = cnn_batches
    elif cnn.is_fixed(task.extractor):  # weight-free (scatter): the same function in every silo, learned from none
        fixed = cnn.fixed_extractor(task.extractor, task.extractor_options)
        training_record = {**NO_TRAINING, "fixed": fixed.describe(input_shape)}

        def fixed_batches(split: str, labels_of: Mapping[str, np.ndarray]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
            idx = splits[split]
            for start_row in range(0, len(idx), BATCH_ROWS):
                rows = idx[start_row:start_row + BATCH_ROWS]
                yield (fixed.transform(dataset.features(rows).reshape(len(rows), *input_shape)),
                       labels_of[split][start_row:start_row + BATCH_ROWS])

        batches = fixed_batches
    else:
        def raw_batches(split: str, labels_of: Mapping[str, np.ndarray]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
            return iter(raw_feature_batches(dataset, splits[split], labels_of[split], BATCH_ROWS))

        batches = raw_batches

    if is_statistics_release(point):  # stats:K (issue 40): one release of the records' statistics, no rows
        record, local_record = export_statistics(task, dataset, splits, labels, batches, release_rng,
                                                 training_record, write_clean_test=write_clean_test,
                                                 progress_bar=progress_bar)
        return ClientOutcome(task.index, record, None, None, time.perf_counter() - start, None, local_record)
    spec = task.spec()
    assert spec.features is not None  # resolved with the release's width by the plan
    layout = local_layout() if task.local_only else stored_layout(point, spec)
    metadata = ClientMetadata(
        dataset=dataset.name, num_classes=int(dataset.num_classes), client_index=task.index,
        client_count=task.client_count, partition=dict(task.partition), extractor=task.extractor,
        input_shape=input_shape, integer_bits=layout.integer_bits, fraction_bits=layout.fraction_bits,
        features=spec.features, feature_format=layout.feature_format,
        mechanism=spec.name, mechanism_parameters=layout.mechanism_parameters,
        privacy_report=task.privacy, randomness=task.randomness, generator=task.privacy.generator,
        label_histograms={s: label_histogram(released[s], dataset.num_classes) for s in splits},  # released only
        local_accuracy=None, package_version=package_version(),  # accuracy on clear records: local-only
        class_names=getattr(dataset, "class_names", None), plan_fingerprint=task.plan_fingerprint,
        release=str(point), label_release=task.label_release, extractor_training=dict(training_record),
        local_only=task.local_only,
    )
    row_counts = {s: len(idx) for s, idx in splits.items()}
    guarantee = file_guarantee(metadata, records=sum(row_counts.values()), history=task.prior_releases,
                               diagnostic=task.store_input_density)
    metadata = dataclasses.replace(metadata, release_guarantee=guarantee)
    local_record = None
    if task.keep_clean_test:  # written first: a kept client file always has its local file (resume)
        local = dataclasses.replace(metadata, local_accuracy=accuracy, release_guarantee=None)  # never shared
        local_record = write_clean_test(task, local, spec, point, batches("test", labels),
                                        label_histogram(labels["test"], dataset.num_classes))
    path = run_dir / client_file_name(task.index)
    pipeline = layout.pipeline
    density = BitDensity(metadata.feature_width) if task.store_input_density else None
    clamps = ClampCounter.for_pipeline(pipeline)  # issue 42 item 6: values the release clamps, per column
    bar = progress_bar(total=sum(row_counts.values()), desc=f"{name} release", unit="row", leave=False,
                       position=task.position, disable=not task.progress)
    with bar, ClientFileWriter(path, metadata, row_counts) as writer:
        for split in ("train", "test"):  # one stream, train rows first, in row order
            write_split(writer, split, batches(split, released), pipeline, release_rng,
                        density=density if split == "train" else None, progress=bar, clamps=clamps)
        if density is not None:
            writer.write_input_bit_density(density.density())
        if clamps is not None:
            try:
                clamped = clamps.refuse_past_bound(task.index)
            except ParameterError:
                if local_record is not None:  # nothing of this client is kept
                    (run_dir / local_record.path).unlink(missing_ok=True)
                raise
            if not pipeline.randomizes:  # a count of the clear records: only in a file that holds them in clear
                writer.write_clamped_values(clamped)
        require_parent(str(path))  # a worker whose export died commits nothing (issue 13)
        digest = writer.commit()
    return ClientOutcome(task.index, record_for(path, task.index, digest, row_counts), accuracy, model_file,
                         time.perf_counter() - start, rate, local_record)


def release_labels(label_release: LabelRelease, labels: Mapping[str, np.ndarray], num_classes: int,
                   release_rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Return the labels a client file holds: the true ones, or k-RR of each (train, then test).

    With ``label_release`` krr the draws come from the release stream's own child (``Generator.spawn``),
    which leaves the release stream's draws, and so the features, unchanged.
    """
    if label_release.clear or label_release.synthetic:  # synthetic: the stats release labels its own records
        return dict(labels)
    if label_release.num_classes != num_classes:
        raise ValueError(f"label_release is for {label_release.num_classes} classes, the data has {num_classes}")
    krr = label_release.sampler()
    (label_rng,) = release_rng.spawn(1)
    return {s: krr.randomize_labels(labels[s], rng=label_rng) for s in ("train", "test")}


def write_clean_test(task: ClientTask, metadata: ClientMetadata, spec: mechanisms.MechanismSpec,
                     point: ReleasePoint, batches: Iterable[tuple[np.ndarray, np.ndarray]],
                     test_histogram: list[int]) -> FileRecord:
    """Write ``client_NNN.local.h5``: the client's test split of the release, UNRANDOMIZED (``keep_clean_test``).

    The same schema as the client file (mechanism ``none``, the same width and format, so the federated
    model reads it), with ``local_only`` set and no training rows. Issue 17 item 4: a silo predicting on
    its own records releases nothing, so the global model can be evaluated on clean features too. This file
    is never shared: its privacy report says it is not private. It holds the TRUE test labels (clear
    ``label_release`` and histogram), even when the client file's labels are randomized.
    """
    layout = clean_layout(point, spec)
    identity = mechanisms.create_mechanism("none")
    clean = dataclasses.replace(
        metadata, integer_bits=layout.integer_bits, fraction_bits=layout.fraction_bits,
        feature_format=layout.feature_format, mechanism=identity.NAME,
        mechanism_parameters=layout.mechanism_parameters,
        privacy_report=identity.report().with_randomness(task.randomness, task.privacy.generator),
        label_histograms={"train": [0] * metadata.num_classes, "test": list(test_histogram)},
        label_release=CLEAR_LABELS, local_only=True)
    path = Path(task.run_dir) / local_file_name(task.index)
    split_rows = {"train": 0, "test": int(sum(test_histogram))}
    with ClientFileWriter(path, clean, split_rows, overwrite=True) as writer:
        write_split(writer, "test", batches, layout.pipeline, np.random.default_rng(0))  # none draws nothing
        digest = writer.commit()
    return record_for(path, task.index, digest, split_rows)


def init_worker(threads: int | None, uses_tensorflow: bool, parent_pid: int | None = None,
                run_dir: str | None = None) -> None:
    """Spawned worker start-up: die with the parent, then cap BLAS/TensorFlow threads so K workers share the cores.

    With ``parent_pid`` the worker is killed when that process dies and holds the workers' shared lock
    on ``run_dir`` (``ldpfl.stage1_features.export.worker_guard``).
    """
    if parent_pid is not None:
        die_with_parent(parent_pid, run_dir)
    if threads is not None:
        for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[variable] = str(threads)
    if uses_tensorflow:
        cnn.import_keras(threads)
