"""Record-level DP-SGD training of a client CNN (issue 22 item 3): ``ldpfl export --cnn-epsilon E --cnn-delta D``.

Without DP the client CNN is a function of every training record, and so is the release of every other
record: one record's loss has no finite bound but n·ε. With DP-SGD (Abadi et al. 2016, Algorithm 1) each
optimizer step clips every per-example gradient to L2 norm C, sums them and adds N(0, σ²C²) noise; a record
is used by a step with probability q = b/n (Poisson sampling); T steps compose to (ε, δ) per record by
the privacy-loss-distribution accountant of the Poisson-subsampled Gaussian.

The library is jax-privacy's Keras API (``jax_privacy.keras_api``, Keras 3 on the JAX backend):

* :class:`DPBudget` holds the target (ε, δ) and C, validated as parameters ``cnn_epsilon`` / ``cnn_delta``;
* :func:`train_model_dp` calibrates σ for the target over the planned T = epochs·⌊n/b⌋ steps with the
  library's own ``update_with_calibrated_noise_multiplier``, trains with ``make_private`` and Poisson
  sampling in ``fit`` (``poisson_sampling_in_fit``), and returns the record of what ran
  (``extractor_training``: the accountant's ε for the σ, q, T that ran);
* :func:`batch_mixing_layers` / :func:`refuse_batch_mixing`: BatchNormalization normalizes each record by
  statistics of the whole batch, so one record's gradient depends on the others' and clipping no longer
  bounds a record's influence; such a model is refused (checked on the built model's layers).

Decisions: no augmentation under DP (jax-privacy locates its noise state by position among the model's
non-trainable variables, which augmentation layers' seed states would shift; the run records
``augment: false``); Adam at :data:`DP_LEARNING_RATE` (scale-free, so it suits the unit-norm rescaled
clipped gradients, ``rescale_to_unit_norm``); the test split is never seen by training, so its records
are released by the extractor at no DP cost. Keras and jax-privacy are imported only inside the functions.
"""

from __future__ import annotations

import contextlib
import io
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ldpfl.common.errors import ParameterError
from ldpfl.mechanisms import accounting
from ldpfl.stage1_features.models import cnn
from ldpfl.stage1_features.models.cnn import EpochProgress, TrainingResult
from ldpfl.stage1_features.models.keras_backend import import_keras

MAX_CNN_EPSILON = 100.0
"""The validated range of ``cnn_epsilon`` is (0, 100]: beyond it DP-SGD's noise is negligible and the figure
is no guarantee anyone could sign."""
DEFAULT_CNN_DELTA = 1e-5
DEFAULT_CLIPPING_NORM = 1.0
DP_LEARNING_RATE = 2e-3
LIBRARY = "jax-privacy"
ACCOUNTANT = ("ldpfl.mechanisms.accounting: dp-accounting PLD (add-or-remove-one, value discretization 1e-4) of a "
              "PoissonSampledDpEvent(q, GaussianDpEvent(σ)) composed T times; σ calibrated by jax-privacy")

NO_TRAINING: dict[str, Any] = {"training": "none"}
"""``extractor_training`` of an extractor that is not trained (raw features)."""


def non_private_training(records: int) -> dict[str, Any]:
    """Return ``extractor_training`` of a CNN trained without DP on ``records`` records."""
    return {"training": "non-private", "records": int(records)}


@dataclass(frozen=True)
class DPBudget:
    """The target record-level (ε, δ) of DP-SGD and its clipping norm C.

    Raises
    ------
    ParameterError
        ε not in (0, MAX_CNN_EPSILON] (NaN and inf included), δ not in (0, 1), C not a finite number > 0.
    """

    epsilon: float
    delta: float = DEFAULT_CNN_DELTA
    clipping_norm: float = DEFAULT_CLIPPING_NORM

    def __post_init__(self) -> None:
        check_budget(self.epsilon, self.delta)
        if not _is_number(self.clipping_norm) or not (math.isfinite(self.clipping_norm) and self.clipping_norm > 0):
            raise ParameterError(f"`cnn_clipping_norm` must be a finite number > 0, got {self.clipping_norm!r}")


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float | np.integer | np.floating)


def check_budget(epsilon: Any, delta: Any) -> None:
    """Refuse a DP-SGD target outside ε ∈ (0, MAX_CNN_EPSILON], δ ∈ (0, 1) (``ParameterError`` naming it)."""
    if not _is_number(epsilon) or not (math.isfinite(epsilon) and 0 < epsilon <= MAX_CNN_EPSILON):
        raise ParameterError(f"`cnn_epsilon` must be a finite number in (0, {MAX_CNN_EPSILON:g}], got {epsilon!r}")
    if not _is_number(delta) or not (math.isfinite(delta) and 0 < delta < 1):
        raise ParameterError(f"`cnn_delta` must be a number in the open interval (0, 1), got {delta!r}")


def batch_mixing_layers(model: Any) -> list[str]:
    """Return the names of the layers of ``model`` (nested models included) that mix the records of a batch."""
    keras = import_keras()
    found = []
    for layer in model._flatten_layers(include_self=False, recursive=True):  # noqa: SLF001 - Keras' own walk
        if isinstance(layer, keras.layers.BatchNormalization):
            found.append(layer.name)
    return found


def refuse_batch_mixing(model: Any, extractor: str) -> None:
    """Refuse DP-SGD on a model with a batch-mixing layer (``ParameterError`` naming ``extractor``)."""
    mixing = batch_mixing_layers(model)
    if mixing:
        raise ParameterError(f"`extractor` {extractor!r} has BatchNormalization layers ({', '.join(mixing[:3])}"
                             f"{' ...' if len(mixing) > 3 else ''}), which mix the records of a batch and break "
                             f"per-record DP-SGD; use a GroupNorm variant (e.g. {extractor}-gn or dp-cnn)")


def check_dp_extractor(extractor: str, input_shape: tuple[int, ...], num_classes: int) -> None:
    """Refuse DP-SGD of ``extractor``: not a trained CNN, or (built, on Keras' backend) with batch-mixing layers."""
    if not cnn.is_cnn(extractor):
        raise ParameterError(f"`cnn_epsilon` trains the client CNN with DP-SGD; `extractor` {extractor!r} trains "
                             "none (choose a CNN, e.g. dp-cnn)")
    if num_classes < 2:
        return  # make_plan refuses it with its own message
    refuse_batch_mixing(cnn.build_model(extractor, input_shape, num_classes), extractor)


def library_version() -> str:
    """Return ``"jax-privacy X.Y.Z"``, the version that trains."""
    from importlib.metadata import version

    return f"{LIBRARY} {version(LIBRARY)}"


def accountant_epsilon(noise_multiplier: float, batch_size: int, records: int, steps: int, delta: float) -> float:
    """Return ε (add/remove) of T = ``steps`` Poisson-sampled (q = b/n) Gaussian steps of multiplier σ at δ.

    Composed by the package's one accountant (``ldpfl.mechanisms.accounting``: dp-accounting PLD, discretization
    1e-4), the same as stage 2's DP-SGD; jax-privacy's own accountant (discretization 1e-3) only calibrates σ.
    """
    event = accounting.DpSgdEvent(float(noise_multiplier), int(batch_size) / int(records), int(steps))
    return accounting.epsilon([event], float(delta), neighbours=accounting.ADD_REMOVE)


def dp_keras_config(budget: DPBudget, batch_size: int, records: int, steps: int, *, seed: int,
                    microbatch_size: int | None = None) -> Any:
    """Return jax-privacy's ``DPKerasConfig`` for ``budget`` with σ calibrated by the library over ``steps`` steps.

    Poisson sampling in ``fit`` with expected batch b = ``batch_size`` of n = ``records`` (q = b/n), no
    gradient accumulation; ``update_with_calibrated_noise_multiplier`` finds the σ whose accountant ε is at
    most the target over T = ``steps``. ``microbatch_size`` (jax-privacy's option) splits the per-example
    gradients of a batch into sequential pieces of that size (less memory), and pads Poisson batches to a
    multiple of it (default: 32).
    """
    from jax_privacy import keras_api

    params = keras_api.DPKerasConfig(
        epsilon=float(budget.epsilon), delta=float(budget.delta), clipping_norm=float(budget.clipping_norm),
        batch_size=int(batch_size), gradient_accumulation_steps=1, train_steps=int(steps), train_size=int(records),
        poisson_sampling_in_fit=True, seed=int(seed), microbatch_size=microbatch_size)
    with contextlib.redirect_stdout(io.StringIO()):  # the library prints its progress; stdout may carry --json
        return params.update_with_calibrated_noise_multiplier()


def dp_plan(records: int, batch_size: int, epochs: int) -> tuple[int, int]:
    """Return (b, T): the expected batch b = min(batch_size, n) and T = epochs·⌊n/b⌋ optimizer steps."""
    b = max(1, min(int(batch_size), int(records)))
    return b, int(epochs) * max(1, int(records) // b)


def train_model_dp(model: Any, x: np.ndarray, y: np.ndarray, config: Any, budget: DPBudget, *,
                   rng: np.random.Generator, extractor: str = "model", callbacks: list[Any] | None = None,
                   progress: bool = False, description: str = "train", position: int | None = None,
                   microbatch_size: int | None = None) -> tuple[Any, dict[str, Any]]:
    """Train ``model`` on (x, y) with DP-SGD at ``budget``; return (TrainingResult, ``extractor_training``).

    Parameters
    ----------
    model : keras.Model
        Built on the JAX backend, without batch-mixing layers; trained in place (through a wrapper that
        shares its layers, so ``model`` itself stays a plain, saveable Keras model).
    x, y : np.ndarray
        float32 inputs and int labels: the client's n training records.
    config : cnn.TrainingConfig
        ``epochs`` and ``batch_size`` (the expected Poisson batch); augmentation and the RMSprop schedule
        are not used under DP (module docstring).
    budget : DPBudget
        Target (ε, δ) and clipping norm.
    rng : np.random.Generator
        Source of Keras' seed and of jax-privacy's seed (noise and Poisson sampling).
    microbatch_size : int, optional
        jax-privacy's microbatching (``dp_keras_config``); the benchmark's knob.

    Returns
    -------
    (TrainingResult, dict)
        The per-epoch history and samples/s (records processed: n per epoch in expectation), and the
        record ``{"training": "dp-sgd", "epsilon", "delta", "noise_multiplier", "sampling_probability",
        "steps", "records", "clipping_norm", "library", "accountant", ...}`` with the accountant's ε.
    """
    import time

    keras = import_keras()
    if keras.backend.backend() != "jax":
        raise ParameterError(f"`keras_backend` must be 'jax' for DP-SGD (jax-privacy), got "
                             f"{keras.backend.backend()!r}")
    refuse_batch_mixing(model, extractor)
    from jax_privacy import keras_api

    n = len(x)
    if n < 2:
        raise ParameterError(f"`cnn_epsilon`: DP-SGD needs at least 2 training records, got {n}")
    b, steps = dp_plan(n, config.batch_size, config.epochs)
    keras.utils.set_random_seed(int(rng.integers(2**31)))
    params = dp_keras_config(budget, b, n, steps, seed=int(rng.integers(2**62)),
                             microbatch_size=None if microbatch_size is None else min(int(microbatch_size), b))
    sigma = float(params.noise_multiplier)
    trainer = keras_api.make_private(keras.Model(model.input, model.output, name=f"{model.name}_dp_sgd"), params)
    names = [v.name for v in trainer.non_trainable_variables[:2]]
    if names != ["_rng", "_optimizer_steps"]:  # jax-privacy finds its state by position (see its train step)
        raise RuntimeError(f"jax-privacy's state is not first among the model's non-trainable variables: {names}")
    trainer.compile(optimizer=keras.optimizers.Adam(learning_rate=DP_LEARNING_RATE),
                    loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    callbacks = list(callbacks or [])
    if progress:
        callbacks.append(EpochProgress(keras, description, config.epochs, steps // config.epochs, position))
    start = time.perf_counter()
    history = trainer.fit(np.asarray(x, dtype=np.float32), np.asarray(y, dtype=np.int64), batch_size=b,
                          epochs=config.epochs, verbose=0, callbacks=callbacks)
    elapsed = time.perf_counter() - start
    ran = int(np.asarray(trainer.non_trainable_variables[1].value).item())
    if ran != steps:
        raise RuntimeError(f"DP-SGD ran {ran} optimizer steps, {steps} were accounted for")
    record = {
        "training": "dp-sgd", "epsilon": accountant_epsilon(sigma, b, n, steps, budget.delta),
        "target_epsilon": float(budget.epsilon), "delta": float(budget.delta), "noise_multiplier": sigma,
        "sampling_probability": b / n, "steps": steps, "records": n, "batch_size": b, "epochs": config.epochs,
        "clipping_norm": float(budget.clipping_norm), "optimizer": "adam", "learning_rate": DP_LEARNING_RATE,
        "augment": False, "library": library_version(), "accountant": ACCOUNTANT,
    }
    rate = b * steps / elapsed if elapsed > 0 else math.nan  # expected records per step × steps
    return TrainingResult({k: [float(v) for v in vs] for k, vs in history.history.items()}, rate), record
