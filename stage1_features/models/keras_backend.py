"""Which Keras 3 backend trains and runs the client CNNs (``--keras-backend``), and importing Keras on it.

Keras picks its backend once per process, from ``KERAS_BACKEND``, when it is first imported; spawned export
workers inherit the variable. TensorFlow is the default: the fastest backend for the paper's CNNs on CPU
(bench/cnn_training.py). Nothing here imports a backend before ``import_keras`` is called.

A CNN's float rounding depends on how many CPU threads its backend splits each op over, so a seeded export
fixes them (:data:`SEEDED_THREADS`, :func:`pin_threads`; issue 40).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from ldpfl.common.errors import ParameterError

KERAS_BACKENDS = ("tensorflow", "torch", "jax")  # Keras 3's backends; TensorFlow is the default
SEEDED_THREADS = 1
"""CPU threads (intra-op, and inter-op) of every client's CNN in a seeded export, on every executor (issue 40).

Training rounds differently with another thread count (a sequential export on 2 cores differed from a
``--clients-parallel 2`` one in 0.05-1.7 % of the feature values), so a seed fixes it: one thread, as each
worker of ``--clients-parallel`` K = cores already had. What a seed cannot fix: a GPU (its kernels, not the
threads, decide the rounding), another Keras backend, another TensorFlow build or CPU instruction set.
"""
DEVICES = ("auto", "cpu", "cuda")
"""``--device``: auto (the backend's own choice: a GPU it can see, else the CPU), the CPU, or a CUDA GPU."""


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


def select_device(backend: str, device: str) -> str:
    """Choose the device the CNNs train and run on (``--device``); must run before Keras is imported.

    The choice travels to spawned export workers in the environment: ``KERAS_TORCH_DEVICE`` (torch),
    ``JAX_PLATFORMS`` (jax), ``LDPFL_KERAS_DEVICE`` (read by :func:`import_keras` for TensorFlow).

    Raises
    ------
    ParameterError
        An unknown device, or ``cuda`` where the backend sees no CUDA device (checked here, before any work).
    """
    if device not in DEVICES:
        raise ParameterError(f"`device` must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "auto":
        return device
    if device == "cuda" and not cuda_visible(backend):
        raise ParameterError(f"`device` cuda: the {backend} backend sees no CUDA device here (a CUDA build of "
                             f"{'torch' if backend == 'torch' else backend} and a GPU are needed; see README, "
                             "'Stage 1 on a GPU')")
    os.environ["LDPFL_KERAS_DEVICE"] = device
    if backend == "torch":
        os.environ["KERAS_TORCH_DEVICE"] = device
    elif backend == "jax":
        os.environ["JAX_PLATFORMS"] = device
    return device


def cuda_visible(backend: str) -> bool:
    """Return whether ``backend`` can see a CUDA device (imports the framework, not Keras)."""
    try:
        if backend == "torch":
            import torch

            return bool(torch.cuda.is_available())
        if backend == "jax":
            import jax

            return bool(jax.devices("cuda"))
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        with native_stderr_silenced():
            import tensorflow as tf

        return bool(tf.config.list_physical_devices("GPU"))
    except (ImportError, RuntimeError):  # jax: "Unknown backend cuda" when no CUDA plugin is installed
        return False


@contextlib.contextmanager
def native_stderr_silenced() -> Iterator[None]:
    """Silence file descriptor 2 while a framework's native libraries load.

    TensorFlow 2.21 logs through absl before its log level applies, so ``TF_CPP_MIN_LOG_LEVEL`` cannot stop
    its start-up lines (oneDNN, CPU features); Python exceptions are unaffected (raised after the restore).
    """
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def import_keras(threads: int | None = None) -> Any:
    """Import Keras on its backend (``keras_backend()``, quietly); optionally cap the backend's CPU threads.

    ``threads`` must be set before the backend runs its first op, e.g. in a fresh worker process.
    """
    backend = keras_backend()
    os.environ["KERAS_BACKEND"] = backend
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if backend == "jax" and threads is not None and "jax" not in sys.modules:  # XLA reads its flags at start-up
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _xla_thread_flags(threads)).strip()
    with native_stderr_silenced():
        import keras

    if backend == "tensorflow":
        with native_stderr_silenced():
            import tensorflow as tf

        tf.get_logger().setLevel("ERROR")  # per-client models retrace their predict functions: expected, not news
        if os.environ.get("LDPFL_KERAS_DEVICE") == "cpu":
            try:
                tf.config.set_visible_devices([], "GPU")
            except RuntimeError:  # TensorFlow already initialized in this process: keep its devices
                pass
        if threads is not None:
            try:
                tf.config.threading.set_intra_op_parallelism_threads(int(threads))
                tf.config.threading.set_inter_op_parallelism_threads(_inter_op_threads(threads))
            except RuntimeError:  # TensorFlow already initialized in this process: keep its settings
                pass
    elif backend == "torch":
        import torch

        if threads is not None:
            torch.set_num_threads(int(threads))
        if os.environ.get("KERAS_TORCH_DEVICE", "").startswith("cuda"):  # one seeded stream, one result on the GPU
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.backends.cudnn.benchmark = False
            torch.use_deterministic_algorithms(True)
    return keras


def pin_threads(threads: int) -> bool:
    """Give this process's Keras backend ``threads`` CPU threads where it still can; return whether it has them.

    TensorFlow fixes its thread pools when it runs its first op, and XLA (jax) reads its flags when jax is
    imported: where either already started with other settings, nothing changes and this returns False (the
    caller then trains in a fresh process). torch takes a new count at any time. Setting them lasts for the
    life of the process: TensorFlow cannot be given its default threads back.
    """
    import_keras(threads)
    backend = keras_backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return (tf.config.threading.get_intra_op_parallelism_threads() == int(threads)
                and tf.config.threading.get_inter_op_parallelism_threads() == _inter_op_threads(threads))
    if backend == "torch":
        import torch

        return bool(torch.get_num_threads() == int(threads))
    return _xla_thread_flags(threads) in os.environ.get("XLA_FLAGS", "")  # set by import_keras before jax loaded


def _inter_op_threads(threads: int) -> int:
    return max(1, min(2, int(threads)))


def _xla_thread_flags(threads: int) -> str:
    return f"--xla_cpu_multi_thread_eigen={int(threads) > 1} intra_op_parallelism_threads={int(threads)}"
