"""The stage-1 batch job behind ``ldpfl export``: LDPFL Algorithm 1 lines 1-10, client by client.

For each client i (Sections III-A/B, IV-A/B/C/D):

1. its share of the pooled dataset (``partition.make_partition``; IV-B: N_h equal groups), drawn once
   for the whole run from the root stream and stored in ``partition.npz``;
2. a 10 % hold-out test split (IV-C) from the client's own stream;
3. the client CNN (Fig. 3 or 4) trained on the training split (IV-C), its accuracy on the hold-out;
4. the flatten-layer output of every train and test sample (Algorithm 1 line 6);
5. fixed-point encoding (eq. 14, m integer and n fraction bits), randomization by the chosen mechanism
   (UER: Theorem 2, eq. 17), bit packing, streamed into ``client_XXX.h5`` row batch by row batch
   (Algorithm 1 lines 7-10), written to a temporary name and renamed when complete;
6. ``manifest.json`` rewritten by this (parent) process after every finished client.

Randomness: one root ``SeedSequence`` (the user's ``--seed`` or the OS CSPRNG). Client i uses
``randomness.child_sequences(N)[i]`` (the stream of ``randomness.child_generators(N)[i]``) and splits it
with ``Generator.spawn`` into three independent streams: hold-out split, CNN training, randomization.
So a client's output does not depend on which process runs it or in which order (``--clients-parallel``
gives the same files as a sequential run), and the randomization draws do not depend on how much
randomness the training consumed. The seed itself is never written anywhere; only the mode is.

Decisions (documented here because the paper is silent):

* **Resuming never randomizes a finished client again**: releasing a second randomization of the same
  records spends their privacy budget a second time. Listed files must verify (sha256, structure);
  a client file present under its final name but missing from the manifest (a crash between the rename
  and the manifest write) is validated and adopted; one that fails validation is an error that asks for
  ``--overwrite``.
* **The partition is stored** (``partition.npz``: each client's row indices in the pooled dataset, no
  seed), because a resumed run without ``--seed`` could not redraw it: redoing client 2 on a fresh
  partition would give it records that client 0 already released.
* **--limit** draws that many records uniformly from the pool (root stream) before partitioning.
* **Float mechanisms** (pdpm, gaussian, ...) randomize the float32 flatten features; their files record
  m = n = 0 (no fixed-point encoding) and r float columns.
* Mechanism parameters default to IV-D (ε = 0.5, α = 10, m = 4, n = 5). A default that a mechanism does
  not take is dropped; a non-default value it does not take is an error.
* **CNN reproducibility**: Keras' global seed is set from the client's training stream in the process
  that trains it, and training then is bit-reproducible for a given ``--seed``, machine, TensorFlow build
  and TensorFlow thread count (checked across processes). ``--clients-parallel K`` gives each worker
  cpu_count // K intra-op threads, and a different thread count changes the float rounding of the CNN
  (on a tiny model: flatten features up to 0.02 apart, same accuracy), so the *bits* of CNN-based files
  can differ from a sequential run; the partition, hold-out and randomization streams are the same.
  With ``--extractor none`` parallel and sequential files hold identical data (tested).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import mechanisms
from stage1_features import cnn
from stage1_features.features import (
    BATCH_ROWS,
    BitDensity,
    ReleasePipeline,
    feature_format_for,
    raw_feature_batches,
    write_split,
)
from stage1_features.h5format import (
    MANIFEST_NAME,
    PACKED_BITS,
    ClientFileWriter,
    ClientMetadata,
    FileRecord,
    FormatError,
    client_file_name,
    label_histogram,
    read_client_file,
    read_manifest,
    record_for,
    sha256_file,
    verify_file_record,
    write_manifest,
)

DEFAULT_MECHANISM_PARAMS: dict[str, Any] = {"epsilon": 0.5, "alpha": 10.0, "integer_bits": 4, "fraction_bits": 5}
"""LDPFL IV-D: "we maintained m, n, α, and ε at 4, 5, 10, and 0.5"."""

ENCODING_KEYS = ("integer_bits", "fraction_bits")
SET_BY_EXPORT = ("features", "dim")  # r comes from the extractor's flatten width
PARTITION_FILE = "partition.npz"
LOCK_FILE = ".export.lock"
CLIENT_FILE_RE = re.compile(r"^client_(\d{3,})\.h5$")
MODEL_FILE_RE = re.compile(r"^client_(\d{3,})\.keras$")
STALE_PATTERNS = (".client_*.h5.*.tmp", ".client_*.*.tmp.keras", f".{MANIFEST_NAME}.*.tmp", f".{PARTITION_FILE}.*.tmp")
TOOL = "ldpfl export"

# Config fields that change what the files hold: a resumed run must agree on all of them.
COMPARED_FIELDS = ("dataset", "clients", "max_clients", "partition", "beta", "unb", "shards_per_client",
                   "test_fraction", "extractor", "epochs", "batch_size", "augment", "mechanism", "mechanism_params",
                   "limit", "store_input_density", "randomness")

SAVED_MODEL_WARNING = ("saved models are trained on the raw client data: they are NOT covered by the LDP "
                       "guarantee and must stay with the client")
DENSITY_WARNING = ("/stats/input_bit_density is an aggregate of the UNRANDOMIZED encoding: it is NOT covered by "
                   "the LDP guarantee")


def model_file_name(index: int) -> str:
    """``client_XXX.keras``, next to ``client_XXX.h5`` (``--save-models``)."""
    return client_file_name(index).removesuffix(".h5") + ".keras"


class ExportError(ValueError):
    """A run that cannot start or resume as asked; the one-line message says what to do."""


@dataclass(frozen=True)
class ExportConfig:
    """Everything ``ldpfl export`` takes. ``seed`` is used, never stored.

    ``mechanism_params`` holds ε, α, m, n and any other parameter of ``mechanism`` (IV-D defaults).
    ``limit`` caps the pooled records used (drawn at random), for quick runs.
    """

    dataset: str = "mnist5k"
    data_dir: str | None = None
    clients: int = 2
    max_clients: int | None = None
    partition: str = "iid"
    beta: float = 0.5
    unb: float = 0.5
    shards_per_client: int = 2
    test_fraction: float = 0.1
    extractor: str = cnn.AUTO
    epochs: int = 50
    batch_size: int = 64
    augment: bool = True
    mechanism: str = "uer"
    mechanism_params: Mapping[str, Any] = field(default_factory=lambda: dict(DEFAULT_MECHANISM_PARAMS))
    limit: int | None = None
    save_models: bool = False
    store_input_density: bool = False
    clients_parallel: int = 1
    overwrite: bool = False
    seed: int | None = None

    def __post_init__(self) -> None:
        _int_at_least("clients", self.clients, 1)
        _int_at_least("clients_parallel", self.clients_parallel, 1)
        _int_at_least("shards_per_client", self.shards_per_client, 1)
        if self.max_clients is not None and _int_at_least("max_clients", self.max_clients, 1) < self.clients:
            raise ValueError(f"max_clients (N_h) must be >= clients ({self.clients}), got {self.max_clients}")
        if self.limit is not None:
            _int_at_least("limit", self.limit, 1)
        if not isinstance(self.test_fraction, int | float) or not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"test_fraction must lie in the open interval (0, 1), got {self.test_fraction!r}")
        from stage1_features.partition import PARTITION_KINDS

        if self.partition not in PARTITION_KINDS:
            raise ValueError(f"partition must be one of {', '.join(PARTITION_KINDS)}; got {self.partition!r}")
        if not isinstance(self.beta, int | float) or not math.isfinite(self.beta) or self.beta <= 0:
            raise ValueError(f"beta must be a finite number > 0, got {self.beta!r}")
        if not isinstance(self.unb, int | float) or not 0.0 <= self.unb <= 1.0:
            raise ValueError(f"unb must be a number in [0, 1], got {self.unb!r}")
        if self.extractor != cnn.AUTO:
            cnn.architecture(self.extractor)
        mechanisms.mechanism_class(self.mechanism)
        if not isinstance(self.mechanism_params, Mapping):
            raise ValueError(f"mechanism_params must be a mapping, got {type(self.mechanism_params).__name__}")
        self.training()  # validates epochs and batch_size

    def training(self) -> cnn.TrainingConfig:
        return cnn.TrainingConfig(epochs=self.epochs, batch_size=self.batch_size, augment=self.augment)

    def public_dict(self) -> dict[str, Any]:
        """The config as written to the manifest: everything but the seed."""
        out = dataclasses.asdict(self)
        del out["seed"]
        out["mechanism_params"] = dict(self.mechanism_params)
        return out


def _int_at_least(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


# ----------------------------------------------------------------------------------------------------
# Mechanism resolution


@dataclass(frozen=True)
class ResolvedMechanism:
    """The built mechanism, its encoding (packed formats) and the file format it implies."""

    mechanism: Any
    encoding: mechanisms.FixedPointEncoding | None
    feature_format: str

    @property
    def integer_bits(self) -> int:
        return self.encoding.integer_bits if self.encoding else 0

    @property
    def fraction_bits(self) -> int:
        return self.encoding.fraction_bits if self.encoding else 0

    def parameters(self) -> dict[str, Any]:
        """The parameters recorded in the files (the mechanism's own, plus m and n for ``none``)."""
        params = dict(self.mechanism.parameters())
        if self.encoding is not None:
            params.update(integer_bits=self.integer_bits, fraction_bits=self.fraction_bits)
        return params

    def pipeline(self) -> ReleasePipeline:
        return ReleasePipeline(self.mechanism, self.encoding, self.feature_format)


def resolve_mechanism(name: str, params: Mapping[str, Any], features: int) -> ResolvedMechanism:
    """Build mechanism ``name`` for records of ``features`` (r) values from the export's parameters.

    Parameters
    ----------
    name : str
        A registered mechanism (``mechanisms.mechanism_names()``).
    params : mapping
        ε, α, m (``integer_bits``), n (``fraction_bits``) and any other parameter of ``name``. Bit
        mechanisms get m, n and r; real mechanisms get dim = r; ``none`` uses m and n for the encoding.
    features : int
        r, the flatten width (set by the export; ``features``/``dim`` in ``params`` are refused).

    Returns
    -------
    ResolvedMechanism

    Raises
    ------
    ValueError
        A parameter ``name`` does not take (keys of ``DEFAULT_MECHANISM_PARAMS`` left at their IV-D
        default are dropped silently instead), or a value the mechanism refuses (quoted with its range).
    """
    cls = mechanisms.mechanism_class(name)
    accepted = {f.name for f in dataclasses.fields(cls)}
    fmt = feature_format_for(name)
    uses_encoding = fmt == PACKED_BITS
    given = dict(params)
    for key in SET_BY_EXPORT:
        if key in given:
            raise ValueError(f"mechanism parameter {key!r} is set by the export (the flatten width r = {features}); "
                             "do not pass it")
    kwargs: dict[str, Any] = {}
    encoding_args: dict[str, Any] = {}
    for key, value in given.items():
        if uses_encoding and key in ENCODING_KEYS:
            encoding_args[key] = value
            if key in accepted:
                kwargs[key] = value
        elif key in accepted:
            kwargs[key] = value
        elif key in DEFAULT_MECHANISM_PARAMS and value == DEFAULT_MECHANISM_PARAMS[key]:
            continue  # an IV-D default that this mechanism does not use
        else:
            takes = sorted(accepted - set(SET_BY_EXPORT)) + (list(ENCODING_KEYS) if name == "none" else [])
            raise ValueError(f"mechanism {name!r} takes no parameter {key!r} (= {value!r}); it takes: "
                             f"{', '.join(takes) or 'none'}")
    if "features" in accepted:
        kwargs["features"] = features
    if "dim" in accepted:
        kwargs["dim"] = features
    mech = mechanisms.create_mechanism(name, **kwargs)
    encoding = None
    if uses_encoding:
        encoding = getattr(mech, "encoding", None) or mechanisms.FixedPointEncoding(
            int(encoding_args.get("integer_bits", DEFAULT_MECHANISM_PARAMS["integer_bits"])),
            int(encoding_args.get("fraction_bits", DEFAULT_MECHANISM_PARAMS["fraction_bits"])))
    return ResolvedMechanism(mech, encoding, fmt)


# ----------------------------------------------------------------------------------------------------
# The plan: everything decided before any client runs (no TensorFlow needed)


@dataclass(frozen=True)
class ExportPlan:
    config: ExportConfig
    dataset: Any  # stage1_features.datasets.Dataset
    extractor: str
    features: int
    resolved: ResolvedMechanism
    randomness: mechanisms.Randomness
    privacy_report: dict[str, Any]

    @property
    def feature_width(self) -> int:
        """Model input width: r·l bits (packed) or r (float32)."""
        if self.resolved.feature_format == PACKED_BITS:
            return self.features * self.resolved.encoding.bits_per_value
        return self.features

    def fingerprint(self) -> dict[str, Any]:
        """The resolved values that a resumed run must share (``COMPARED_FIELDS``), JSON-normalized."""
        public = self.config.public_dict()
        values = {key: public.get(key) for key in COMPARED_FIELDS}
        values.update(extractor=self.extractor, mechanism_params=self.resolved.parameters(),
                      randomness=self.randomness.mode)
        if not cnn.is_cnn(self.extractor):  # no CNN is trained: the training settings change nothing
            values.update(epochs=None, batch_size=None, augment=None)
        return json.loads(json.dumps(values, sort_keys=True, default=str))


def make_plan(config: ExportConfig) -> ExportPlan:
    """Validate ``config``, load the dataset, fix r and build the mechanism. Raises ``ValueError``."""
    from stage1_features.datasets import load_dataset

    randomness = mechanisms.make_randomness(config.seed)
    # Fail fast on mechanism parameters before the (possibly slow) dataset load; r is not known yet.
    resolve_mechanism(config.mechanism, config.mechanism_params, 1)
    dataset = load_dataset(config.dataset, config.data_dir)
    extractor = cnn.resolve_extractor(config.extractor, dataset.name)
    r = cnn.flatten_width(extractor, tuple(dataset.input_shape))
    if cnn.is_cnn(extractor) and dataset.num_classes < 2:
        raise ValueError(f"dataset {dataset.name!r} has {dataset.num_classes} class; a CNN needs >= 2")
    if config.limit is not None and config.limit > len(dataset):
        raise ValueError(f"limit must be in [1, {len(dataset)}] (the pooled size of {dataset.name}), "
                         f"got {config.limit}")
    resolved = resolve_mechanism(config.mechanism, config.mechanism_params, r)
    if config.store_input_density and resolved.feature_format != PACKED_BITS:
        raise ValueError(f"--store-input-density applies to bit encodings only; mechanism {config.mechanism!r} "
                         "writes float32 features")
    report = resolved.mechanism.report().with_randomness(randomness.mode).to_dict()
    return ExportPlan(config, dataset, extractor, r, resolved, randomness, report)


# ----------------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class ClientSummary:
    """One client of a run: where its file is and whether this run made it."""

    index: int
    rows: Mapping[str, int]
    local_accuracy: float | None
    file: str
    sha256: str
    status: str  # "new", "reused" (listed and verified) or "adopted" (found, validated, added to the manifest)
    model_file: str | None = None
    seconds: float | None = None
    train_samples_per_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"rows": dict(self.rows)}


@dataclass(frozen=True)
class ExportResult:
    """What ``run_export`` did."""

    run_dir: Path
    manifest: Path
    dataset: str
    extractor: str
    mechanism: str
    feature_format: str
    features: int
    feature_width: int
    privacy_report: Mapping[str, Any]
    randomness: str
    clients: list[ClientSummary]
    seconds: float
    notes: tuple[str, ...] = ()

    @property
    def new(self) -> int:
        return sum(c.status == "new" for c in self.clients)

    def to_dict(self) -> dict[str, Any]:
        report = self.privacy_report
        return {
            "run_dir": str(self.run_dir), "manifest": str(self.manifest), "dataset": self.dataset,
            "extractor": self.extractor, "mechanism": self.mechanism, "feature_format": self.feature_format,
            "features": self.features, "feature_width": self.feature_width,
            "nominal_epsilon": report.get("nominal_epsilon"),
            "exact_epsilon_per_record": report.get("exact_epsilon_per_record"),
            "exact_epsilon_per_coordinate": report.get("exact_epsilon_per_coordinate"),
            "private": self.mechanism != "none" and report.get("exact_epsilon_per_record") != "inf",
            "randomness": self.randomness, "seconds": round(self.seconds, 3),
            "clients": [c.to_dict() for c in self.clients],
            "new": self.new, "reused": len(self.clients) - self.new, "notes": list(self.notes),
        }


# ----------------------------------------------------------------------------------------------------
# One client (runs in this process or in a spawned worker)


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
    mechanism: str
    mechanism_input: Mapping[str, Any]  # the export's mechanism parameters, resolved again in the worker
    features: int
    partition: Mapping[str, Any]
    privacy_report: Mapping[str, Any]
    randomness: str
    run_dir: str
    save_model: bool
    store_input_density: bool
    progress: bool
    position: int = 1


@dataclass(frozen=True)
class ClientOutcome:
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


def _tqdm(**kwargs: Any) -> Any:
    from tqdm.auto import tqdm

    return tqdm(dynamic_ncols=True, **kwargs)


def export_client(task: ClientTask, dataset: Any = None) -> ClientOutcome:
    """Algorithm 1 lines 2-10 for one client; writes ``client_XXX.h5`` atomically and returns its record."""
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

        def batches(split: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
            idx = splits[split]
            for batch, start_row in enumerate(range(0, len(idx), BATCH_ROWS)):  # Algorithm 1 line 6
                if split == "test" and test_features:
                    features = test_features[batch]
                else:
                    features, _ = extractor.predict(images(idx[start_row:start_row + BATCH_ROWS]))
                yield features, labels[split][start_row:start_row + BATCH_ROWS]
    else:
        def batches(split: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
            return iter(raw_feature_batches(dataset, splits[split], labels[split], BATCH_ROWS))

    resolved = resolve_mechanism(task.mechanism, task.mechanism_input, task.features)
    metadata = ClientMetadata(
        dataset=dataset.name, num_classes=int(dataset.num_classes), client_index=task.index,
        client_count=task.client_count, partition=dict(task.partition), extractor=task.extractor,
        input_shape=input_shape, integer_bits=resolved.integer_bits, fraction_bits=resolved.fraction_bits,
        features=task.features, feature_format=resolved.feature_format,
        mechanism=task.mechanism, mechanism_parameters=resolved.parameters(),
        privacy_report=dict(task.privacy_report), randomness=task.randomness,
        label_histograms={s: label_histogram(labels[s], dataset.num_classes) for s in splits},
        local_accuracy=accuracy, package_version=_package_version(),
    )
    rows = {s: len(idx) for s, idx in splits.items()}
    path = run_dir / client_file_name(task.index)
    pipeline = resolved.pipeline()
    density = BitDensity(metadata.feature_width) if task.store_input_density else None
    bar = _tqdm(total=sum(rows.values()), desc=f"{name} release", unit="row", leave=False,
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


def _package_version() -> str:
    from ldpfl import __version__

    return __version__


def _init_worker(threads: int | None, uses_tensorflow: bool) -> None:
    """Spawned worker start-up: cap BLAS/TensorFlow threads so K workers share the cores."""
    if threads is not None:
        for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[variable] = str(threads)
    if uses_tensorflow:
        cnn.import_keras(threads)


# ----------------------------------------------------------------------------------------------------
# The run directory


@contextlib.contextmanager
def _locked(run_dir: Path) -> Iterator[None]:
    """One export per run directory at a time (an advisory lock the kernel drops when a process dies)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on POSIX: no lock
        yield
        return
    handle = open(run_dir / LOCK_FILE, "a+")  # noqa: SIM115
    try:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ExportError(f"another ldpfl export is running in {run_dir}; wait for it to finish") from None
        yield
    finally:
        handle.close()


def prepare_run_dir(out_dir: str | os.PathLike) -> Path:
    """Create ``out_dir`` if needed and check that it is a writable directory (``ExportError`` if not)."""
    run_dir = Path(out_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ExportError(f"cannot create output directory {run_dir} ({error.strerror or error})") from None
    if not run_dir.is_dir():
        raise ExportError(f"output path {run_dir} is not a directory")
    probe = run_dir / f".write-test.{os.getpid()}.tmp"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise ExportError(f"output directory {run_dir} is not writable ({error.strerror or error})") from None
    return run_dir


def _remove_stale(run_dir: Path) -> list[str]:
    removed = []
    for pattern in STALE_PATTERNS:
        for path in run_dir.glob(pattern):
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed


def _client_files(run_dir: Path, pattern: re.Pattern[str]) -> dict[int, Path]:
    return {int(m.group(1)): p for p in run_dir.iterdir() if (m := pattern.match(p.name))}


def _clear_outputs(run_dir: Path) -> None:
    """``--overwrite``: remove what an export wrote (client files, models, manifest, partition), nothing else."""
    for path in [*_client_files(run_dir, CLIENT_FILE_RE).values(), *_client_files(run_dir, MODEL_FILE_RE).values(),
                 run_dir / MANIFEST_NAME, run_dir / PARTITION_FILE]:
        path.unlink(missing_ok=True)


def save_partition(run_dir: Path, clients: list[np.ndarray]) -> str:
    """Atomically write ``partition.npz`` (client_000 … : int64 row indices in the pool); return its sha256."""
    tmp = run_dir / f".{PARTITION_FILE}.{os.getpid()}.tmp"
    with open(tmp, "wb") as handle:
        np.savez(handle, **{f"client_{i:03d}": np.asarray(c, dtype=np.int64) for i, c in enumerate(clients)})
        handle.flush()
        os.fsync(handle.fileno())
    digest = sha256_file(tmp)
    os.replace(tmp, run_dir / PARTITION_FILE)
    return digest


def load_partition(run_dir: Path, count: int, pool_size: int, sha256: str | None) -> list[np.ndarray]:
    """Read back ``partition.npz`` and check it against the manifest and the dataset."""
    path = run_dir / PARTITION_FILE
    if not path.is_file():
        raise ExportError(f"{path} is missing, so the run cannot be resumed with the same partition; "
                          "pass --overwrite to start over")
    if sha256 is not None and sha256_file(path) != sha256:
        raise ExportError(f"{path} does not match the manifest's sha256; pass --overwrite to start over")
    try:
        with np.load(path, allow_pickle=False) as data:
            clients = [np.asarray(data[f"client_{i:03d}"], dtype=np.int64) for i in range(count)]
    except (OSError, KeyError, ValueError) as error:
        raise ExportError(f"{path} is unreadable ({error}); pass --overwrite to start over") from None
    joined = np.concatenate(clients) if clients else np.empty(0, dtype=np.int64)
    if joined.size and (joined.min() < 0 or joined.max() >= pool_size or np.unique(joined).size != joined.size):
        raise ExportError(f"{path} does not describe disjoint clients of a {pool_size}-record pool; "
                          "pass --overwrite to start over")
    return clients


def make_client_partition(plan: ExportPlan) -> tuple[list[np.ndarray], dict[str, Any]]:
    """IV-B: the clients' rows in the pool (root stream) and the ``partition`` attribute describing them."""
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


def _mismatches(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    return [f"{key} was {old.get(key)!r}, now {new.get(key)!r}" for key in sorted(set(old) | set(new))
            if old.get(key) != new.get(key)]


def _check_metadata(path: Path, meta: ClientMetadata, plan: ExportPlan, index: int) -> None:
    expected = {"dataset": plan.dataset.name, "client_index": index, "client_count": plan.config.clients,
                "extractor": plan.extractor, "features": plan.features, "mechanism": plan.config.mechanism,
                "feature_format": plan.resolved.feature_format, "integer_bits": plan.resolved.integer_bits,
                "fraction_bits": plan.resolved.fraction_bits, "randomness": plan.randomness.mode}
    found = {key: getattr(meta, key) for key in expected}
    problems = _mismatches(found, expected)
    if problems:
        raise ExportError(f"{path} belongs to a different export ({'; '.join(problems)}); pass --overwrite to redo "
                          "the run")


def _client_summary_from(record: FileRecord, meta: ClientMetadata, status: str, run_dir: Path) -> ClientSummary:
    model = model_file_name(record.client_index)
    return ClientSummary(record.client_index, dict(record.rows), meta.local_accuracy, record.path, record.sha256,
                         status, model if (run_dir / model).is_file() else None)


def _existing_clients(run_dir: Path, plan: ExportPlan) -> tuple[dict[int, tuple[FileRecord, ClientSummary]],
                                                                 list[np.ndarray] | None, dict[str, Any] | None]:
    """Finished clients to keep, and the stored partition, of a run directory being resumed."""
    files = _client_files(run_dir, CLIENT_FILE_RE)
    if not (run_dir / MANIFEST_NAME).exists():
        if files:
            raise ExportError(f"{run_dir} holds client files but no {MANIFEST_NAME}; they cannot be checked "
                              "against this run: pass --overwrite to start over")
        return {}, None, None
    try:
        manifest = read_manifest(run_dir)
    except FormatError as error:
        raise ExportError(f"{error}; pass --overwrite to start over") from None
    if manifest.info.get("tool") != TOOL:
        raise ExportError(f"{run_dir / MANIFEST_NAME} was not written by {TOOL}; pass --overwrite to start over")
    problems = _mismatches(manifest.info.get("fingerprint", {}), plan.fingerprint())
    if problems:
        raise ExportError(f"{run_dir} holds an export with other settings ({'; '.join(problems)}); pass --overwrite "
                          "to replace it, or choose another --out")
    partition_info = manifest.info.get("partition_file", {})
    clients = load_partition(run_dir, plan.config.clients, len(plan.dataset), partition_info.get("sha256"))
    kept: dict[int, tuple[FileRecord, ClientSummary]] = {}
    for record in manifest.files:
        path = run_dir / record.path
        try:
            meta = verify_file_record(run_dir, record)
        except FormatError as error:
            raise ExportError(f"finished client file fails verification: {error}. It was already randomized and "
                              "is never randomized again (that would spend its privacy budget twice): pass "
                              "--overwrite to redo the whole run") from None
        _check_metadata(path, meta, plan, record.client_index)
        kept[record.client_index] = (record, _client_summary_from(record, meta, "reused", run_dir))
    for index, path in sorted(files.items()):
        if index in kept:
            continue
        if index >= plan.config.clients:
            raise ExportError(f"{path} is beyond the {plan.config.clients} clients of this run; pass --overwrite")
        try:  # finished but not yet in the manifest: validate (structure, every chunk's checksum) and adopt
            data = read_client_file(path)
            meta, rows = data.metadata, {s: len(data.labels[s]) for s in data.labels}
            del data
        except FormatError as error:
            raise ExportError(f"client file not in the manifest fails validation: {error}; pass --overwrite to "
                              "redo the run") from None
        _check_metadata(path, meta, plan, index)
        record = record_for(path, index, sha256_file(path), rows)
        kept[index] = (record, _client_summary_from(record, meta, "adopted", run_dir))
    return kept, clients, manifest.info.get("partition")


# ----------------------------------------------------------------------------------------------------
# The job


def run_export(config: ExportConfig, out_dir: str | os.PathLike, *, progress: bool = True) -> ExportResult:
    """Run (or resume) the export of ``config`` into ``out_dir`` (LDPFL Algorithm 1 lines 1-10).

    Parameters
    ----------
    config : ExportConfig
        What to export; ``config.seed`` is used for the randomness and never written.
    out_dir : path
        The run directory (created if needed). An existing export there is resumed: verified clients
        are kept, missing ones are done; ``config.overwrite`` starts over.
    progress : bool
        tqdm bars on stderr (per client, per epoch, per release).

    Returns
    -------
    ExportResult
        Run directory, manifest path, privacy report and one ``ClientSummary`` per client.

    Raises
    ------
    ValueError
        ``ExportError`` / ``DatasetError`` / parameter errors: bad input, or a run directory that cannot
        be resumed (the message says what to do). Raised before anything is written where possible.
    OSError
        I/O failures while writing. On any failure no half-written client file carries a final name,
        and the manifest lists finished clients only.
    """
    started = time.perf_counter()
    plan = make_plan(config)
    fresh = make_client_partition(plan)  # drawn before anything is written, so a bad split writes nothing
    run_dir = prepare_run_dir(out_dir)
    notes = []
    if config.save_models:
        notes.append(SAVED_MODEL_WARNING)
    if config.store_input_density:
        notes.append(DENSITY_WARNING)
    with _locked(run_dir):
        _remove_stale(run_dir)
        if config.overwrite:
            _clear_outputs(run_dir)
        kept, clients, partition_desc = _existing_clients(run_dir, plan)
        if clients is None:
            clients, partition_desc = fresh
            partition_sha = save_partition(run_dir, clients)
        else:
            partition_sha = sha256_file(run_dir / PARTITION_FILE)
        run_info = {
            "tool": TOOL, "dataset": plan.dataset.name, "client_count": config.clients,
            "randomness": plan.randomness.mode, "package_version": _package_version(),
            "config": config.public_dict(), "fingerprint": plan.fingerprint(), "extractor": plan.extractor,
            "features": plan.features, "feature_format": plan.resolved.feature_format,
            "feature_width": plan.feature_width, "mechanism": config.mechanism,
            "privacy_report": plan.privacy_report, "training": config.training().to_dict(),
            "partition": partition_desc, "partition_file": {"path": PARTITION_FILE, "sha256": partition_sha},
        }
        records = {i: rec for i, (rec, _) in kept.items()}
        summaries = {i: summary for i, (_, summary) in kept.items()}
        write_manifest(run_dir, list(records.values()), run_info)  # lists adopted files at once
        pending = [i for i in range(config.clients) if i not in kept]
        tasks = [_task(plan, run_dir, i, clients[i], partition_desc, progress) for i in pending]

        def finished(outcome: ClientOutcome) -> None:
            records[outcome.index] = outcome.record
            summaries[outcome.index] = ClientSummary(
                outcome.index, dict(outcome.record.rows), outcome.local_accuracy, outcome.record.path,
                outcome.record.sha256,
                "new", outcome.model_file, round(outcome.seconds, 3),
                None if outcome.train_samples_per_s is None else round(outcome.train_samples_per_s, 1))
            write_manifest(run_dir, list(records.values()), run_info)  # the parent alone writes it

        bar = _tqdm(total=config.clients, initial=len(kept), desc="clients", unit="client", position=0,
                    disable=not progress)
        with bar:
            if config.clients_parallel > 1 and len(tasks) > 1:
                _run_parallel(tasks, config, plan, finished, bar)
            else:
                for task in tasks:
                    bar.set_postfix_str(f"client {task.index}")
                    finished(export_client(task, plan.dataset))
                    bar.update(1)
    return ExportResult(run_dir, run_dir / MANIFEST_NAME, plan.dataset.name, plan.extractor, config.mechanism,
                        plan.resolved.feature_format, plan.features, plan.feature_width, plan.privacy_report,
                        plan.randomness.mode, [summaries[i] for i in sorted(summaries)],
                        time.perf_counter() - started, tuple(notes))


def _task(plan: ExportPlan, run_dir: Path, index: int, indices: np.ndarray, partition: Mapping[str, Any],
          progress: bool) -> ClientTask:
    config = plan.config
    streams = plan.randomness.child_sequences(config.clients)  # client i: child stream i, in any process
    position = 1 + (index % config.clients_parallel if config.clients_parallel > 1 else 0)
    return ClientTask(
        index=index, client_count=config.clients, dataset=config.dataset, data_dir=config.data_dir,
        indices=np.asarray(indices, dtype=np.int64), stream=streams[index], test_fraction=config.test_fraction,
        extractor=plan.extractor, training=config.training(), mechanism=config.mechanism,
        mechanism_input=dict(config.mechanism_params), features=plan.features, partition=dict(partition),
        privacy_report=plan.privacy_report,
        randomness=plan.randomness.mode, run_dir=str(run_dir), save_model=config.save_models,
        store_input_density=config.store_input_density, progress=progress, position=position)


def _run_parallel(tasks: list[ClientTask], config: ExportConfig, plan: ExportPlan, finished: Any, bar: Any) -> None:
    """Clients in ``config.clients_parallel`` spawned processes (TensorFlow does not survive fork)."""
    import multiprocessing
    from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait

    workers = min(config.clients_parallel, len(tasks))
    threads = max(1, (os.cpu_count() or 1) // workers)
    executor = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_init_worker, initargs=(threads, cnn.is_cnn(plan.extractor)))
    try:
        pending = {executor.submit(export_client, task) for task in tasks}
        while pending:
            done, pending = wait(pending, return_when=FIRST_EXCEPTION)
            for future in done:
                finished(future.result())  # re-raises a worker's error here
                bar.update(1)
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


def describe_privacy(report: Mapping[str, Any]) -> str:
    """One line: nominal and exact ε of a report dict."""

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

