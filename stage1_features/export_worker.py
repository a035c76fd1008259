"""One client of the export (LDPFL Algorithm 1 lines 2-10), in this process or in a spawned worker.

The client's stream is split with ``Generator.spawn`` into three independent streams: hold-out split,
CNN training, randomization. So its output does not depend on which process runs it or in which order,
and the randomization draws do not depend on how much randomness the training consumed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import mechanisms
from contract.client_writer import ClientFileWriter
from contract.layout import client_file_name
from contract.manifest import FileRecord, record_for
from contract.schema import ClientMetadata, label_histogram
from contract.version import package_version
from stage1_features import cnn
from stage1_features.export_run_dir import model_file_name
from stage1_features.features import BATCH_ROWS, BitDensity, ReleasePipeline, raw_feature_batches, write_split


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

    def spec(self) -> mechanisms.MechanismSpec:
        """Return the plan's mechanism spec, as it crossed the process boundary."""
        return mechanisms.MechanismSpec.from_dict(self.mechanism)


@dataclass(frozen=True)
class ClientOutcome:
    """A finished client: its manifest record, local accuracy, model file and timings."""

    index: int
    record: FileRecord
    local_accuracy: float | None
    model_file: str | None
    seconds: float
    train_samples_per_s: float | None


_DATASETS: dict[tuple[str, str | None], Any] = {}


def _cached_dataset(name: str, data_dir: str | None) -> Any:
    """Workers load the dataset once per process."""
    from stage1_features.datasets import load_dataset

    key = (name, data_dir)
    if key not in _DATASETS:
        _DATASETS[key] = load_dataset(name, data_dir)
    return _DATASETS[key]


def progress_bar(**kwargs: Any) -> Any:
    """Return a tqdm bar on stderr that follows the terminal's width."""
    from tqdm.auto import tqdm

    return tqdm(dynamic_ncols=True, **kwargs)


def export_client(task: ClientTask, dataset: Any = None) -> ClientOutcome:
    """Algorithm 1 lines 2-10 for one client; write ``client_XXX.h5`` atomically and return its record."""
    from stage1_features.partition import holdout_split

    start = time.perf_counter()
    dataset = dataset if dataset is not None else _cached_dataset(task.dataset, task.data_dir)
    client_rng = np.random.Generator(np.random.PCG64(task.stream))  # = randomness.child_generators(N)[i]
    holdout_rng, train_rng, release_rng = client_rng.spawn(3)
    train_idx, test_idx = holdout_split(task.indices, task.test_fraction, holdout_rng)  # IV-C: 90 % / 10 %
    splits = {"train": train_idx, "test": test_idx}
    labels = {s: dataset.y[idx] for s, idx in splits.items()}
    input_shape = tuple(dataset.input_shape)
    run_dir = Path(task.run_dir)
    name = f"client {task.index}"

    accuracy: float | None = None
    model_file: str | None = None
    rate: float | None = None
    batches: Any
    if cnn.is_cnn(task.extractor):
        keras = cnn.import_keras()
        # Keras needs integer seeds: derive them from this client's training stream (Algorithm 1 line 2-3).
        keras.utils.set_random_seed(int(train_rng.integers(2**31)))
        model = cnn.build_model(task.extractor, input_shape, dataset.num_classes)
        x_train = dataset.features(train_idx).reshape(len(train_idx), *input_shape)
        trained = cnn.train_model(model, x_train, labels["train"], task.training, rng=train_rng,
                                  progress=task.progress, description=name, position=task.position)
        rate = trained.samples_per_s
        del x_train
        extractor = cnn.FeatureExtractor(model)  # Algorithm 1 line 4: CNM_i, cut at the flatten layer

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
                test_features.append(features)
                correct += int(np.sum(np.argmax(probabilities, axis=1) == dataset.y[rows]))
            accuracy = correct / len(test_idx)
        if task.save_model:
            model_file = cnn.save_model(model, run_dir / model_file_name(task.index)).name

        def cnn_batches(split: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
            idx = splits[split]
            for batch, start_row in enumerate(range(0, len(idx), BATCH_ROWS)):  # Algorithm 1 line 6
                if split == "test" and test_features:
                    features = test_features[batch]
                else:
                    features, _ = extractor.predict(images(idx[start_row:start_row + BATCH_ROWS]))
                yield features, labels[split][start_row:start_row + BATCH_ROWS]

        batches = cnn_batches
    else:
        def raw_batches(split: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
            return iter(raw_feature_batches(dataset, splits[split], labels[split], BATCH_ROWS))

        batches = raw_batches

    spec = task.spec()
    assert spec.features is not None  # resolved with r by the plan
    metadata = ClientMetadata(
        dataset=dataset.name, num_classes=int(dataset.num_classes), client_index=task.index,
        client_count=task.client_count, partition=dict(task.partition), extractor=task.extractor,
        input_shape=input_shape, integer_bits=spec.integer_bits, fraction_bits=spec.fraction_bits,
        features=spec.features, feature_format=spec.feature_format,
        mechanism=spec.name, mechanism_parameters=spec.recorded_parameters(),
        privacy_report=task.privacy.to_dict(), randomness=task.randomness,
        label_histograms={s: label_histogram(labels[s], dataset.num_classes) for s in splits},
        local_accuracy=accuracy, package_version=package_version(),
    )
    rows = {s: len(idx) for s, idx in splits.items()}
    path = run_dir / client_file_name(task.index)
    pipeline = ReleasePipeline.for_spec(spec)
    density = BitDensity(metadata.feature_width) if task.store_input_density else None
    bar = progress_bar(total=sum(rows.values()), desc=f"{name} release", unit="row", leave=False,
                       position=task.position, disable=not task.progress)
    with bar, ClientFileWriter(path, metadata, rows) as writer:
        for split in ("train", "test"):  # one stream, train rows first, in row order
            write_split(writer, split, batches(split), pipeline, release_rng,
                        density=density if split == "train" else None, progress=bar)
        if density is not None:
            writer.write_input_bit_density(density.density())
        digest = writer.commit()
    return ClientOutcome(task.index, record_for(path, task.index, digest, rows), accuracy, model_file,
                         time.perf_counter() - start, rate)


def init_worker(threads: int | None, uses_tensorflow: bool) -> None:
    """Spawned worker start-up: cap BLAS/TensorFlow threads so K workers share the cores."""
    if threads is not None:
        for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[variable] = str(threads)
    if uses_tensorflow:
        cnn.import_keras(threads)
