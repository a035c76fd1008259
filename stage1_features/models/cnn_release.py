"""The client CNN's release side (issue 17, issue 15 item 2): saved models, the bottleneck, noise-aware training.

* :func:`load_model` reads a CNN saved by ``cnn.save_model`` (``--from-models``);
* :func:`bottleneck_units` finds K of the ``--release bottleneck:K`` layer (``cnn.BOTTLENECK_LAYER``);
* :func:`noise_aware_model` wraps a bottleneck CNN for ``--noise-aware`` training.

TensorFlow and Keras are imported only inside the functions.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ldpfl.stage1_features.models.cnn import BOTTLENECK_LAYER
from ldpfl.stage1_features.models.keras_backend import import_keras


def noise_aware_model(model: Any, variance: tuple[float, float], seed: int) -> Any:
    """Return a training model that adds the release mechanism's noise after the bottleneck (``--noise-aware``).

    The returned model shares every layer (and so every weight) with ``model``; between the bottleneck
    and the head it inserts Gaussian noise of variance ``a + b·x²`` per coordinate (``variance`` = (a, b),
    the mechanism's per-coordinate variance at input x, which is exactly quadratic for Duchi et al.,
    Piecewise and Hybrid, and constant for Laplace and Gaussian). The noise is drawn in training only;
    ``model`` itself, the one saved and used to extract the release, has no noise layer.

    Parameters
    ----------
    model : keras.Model
        A model of ``build_model(..., bottleneck=K)``: flatten, bottleneck, then a chain of head layers.
    variance : (float, float)
        (a, b) of the per-coordinate variance a + b·x².
    seed : int
        Seed of the noise draws (from the client's training stream).
    """
    keras = import_keras()
    ops = keras.ops
    a, b = (float(v) for v in variance)

    class MechanismNoise(keras.layers.Layer):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__(name="training_mechanism_noise")
            self.generator = keras.random.SeedGenerator(seed)

        def call(self, x: Any, training: Any = None) -> Any:
            if not training:
                return x
            std = ops.sqrt(ops.maximum(a + b * ops.square(x), 0.0))
            return x + std * keras.random.normal(ops.shape(x), seed=self.generator)

    names = [layer.name for layer in model.layers]
    start = names.index(BOTTLENECK_LAYER)
    x = MechanismNoise()(model.get_layer(BOTTLENECK_LAYER).output)
    for layer in model.layers[start + 1:]:  # the head: a chain of single-input layers
        x = layer(x)
    return keras.Model(model.input, x, name=f"{model.name}_noise_aware")


def bottleneck_units(model: Any) -> int | None:
    """Return K of the model's BOTTLENECK_LAYER, or None when it has none."""
    try:
        layer = model.get_layer(BOTTLENECK_LAYER)
    except ValueError:
        return None
    return int(layer.units)


def load_model(path: str | os.PathLike) -> Any:
    """Load a client CNN saved by ``save_model`` (``--from-models``), uncompiled: it only predicts."""
    keras = import_keras()
    try:
        return keras.models.load_model(Path(path), compile=False)
    except Exception as error:  # noqa: BLE001 - Keras raises many types for a bad file
        raise ValueError(f"{path}: not a loadable Keras model ({' '.join(str(error).split())[:160]})") from None
