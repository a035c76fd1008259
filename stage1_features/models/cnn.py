"""The per-client CNNs of LDPFL stage 1 (Figs. 3 and 4, Sections III-A and IV-A/C), as a registry.

Extractors (``--extractor``):

* ``mnist-cnn``: Fig. 3, the MNIST net. conv32, conv32, maxpool, conv64, conv64, maxpool; 3×3 kernels,
  stride 1, valid padding, ReLU, BatchNormalization(axis=-1) at the layer numbers of IV-A1 (5, 9, 12,
  17, 20), L2(1e-4) kernel regularizer on every conv. Flatten (layer 16) gives r = 4·4·64 = 1,024 on
  28×28 inputs, so r·l = 10,240 with l = 10. Head: BN, Dense(512), ReLU, BN, Dropout(0.2), softmax.
* ``cifar-cnn``: Fig. 4, the CIFAR-10/SVHN/FMNIST net. Pairs of conv32, conv64, conv128 (same padding),
  each conv followed by its activation and BN, a 2×2 max-pool and dropout (0.2, 0.3, 0.4) after each
  pair. Flatten (layer 27) gives r = 3·3·128 = 1,152 on 28×28×1 (FMNIST, r·l = 11,520) and
  4·4·128 = 2,048 on 32×32×3 (r·l = 20,480). Head: Dense(num_classes, softmax) (layer 28).
* ``none``: no CNN; the flattened raw inputs in [0, 1] are the features (the logistic-regression
  setting of Wu et al.).
* ``scatter``: no CNN; a weight-free wavelet scattering transform and GroupNorm (Tramèr and Boneh, ICLR 2021),
  with options J and L (``ldpfl.stage1_features.models.scatter``, which registers it).

Decisions where the paper's figures are missing from the text or ambiguous:

* Fig. 3 layer order and head are read from the layer numbers of IV-A1: 3 conv, 4 act, 5 BN, 6 conv,
  7 act, 8 pool, 9 BN, 10 conv, 11 act, 12 BN, 13 conv, 14 act, 15 pool, 16 flatten, 17 BN, 18 dense,
  19 act, 20 BN, then dropout and the softmax layer. The width 512 of the hidden dense layer and the
  dropout 0.2 are not in the text (the classic Keras MNIST net these numbers match uses them).
* Fig. 4 follows the authors' public code (Helper.full_model): ELU activations, then BN, after each
  conv; dropout 0.2/0.3/0.4. The brief's "ReLU" applies to Fig. 3 only.
* Augmentation (IV-C: ImageDataGenerator rotation 15°, width/height shift 0.1) is done by Keras 3
  preprocessing layers (RandomRotation, RandomTranslation, fill mode "nearest" as ImageDataGenerator)
  in a training-only wrapper, so the saved model and the feature extractor hold no augmentation. The
  authors' code also flips horizontally; the paper does not, and neither do we (digits are not
  mirror-symmetric).
* Learning rate (IV-C): 1e-3, 5e-4 "after the 75th epoch", 3e-4 "after the 100th epoch": with epochs
  counted from 1, epoch 76 onwards gets 5e-4 and epoch 101 onwards 3e-4. (The authors' code tests
  ``epoch > 75`` before ``epoch > 100``, so its third rate is never used; we follow the text.) The
  legacy Keras ``RMSprop(decay=1e-6)`` is applied as lr / (1 + 1e-6 · step) on top.
* BatchNormalization uses momentum 0.9 for its moving statistics, not Keras' 0.99 (the authors' code).
  The momentum only sets how fast the inference-time averages follow the batch statistics; training is
  unchanged. With 0.99 the moving variance (initialised to 1, real values ~1e-3) still carries 0.99^k of
  its start after k steps: after one epoch of a small client (35-100 steps) local accuracy and the
  exported features were near chance although training accuracy was not. With 0.9 the residual is
  0.9^k (< 3 % after 35 steps); at the paper's 50 epochs both settings give the same statistics.

Keras and its backend (TensorFlow by default; torch or jax with ``--keras-backend``, see
``ldpfl.stage1_features.models.keras_backend``) are imported only inside the functions that build, train, predict or
save.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ldpfl.common.errors import ParameterError
from ldpfl.contract.atomic import atomic_path
from ldpfl.contract.datasets import DATASETS
from ldpfl.stage1_features.models.keras_backend import import_keras

MNIST_CNN = "mnist-cnn"
CIFAR_CNN = "cifar-cnn"
NO_EXTRACTOR = "none"
AUTO = "auto"
DP_AUTO_EXTRACTOR = "dp-cnn"  # ``auto`` under DP-SGD (registered by models.dp_nets)
WEIGHT_DECAY = 1e-4  # IV-A1: regularizers.l2(1e-4) on all convolution layers
BN_MOMENTUM = 0.9  # see the module docstring: moving statistics usable after a few dozen steps
FLATTEN_LAYER = "flatten_features"  # the layer whose output is exported (Fig. 3 no. 16, Fig. 4 no. 27)
BOTTLENECK_LAYER = "release_bottleneck"  # ``--release bottleneck:K``: K tanh units right after the flatten layer

@dataclass(frozen=True)
class Architecture:
    """One registered extractor: its name, its source in the paper, and its flatten width rule.

    A trained CNN has a ``builder``; a weight-free extractor (``scatter``) has ``fixed``, which takes its
    ``options`` (the ``ExportConfig`` fields it reads, with their defaults) and returns an object with
    ``width(input_shape)``, ``describe(input_shape)`` and ``batches(images)``; ``none`` has neither.
    """

    name: str
    source: str
    summary: str
    flatten_width: Callable[[tuple[int, ...]], int]
    builder: Callable[..., Any] | None = None  # (keras, input_shape, num_classes, bottleneck) -> keras.Model
    fixed: Callable[[Mapping[str, Any]], Any] | None = None  # options -> a weight-free extractor
    options: Mapping[str, Any] = field(default_factory=dict)


def _image_shape(name: str, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(input_shape) != 3 or min(input_shape) < 1:
        raise ParameterError(f"extractor {name!r} needs images of shape (height, width, channels), got input shape "
                             f"{tuple(input_shape)}; use `extractor` 'none' for tabular data")
    return int(input_shape[0]), int(input_shape[1]), int(input_shape[2])


def _mnist_width(input_shape: tuple[int, ...]) -> int:
    """Fig. 3: two valid 3×3 convs (-4), pool, two valid convs (-4), pool; 64 channels."""
    h, w, _ = _image_shape(MNIST_CNN, input_shape)
    side = [((s - 4) // 2 - 4) // 2 for s in (h, w)]
    if min(side) < 1 or min(h, w) < 16:
        raise ValueError(f"extractor {MNIST_CNN!r} needs images of at least 16×16, got {h}×{w}")
    return side[0] * side[1] * 64


def _cifar_width(input_shape: tuple[int, ...]) -> int:
    """Fig. 4: same-padding convs keep the size; three 2×2 pools (floor); 128 channels."""
    h, w, _ = _image_shape(CIFAR_CNN, input_shape)
    if min(h, w) < 8:
        raise ValueError(f"extractor {CIFAR_CNN!r} needs images of at least 8×8, got {h}×{w}")
    return (h // 8) * (w // 8) * 128


def _none_width(input_shape: tuple[int, ...]) -> int:
    return int(np.prod(input_shape, dtype=np.int64))


def _bottleneck(keras: Any, x: Any, units: int | None) -> Any:
    """``--release bottleneck:K``: a K-unit tanh layer after the flatten layer (outputs in [-1, 1]^K), or nothing."""
    if units is None:
        return x
    return keras.layers.Dense(int(units), activation="tanh", name=BOTTLENECK_LAYER)(x)


def _build_mnist(keras: Any, input_shape: tuple[int, ...], num_classes: int, bottleneck: int | None = None) -> Any:
    """Fig. 3 (IV-A1), layers numbered as in the paper; the head continues from the bottleneck when there is one."""
    layers, l2 = keras.layers, keras.regularizers.L2(WEIGHT_DECAY)

    def conv(filters: int) -> Any:
        return layers.Conv2D(filters, (3, 3), strides=1, padding="valid", kernel_regularizer=l2)

    inputs = keras.Input(shape=input_shape)                       # 1
    x = conv(32)(inputs)                                          # 3
    x = layers.Activation("relu")(x)                              # 4
    x = layers.BatchNormalization(axis=-1, momentum=BN_MOMENTUM)(x)  # 5
    x = conv(32)(x)                                               # 6
    x = layers.Activation("relu")(x)                              # 7
    x = layers.MaxPooling2D(pool_size=(2, 2))(x)                  # 8
    x = layers.BatchNormalization(axis=-1, momentum=BN_MOMENTUM)(x)  # 9
    x = conv(64)(x)                                               # 10
    x = layers.Activation("relu")(x)                              # 11
    x = layers.BatchNormalization(axis=-1, momentum=BN_MOMENTUM)(x)  # 12
    x = conv(64)(x)                                               # 13
    x = layers.Activation("relu")(x)                              # 14
    x = layers.MaxPooling2D(pool_size=(2, 2))(x)                  # 15
    x = layers.Flatten(name=FLATTEN_LAYER)(x)                     # 16: r = 1,024 on 28×28
    x = _bottleneck(keras, x, bottleneck)                         # (--release bottleneck:K only)
    x = layers.BatchNormalization(axis=-1, momentum=BN_MOMENTUM)(x)  # 17
    x = layers.Dense(512)(x)                                      # 18
    x = layers.Activation("relu")(x)                              # 19
    x = layers.BatchNormalization(axis=-1, momentum=BN_MOMENTUM)(x)  # 20
    x = layers.Dropout(0.2)(x)                                    # 21
    outputs = layers.Dense(num_classes, activation="softmax")(x)  # 22-23
    return keras.Model(inputs, outputs, name=MNIST_CNN.replace("-", "_"))


def _build_cifar(keras: Any, input_shape: tuple[int, ...], num_classes: int, bottleneck: int | None = None) -> Any:
    """Fig. 4 (IV-A1); for FMNIST only the input layer changes to 28×28×1. The head follows the bottleneck, if any."""
    layers, l2 = keras.layers, keras.regularizers.L2(WEIGHT_DECAY)
    inputs = keras.Input(shape=input_shape)
    x = inputs
    for filters, dropout in ((32, 0.2), (64, 0.3), (128, 0.4)):  # layers 3-10, 11-18, 19-26
        for _ in range(2):
            x = layers.Conv2D(filters, (3, 3), strides=1, padding="same", kernel_regularizer=l2)(x)
            x = layers.Activation("elu")(x)
            x = layers.BatchNormalization(axis=-1, momentum=BN_MOMENTUM)(x)
        x = layers.MaxPooling2D(pool_size=(2, 2))(x)
        x = layers.Dropout(dropout)(x)
    x = layers.Flatten(name=FLATTEN_LAYER)(x)                     # 27: r = 1,152 (28×28×1) / 2,048 (32×32×3)
    x = _bottleneck(keras, x, bottleneck)                         # (--release bottleneck:K only)
    outputs = layers.Dense(num_classes, activation="softmax")(x)  # 28
    return keras.Model(inputs, outputs, name=CIFAR_CNN.replace("-", "_"))


_ARCHITECTURES: dict[str, Architecture] = {}


def register(arch: Architecture) -> Architecture:
    """Add an extractor to the registry; a second registration of a name fails."""
    if arch.name in _ARCHITECTURES or arch.name == AUTO:
        raise ValueError(f"extractor name {arch.name!r} is already registered or reserved")
    _ARCHITECTURES[arch.name] = arch
    return arch


register(Architecture(MNIST_CNN, "LDPFL Fig. 3, IV-A1", "MNIST net: 4 valid convs, 2 pools", _mnist_width,
                      _build_mnist))
register(Architecture(CIFAR_CNN, "LDPFL Fig. 4, IV-A1", "CIFAR-10/SVHN/FMNIST net: 6 same convs, 3 pools",
                      _cifar_width, _build_cifar))
register(Architecture(NO_EXTRACTOR, "Wu et al. (logistic-regression setting)", "flattened raw inputs in [0, 1]",
                      _none_width))


def extractor_names() -> list[str]:
    """Return the registered extractor names (``auto`` not included)."""
    return sorted(_ARCHITECTURES)


def architecture(name: str) -> Architecture:
    """Return the registered extractor ``name``; an unknown name lists the valid ones."""
    try:
        return _ARCHITECTURES[name]
    except KeyError:
        raise ValueError(f"unknown extractor {name!r}; valid names: {', '.join([AUTO, *extractor_names()])}") from None


def resolve_extractor(name: str, dataset: str, *, dp: bool = False) -> str:
    """``auto`` becomes the paper's extractor for ``dataset`` (``ldpfl.contract.datasets``; ``none`` for own data).

    With ``dp`` (DP-SGD training, ``--cnn-epsilon``) ``auto`` becomes the small DP net ``dp-cnn`` wherever the
    paper uses a CNN (``ldpfl.stage1_features.models.dp_nets``).
    """
    if name == AUTO:
        chosen = DATASETS.get(dataset).extractor if dataset in DATASETS else NO_EXTRACTOR
        return DP_AUTO_EXTRACTOR if dp and chosen != NO_EXTRACTOR else chosen
    return architecture(name).name


def flatten_width(name: str, input_shape: tuple[int, ...], options: Mapping[str, Any] | None = None) -> int:
    """r: the width of the flatten layer of extractor ``name`` on inputs of ``input_shape`` (no TensorFlow).

    Parameters
    ----------
    name : str
        A registered extractor (``extractor_names()``).
    input_shape : tuple of int
        One sample's shape: (height, width, channels) for the CNNs, anything for ``none``.
    options : mapping, optional
        A weight-free extractor's options (``scatter``: ``scatter_j``, ``scatter_l``); default its defaults.

    Returns
    -------
    int
        1,024 for ``mnist-cnn`` on 28×28×1; 1,152 / 2,048 for ``cifar-cnn`` on 28×28×1 / 32×32×3; 3,969 for
        ``scatter`` (J = 2, L = 8) on 28×28×1.

    Raises
    ------
    ValueError
        An unknown name, or an input the net cannot take (not an image, or too small).
    """
    shape = tuple(int(s) for s in input_shape)
    if is_fixed(name):
        return fixed_extractor(name, options).width(shape)
    return architecture(name).flatten_width(shape)


def is_cnn(name: str) -> bool:
    """Return whether extractor ``name`` is a CNN that is trained (``none`` and ``scatter`` are not)."""
    return architecture(name).builder is not None


def is_fixed(name: str) -> bool:
    """Return whether extractor ``name`` is a weight-free function of each record (``scatter``), not raw inputs."""
    return architecture(name).fixed is not None


def fixed_extractor(name: str, options: Mapping[str, Any] | None = None) -> Any:
    """Return the weight-free extractor ``name`` with ``options`` (``ParameterError`` naming a bad one)."""
    arch = architecture(name)
    if arch.fixed is None:
        raise ValueError(f"extractor {name!r} is not a weight-free extractor")
    return arch.fixed(dict(options or {}))


def extractor_options(name: str) -> dict[str, Any]:
    """Return the options extractor ``name`` takes, with their defaults (empty for the CNNs and ``none``)."""
    return {} if name == AUTO else dict(architecture(name).options)


def option_defaults() -> dict[str, Any]:
    """Return every registered extractor option (an ``ExportConfig`` field) with its default."""
    return {key: value for arch in _ARCHITECTURES.values() for key, value in arch.options.items()}


# ----------------------------------------------------------------------------------------------------
# TensorFlow / Keras: everything below imports it lazily.


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, *, bottleneck: int | None = None) -> Any:
    """Build the (untrained) Keras model of extractor ``name``; its flatten layer is named FLATTEN_LAYER.

    With ``bottleneck`` = K, a K-unit tanh layer named BOTTLENECK_LAYER follows the flatten layer and the
    head continues from it (``--release bottleneck:K``). Weights are initialized from Keras' global seed:
    call ``keras.utils.set_random_seed`` first for a reproducible model.
    """
    arch = architecture(name)
    if arch.builder is None:
        raise ValueError(f"extractor {name!r} has no model to build")
    flatten_width(name, input_shape)  # validates the input shape with a clear message
    if num_classes < 2:
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    if bottleneck is not None and not 1 <= int(bottleneck) <= flatten_width(name, input_shape):
        raise ValueError(f"bottleneck must lie in [1, {flatten_width(name, input_shape)}], got {bottleneck!r}")
    return arch.builder(import_keras(), tuple(int(s) for s in input_shape), int(num_classes), bottleneck)


@dataclass(frozen=True)
class TrainingConfig:
    """Client CNN training of IV-C. ``epochs`` is 50 in the paper."""

    epochs: int = 50
    batch_size: int = 64
    augment: bool = True
    learning_rate: float = 1e-3
    # (first epoch, counted from 1, that uses the rate, rate): IV-C's drops after epochs 75 and 100.
    lr_drops: tuple[tuple[int, float], ...] = ((76, 5e-4), (101, 3e-4))
    decay: float = 1e-6  # RMSprop(lr=0.001, decay=1e-6): lr / (1 + decay · step)
    rotation_degrees: float = 15.0
    shift: float = 0.1
    # Compile each training step with XLA (TensorFlow's jit_compile; Keras turns it off on CPU-only machines
    # by default). The jax backend always compiles; the torch backend ignores this. bench/cnn_training.py.
    xla: bool = False

    def __post_init__(self) -> None:
        for key, value, low in (("epochs", self.epochs, 1), ("batch_size", self.batch_size, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{key} must be an integer >= {low}, got {value!r}")
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise ValueError(f"learning_rate must be a finite number > 0, got {self.learning_rate!r}")

    def learning_rate_at(self, epoch: int) -> float:
        """Return the scheduled rate of ``epoch`` (counted from 1), before the per-step decay."""
        rate = self.learning_rate
        for first_epoch, value in self.lr_drops:
            if epoch >= first_epoch:
                rate = value
        return rate

    def to_dict(self) -> dict[str, Any]:
        """Return the settings as a JSON-ready dict (the manifest's ``training``)."""
        return {"epochs": self.epochs, "batch_size": self.batch_size, "augment": self.augment,
                "optimizer": "rmsprop", "learning_rate": self.learning_rate,
                "lr_drops": [list(d) for d in self.lr_drops],
                "decay": self.decay, "rotation_degrees": self.rotation_degrees if self.augment else 0.0,
                "shift": self.shift if self.augment else 0.0, "xla": self.xla}


def _schedule(keras: Any, config: TrainingConfig, steps_per_epoch: int) -> Any:
    """IV-C's piecewise-constant rate per epoch, divided by (1 + decay · step) as legacy RMSprop did."""
    ops = keras.ops

    class PaperSchedule(keras.optimizers.schedules.LearningRateSchedule):
        def __call__(self, step: Any) -> Any:
            step = ops.cast(step, "float32")
            epoch = ops.floor(step / float(steps_per_epoch)) + 1.0  # counted from 1
            rate = ops.full_like(step, config.learning_rate)
            for first_epoch, value in config.lr_drops:
                rate = ops.where(epoch >= float(first_epoch), value, rate)
            return rate / (1.0 + config.decay * step)

        def get_config(self) -> dict[str, Any]:
            return {"steps_per_epoch": steps_per_epoch, **config.to_dict()}

    return PaperSchedule()


def _jit_compile(keras: Any, config: TrainingConfig) -> bool:
    """Keras' ``jit_compile`` for this backend: XLA on TensorFlow when asked, always on jax, never on torch."""
    backend = keras.backend.backend()
    return backend == "jax" or (backend == "tensorflow" and config.xla)


@dataclass
class TrainingResult:
    """What training returns: per-epoch loss and accuracy on the client's training split."""

    history: dict[str, list[float]] = field(default_factory=dict)
    samples_per_s: float = math.nan


def train_model(model: Any, x: np.ndarray, y: np.ndarray, config: TrainingConfig, *, rng: np.random.Generator,
                progress: bool = False, description: str = "train", position: int | None = None,
                callbacks: list[Any] | None = None) -> TrainingResult:
    """Train ``model`` on (x, y) as IV-C says: RMSprop, batch 64, augmentation, the LR schedule.

    Parameters
    ----------
    model : keras.Model
        From ``build_model``; trained in place (augmentation runs in a training-only wrapper).
    x, y : np.ndarray
        float32 images in [0, 1] of the model's input shape, and int labels.
    config : TrainingConfig
        Epochs, batch size, augmentation and the learning-rate schedule.
    rng : np.random.Generator
        Source of every random draw of training (shuffling, augmentation, dropout): Keras' global seed
        and the augmentation layers' seeds are integers drawn from it. (Weight initialization happens
        earlier, in ``build_model``, from the global seed the caller set.)
    progress, description, position
        A tqdm bar per epoch on stderr, labelled ``description``, at tqdm ``position``.
    callbacks : list, optional
        Extra Keras callbacks (the benchmark's clock).

    Returns
    -------
    TrainingResult
        Per-epoch loss/accuracy on the training data and the training rate in samples/s.
    """
    import time

    keras = import_keras()
    # Keras/TensorFlow need integer seeds: derive them from the client's own Generator (never global state).
    keras.utils.set_random_seed(int(rng.integers(2**31)))
    steps = max(1, math.ceil(len(x) / config.batch_size))
    trainer = model
    if config.augment:
        layers = keras.layers
        trainer = keras.Sequential([
            keras.Input(shape=model.input_shape[1:]),
            layers.RandomRotation(config.rotation_degrees / 360.0, fill_mode="nearest", seed=int(rng.integers(2**31))),
            layers.RandomTranslation(config.shift, config.shift, fill_mode="nearest", seed=int(rng.integers(2**31))),
            model,
        ], name="augmented_training")
    trainer.compile(optimizer=keras.optimizers.RMSprop(learning_rate=_schedule(keras, config, steps)),
                    loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                    jit_compile=_jit_compile(keras, config))
    callbacks = list(callbacks or [])
    if progress:
        callbacks.append(EpochProgress(keras, description, config.epochs, steps, position))
    start = time.perf_counter()
    history = trainer.fit(np.asarray(x, dtype=np.float32), np.asarray(y, dtype=np.int64), batch_size=config.batch_size,
                          epochs=config.epochs, shuffle=True, verbose=0, callbacks=callbacks)
    elapsed = time.perf_counter() - start
    return TrainingResult({k: [float(v) for v in vs] for k, vs in history.history.items()},
                          len(x) * config.epochs / elapsed if elapsed > 0 else math.nan)


def EpochProgress(keras: Any, description: str, epochs: int, steps: int, position: int | None) -> Any:  # noqa: N802
    """Return a Keras callback drawing one tqdm bar per epoch (batches) on stderr."""
    from tqdm.auto import tqdm

    class _EpochProgress(keras.callbacks.Callback):
        bar: Any = None

        def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
            self.bar = tqdm(total=steps, desc=f"{description} epoch {epoch + 1}/{epochs}", unit="batch",
                            leave=False, position=position, dynamic_ncols=True)

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            self.bar.update(1)
            if logs and batch % 10 == 0:
                self.bar.set_postfix(loss=f"{float(logs.get('loss', math.nan)):.3f}",
                                     acc=f"{float(logs.get('accuracy', math.nan)):.3f}", refresh=False)

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            self.bar.close()

    return _EpochProgress()


class FeatureExtractor:
    """The trained model's flatten-layer output (Algorithm 1 line 6), or another layer's, and its softmax."""

    def __init__(self, model: Any, layer: str = FLATTEN_LAYER):
        keras = import_keras()
        self.model = model
        self._both = keras.Model(model.input, [model.get_layer(layer).output, model.output])
        self.width = int(self._both.outputs[0].shape[-1])

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(flatten features float32 (b, r), class probabilities (b, classes)) for one batch (inference mode)."""
        features, probabilities = self._both.predict_on_batch(np.asarray(x, dtype=np.float32))  # compiled, any backend
        return np.asarray(features, dtype=np.float32), np.asarray(probabilities)

    def batches(self, x_source: Callable[[np.ndarray], np.ndarray], rows: int, batch_rows: int
                ) -> Iterator[tuple[slice, np.ndarray, np.ndarray]]:
        """Yield (row slice, features, probabilities) over ``rows`` rows fetched by ``x_source(positions)``."""
        for start in range(0, rows, batch_rows):
            stop = min(rows, start + batch_rows)
            features, probabilities = self.predict(x_source(np.arange(start, stop)))
            yield slice(start, stop), features, probabilities


def save_model(model: Any, path: str | os.PathLike) -> Path:
    """``model.save`` to ``path`` (must end in .keras) through a temporary name and a rename (atomic)."""
    path = Path(path)
    if path.suffix != ".keras":
        raise ValueError(f"model path must end in .keras, got {path.name!r}")
    with atomic_path(path, suffix=".keras") as tmp:  # Keras 3 insists on the .keras suffix
        model.save(tmp)
    return path
