"""Which Keras 3 backend trains and runs the client CNNs (``--keras-backend``), and importing Keras on it.

Keras picks its backend once per process, from ``KERAS_BACKEND``, when it is first imported; spawned export
workers inherit the variable. TensorFlow is the default: the fastest backend for the paper's CNNs on CPU
(bench/cnn_training.py). Nothing here imports a backend before ``import_keras`` is called.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from ldpfl.mechanisms.base import ParameterError

KERAS_BACKENDS = ("tensorflow", "torch", "jax")  # Keras 3's backends; TensorFlow is the default


def keras_backend() -> str:
    """Return the Keras backend this process uses: ``KERAS_BACKEND`` (set before Keras is imported), else TensorFlow."""
    name = os.environ.get("KERAS_BACKEND", "tensorflow")
    if name not in KERAS_BACKENDS:
        raise ParameterError(f"keras_backend must be one of {', '.join(KERAS_BACKENDS)}, got {name!r}")
    return name


def select_keras_backend(name: str) -> str:
    """Choose the Keras backend of this process (``--keras-backend``); must run before Keras is imported.

    Raises
    ------
    ParameterError
        An unknown backend, or Keras already imported on another one.
    """
    if name not in KERAS_BACKENDS:
        raise ParameterError(f"keras_backend must be one of {', '.join(KERAS_BACKENDS)}, got {name!r}")
    keras = sys.modules.get("keras")
    if keras is not None and keras.backend.backend() != name:
        raise ParameterError(f"keras_backend {name!r} asked for after Keras was imported on "
                             f"{keras.backend.backend()!r}")
    os.environ["KERAS_BACKEND"] = name
    return name


def import_keras(threads: int | None = None) -> Any:
    """Import Keras on its backend (``keras_backend()``, quietly); optionally cap the backend's CPU threads.

    ``threads`` must be set before the backend runs its first op, e.g. in a fresh worker process.
    """
    backend = keras_backend()
    os.environ["KERAS_BACKEND"] = backend
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if backend == "jax" and threads is not None and "jax" not in sys.modules:  # XLA reads its flags at start-up
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_cpu_multi_thread_eigen={threads > 1}"
                                   f" intra_op_parallelism_threads={int(threads)}").strip()
    import keras

    if backend == "tensorflow":
        import tensorflow as tf

        tf.get_logger().setLevel("ERROR")  # per-client models retrace their predict functions: expected, not news
        if threads is not None:
            try:
                tf.config.threading.set_intra_op_parallelism_threads(int(threads))
                tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, int(threads))))
            except RuntimeError:  # TensorFlow already initialized in this process: keep its settings
                pass
    elif backend == "torch" and threads is not None:
        import torch

        torch.set_num_threads(int(threads))
    return keras
