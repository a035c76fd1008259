"""The keyword arguments of ``ldpfl.export`` and ``ldpfl.federate``: the fields of their configs, typed.

:class:`ExportFields` holds the fields of ``ExportConfig`` (``ldpfl.stage1_features.export.config``) but
``plan``, which the job takes as a path or a ``SharedPlan`` of its own; :class:`FederationFields` the fields of
``FederationConfig`` (``ldpfl.stage2_federate.config``). A test checks that both list exactly those fields.
Each is ``total=False``: a field left out keeps the config's default, which :func:`config_defaults` reads (the
command line shows them in ``--help``).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable, Mapping
from typing import Any, TypedDict

from ldpfl.common.errors import ParameterError

StrPath = str | os.PathLike[str]
"""A path argument: a string or a ``pathlib.Path``."""


def require_directory_name(out: StrPath | None) -> None:
    """Refuse an empty output directory name (``Path("")`` would be the current directory, silently).

    Raises
    ------
    ParameterError
        ``out`` is an empty or blank string.
    """
    if isinstance(out, str) and not out.strip():
        raise ParameterError("`out` is empty; give a directory (use '.' for the current one)")


def config_defaults(config: type) -> dict[str, Any]:
    """Return the default of each field of the dataclass ``config`` (``ExportConfig``, ``FederationConfig``)."""
    defaults: dict[str, Any] = {}
    for field in dataclasses.fields(config):
        if field.default is not dataclasses.MISSING:
            defaults[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            defaults[field.name] = field.default_factory()
    return defaults


def function_defaults(function: Callable[..., object]) -> dict[str, Any]:
    """Return the default of each keyword argument of ``function`` that has one (``ldpfl.demo``, ``ldpfl.plan``)."""
    return {name: parameter.default for name, parameter in inspect.signature(function).parameters.items()
            if parameter.default is not inspect.Parameter.empty}


class ExportFields(TypedDict, total=False):
    """``ExportConfig``'s fields as keyword arguments of ``ldpfl.export`` (see that class for each one)."""

    dataset: str
    data_dir: str | None
    clients: int
    max_clients: int | None
    partition: str
    beta: float
    unb: float
    shards_per_client: int
    test_fraction: float
    extractor: str
    epochs: int
    batch_size: int
    augment: bool
    mechanism: str
    mechanism_params: Mapping[str, object]
    limit: int | None
    save_models: bool
    store_input_density: bool
    clients_parallel: int
    keras_backend: str | None
    device: str
    overwrite: bool
    seed: int | None
    release: str
    from_models: str | None
    keep_clean_test: bool
    noise_aware: bool
    data: str | None
    data_options: Mapping[str, object]
    client_index: int | None
    label_epsilon: float | None
    cnn_epsilon: float | None
    cnn_delta: float | None
    scatter_j: int
    scatter_l: int
    local_only: bool
    ray_address: str | None
    ray_cpus_per_client: int
    ray_gpus_per_client: float


class FederationFields(TypedDict, total=False):
    """``FederationConfig``'s fields as keyword arguments of ``ldpfl.federate`` (see that class for each one)."""

    rounds: int
    clients_per_round: int | None
    local_epochs: int
    batch_size: int
    optimizer: str
    lr: float | None
    hidden: tuple[int, ...]
    dropout: float
    head: str
    shrinkage: float | None
    aggregation: str
    sample_weighted: bool
    fraction: float | None
    perturbation: str
    perturb_target: str
    epsilon: float
    client_epsilons: tuple[float, ...] | str | None
    client_ranges: tuple[float, ...] | str | None
    range_length: float
    client_centres: tuple[float, ...] | str | None
    range_centre: float
    clip: float | None
    delta: float | str | None
    sensitivity: float | None
    sample_rate: float | None
    sign_mode: str
    server_lr: float
    drop_per_round: int
    device: str
    threads: int | None
    eval_batch_size: int
    eval_clean: bool
    label_noise_correction: str
    dp_sgd: bool
    noise_multiplier: float | None
    target_epsilon: float | None
    neighbours: str
    eval_epsilon: float | None
    eval_every: int
    local_steps: int
    server_momentum: float
    server_optimizer: str
    server_params: Mapping[str, float]
    max_update_norm: float | None
    max_client_weight: float | None
    trim_fraction: float | None
    outlier_report: bool
    seed: int | None


__all__ = ["ExportFields", "FederationFields", "StrPath", "config_defaults", "function_defaults"]
