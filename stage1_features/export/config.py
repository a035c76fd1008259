"""What ``ldpfl export`` takes: :class:`ExportConfig`, its validation, and the IV-D defaults.

The decisions behind the job are in the docstring of ``ldpfl.stage1_features.export.run``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ldpfl import mechanisms
from ldpfl.common.errors import ParameterError
from ldpfl.contract.label_release import label_mechanism
from ldpfl.contract.plan import SharedPlan
from ldpfl.contract.release_point import STATS
from ldpfl.stage1_features.export import release as releases
from ldpfl.stage1_features.export.partition import PARTITION_KINDS
from ldpfl.stage1_features.models import cnn
from ldpfl.stage1_features.models.dp_training import DEFAULT_CNN_DELTA, DPBudget, check_budget
from ldpfl.stage1_features.models.keras_backend import DEVICES, KERAS_BACKENDS

DEFAULT_MECHANISM_PARAMS: dict[str, Any] = {"epsilon": 0.5, "alpha": 10.0, "integer_bits": 4, "fraction_bits": 5}
"""LDPFL IV-D: "we maintained m, n, α, and ε at 4, 5, 10, and 0.5"."""

# Config fields that change what the files hold: a resumed run must agree on all of them.
COMPARED_FIELDS = ("dataset", "clients", "max_clients", "partition", "beta", "unb", "shards_per_client",
                   "test_fraction", "extractor", "epochs", "batch_size", "augment", "mechanism", "mechanism_params",
                   "limit", "store_input_density", "randomness", "data", "data_options", "client_index", "plan")

SAVED_MODEL_WARNING = ("saved models are trained on the raw client data: they are NOT covered by the LDP "
                       "guarantee and must stay with the client")
DP_SAVED_MODEL_WARNING = ("saved models are trained on the raw client data with DP-SGD: each is covered by its "
                          "(ε, δ) in the client file's extractor_training, not by the LDP guarantee of the release")
NOT_PRIVATE_WARNING = ("mechanism {mechanism!r} gives an infinite ε per record (none writes the UNRANDOMIZED "
                       "features): these files are NOT private")
LOCAL_ONLY_WARNING = ("local-only files (local_only): clean features and true labels, NOT private (epsilon = inf if "
                      "shipped); they must never leave the silo: only DP-SGD updates may")
RAY_INSTALL_HINT = "`ray_address` runs the clients on Ray, which is not installed here: pip install 'ray>=2.10'"
RAY_FIELDS = ("ray_address", "ray_cpus_per_client", "ray_gpus_per_client")
"""How the clients run on a Ray cluster (``stage1_features.export.ray_executor``): not what the files hold."""

DENSITY_WARNING = ("/stats/input_bit_density is an aggregate of the UNRANDOMIZED encoding: it is NOT covered by "
                   "the LDP guarantee")


def exportable_mechanisms(release: str | None = None) -> list[str]:
    """Return the registered mechanisms that ``ldpfl export`` can apply to ``release``, sorted.

    Without ``release``: every mechanism some release takes (``--mechanism``'s choices).
    """
    if release is None:
        return releases.exportable_mechanisms()
    return releases.release_mechanisms(releases.parse_release(release))


@dataclass(frozen=True)
class ExportConfig:
    """Everything ``ldpfl export`` takes. ``seed`` is used, never stored.

    ``mechanism_params`` holds ε, α, m, n and any other parameter of ``mechanism`` (IV-D defaults).
    ``limit`` caps the pooled records used (drawn at random), for quick runs.

    Own data (issue 16, ``ldpfl.stage1_features.export.silo``): ``data`` is the user's file or image folder, read with
    ``data_options`` (``silo.DATA_OPTIONS``); ``dataset`` is then the name the files record. With
    ``client_index`` (single-silo mode) the whole input is client ``client_index``'s of ``clients``: no
    partitioning. ``plan`` is the shared plan the export must agree with (``ldpfl.contract.plan``).

    ``ray_address`` (auto, local or a cluster's address) runs each client as a Ray task declaring
    ``ray_cpus_per_client`` CPUs and ``ray_gpus_per_client`` GPUs (``ray_executor``, docs/cluster.md); like
    ``device``, these say how the work runs, not what the files hold, and are not written to the manifest.
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
    keras_backend: str | None = None  # None: TensorFlow, or jax under DP-SGD (resolved at construction)
    device: str = "auto"  # keras_backend.DEVICES; how the work runs, not what it computes: not in the manifest
    overwrite: bool = False
    seed: int | None = None
    release: str = "flatten"
    from_models: str | None = None
    keep_clean_test: bool = False
    noise_aware: bool = False
    data: str | None = None
    data_options: Mapping[str, Any] = field(default_factory=dict)
    client_index: int | None = None
    plan: SharedPlan | None = None
    label_epsilon: float | None = None
    cnn_epsilon: float | None = None
    cnn_delta: float | None = None
    scatter_j: int = cnn.option_defaults()["scatter_j"]
    scatter_l: int = cnn.option_defaults()["scatter_l"]
    local_only: bool = False
    ray_address: str | None = None  # auto, local or a cluster's address: each client one Ray task (issue 32)
    ray_cpus_per_client: int = 1
    ray_gpus_per_client: float = 0.0

    def __post_init__(self) -> None:
        _int_at_least("clients", self.clients, 1)
        _int_at_least("clients_parallel", self.clients_parallel, 1)
        if self.device not in DEVICES:
            raise ParameterError(f"`device` must be one of {', '.join(DEVICES)}, got {self.device!r}")
        _int_at_least("shards_per_client", self.shards_per_client, 1)
        if self.max_clients is not None and _int_at_least("max_clients", self.max_clients, 1) < self.clients:
            raise ValueError(f"max_clients (N_h) must be >= clients ({self.clients}), got {self.max_clients}")
        if self.limit is not None:
            _int_at_least("limit", self.limit, 1)
        if not isinstance(self.test_fraction, int | float) or not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"test_fraction must lie in the open interval (0, 1), got {self.test_fraction!r}")

        if self.partition not in PARTITION_KINDS:
            raise ValueError(f"partition must be one of {', '.join(PARTITION_KINDS)}; got {self.partition!r}")
        if not isinstance(self.beta, int | float) or not math.isfinite(self.beta) or self.beta <= 0:
            raise ValueError(f"beta must be a finite number > 0, got {self.beta!r}")
        if not isinstance(self.unb, int | float) or not 0.0 <= self.unb <= 1.0:
            raise ValueError(f"unb must be a number in [0, 1], got {self.unb!r}")
        if self.extractor != cnn.AUTO:
            cnn.architecture(self.extractor)
        self.check_extractor_options(self.extractor)

        try:
            point = releases.parse_release(self.release)
        except ValueError as error:
            raise ParameterError(f"`release`: {error}") from None
        object.__setattr__(self, "release", str(point))
        releases.check_mechanism(point, self.mechanism)
        if self.noise_aware and point.kind != "bottleneck":
            raise ParameterError(f"`noise_aware` trains the release layer against the mechanism's noise: it needs "
                                 f"`release` bottleneck:K, got {str(point)!r}")
        if self.noise_aware and self.from_models is not None:
            raise ParameterError("`noise_aware` shapes the CNN's training; `from_models` reuses trained CNNs")
        if not isinstance(self.mechanism_params, Mapping):
            raise ValueError(f"mechanism_params must be a mapping, got {type(self.mechanism_params).__name__}")
        for key in ("epsilon", "alpha"):  # NaN and ∞ are refused by name, before any mechanism is built
            value = self.mechanism_params.get(key)
            if isinstance(value, float) and not math.isfinite(value):
                raise ParameterError(f"`{key}` must be a finite number, got {value!r}")
        self.training()  # validates epochs and batch_size
        self._check_dp()
        if self.keras_backend not in KERAS_BACKENDS:
            raise ParameterError(f"`keras_backend` must be one of {', '.join(KERAS_BACKENDS)}, "
                                 f"got {self.keras_backend!r}")
        require_own_data([k for k in ("client_index", "plan") if getattr(self, k) is not None]
                         + list(self.data_options or ()), self.data)
        if self.client_index is not None:
            if _int_at_least("client_index", self.client_index, 0) >= self.clients:
                raise ParameterError(f"`client_index` must be in [0, {self.clients - 1}] (`clients` = "
                                     f"{self.clients}), got {self.client_index}")
        if self.label_epsilon is not None:
            _check_label_epsilon(self.label_epsilon)
            object.__setattr__(self, "label_epsilon", float(self.label_epsilon))
        self._check_local_only()
        self._check_statistics_release(point)
        self._check_ray()

    def _check_statistics_release(self, point: releases.ReleasePoint) -> None:
        """``release`` stats:K (issue 40): no CNN, no per-record option; the extractor must be one no record trained."""
        if point.kind != STATS:
            return
        given = [name for name, value in (("label_epsilon", self.label_epsilon), ("noise_aware", self.noise_aware),
                                          ("from_models", self.from_models), ("cnn_epsilon", self.cnn_epsilon),
                                          ("local_only", self.local_only), ("save_models", self.save_models),
                                          ("store_input_density", self.store_input_density)) if value]
        if given:
            raise ParameterError(f"`release` {point} releases statistics once (labels included), through an "
                                 f"extractor no record trained: leave out {', '.join(f'`{g}`' for g in given)}")
        if self.extractor != cnn.AUTO and cnn.is_cnn(self.extractor):
            raise ParameterError(f"`release` {point} needs an extractor no record trained (scatter, or none on "
                                 f"tables): `extractor` {self.extractor!r} is trained on the silo's records, so its "
                                 "weights would leave with the statistics unaccounted")

    def _check_ray(self) -> None:
        """``ray_address`` and each client task's resources; Ray itself is looked for, not imported."""
        if self.ray_address is None:
            if self.ray_cpus_per_client != 1 or self.ray_gpus_per_client != 0:
                raise ParameterError("`ray_cpus_per_client` and `ray_gpus_per_client` are the resources of a Ray "
                                     "task: give `ray_address` as well")
            return
        if not isinstance(self.ray_address, str) or not self.ray_address.strip():
            raise ParameterError(f"`ray_address` must be auto, local or a cluster's address (host:port), "
                                 f"got {self.ray_address!r}")
        if self.clients_parallel != 1:
            raise ParameterError("`clients_parallel` spreads the clients over local processes and `ray_address` "
                                 "over a Ray cluster: give one of them")
        _int_at_least("ray_cpus_per_client", self.ray_cpus_per_client, 1)
        gpus = self.ray_gpus_per_client
        if isinstance(gpus, bool) or not isinstance(gpus, int | float) or not math.isfinite(gpus) or gpus < 0:
            raise ParameterError(f"`ray_gpus_per_client` must be a finite number >= 0, got {gpus!r}")
        if importlib.util.find_spec("ray") is None:
            raise ParameterError(RAY_INSTALL_HINT)

    def extractor_options(self, extractor: str | None = None) -> dict[str, Any]:
        """Return the fields that are options of ``extractor`` (default this config's): ``scatter_j``, ``scatter_l``."""
        return {key: getattr(self, key) for key in cnn.extractor_options(extractor or self.extractor)}

    def check_extractor_options(self, extractor: str) -> None:
        """Refuse an option of another extractor than ``extractor`` (resolved, or ``auto``: not yet) and bad values.

        Raises ``ParameterError`` naming the field (``scatter_j``, ``scatter_l``).
        """
        if extractor == cnn.AUTO:
            return
        taken = cnn.extractor_options(extractor)
        for key, default in cnn.option_defaults().items():
            if key not in taken and getattr(self, key) != default:
                owners = [n for n in cnn.extractor_names() if key in cnn.extractor_options(n)]
                raise ParameterError(f"`{key}` applies to `extractor` {' or '.join(owners)}, not {extractor!r}")
        if cnn.is_fixed(extractor):
            cnn.fixed_extractor(extractor, self.extractor_options(extractor))

    def _check_local_only(self) -> None:
        """``local_only``: files that never leave the silo hold clean features (``none``) and true labels."""
        if not self.local_only:
            return
        if self.mechanism != "none":
            raise ParameterError(f"`local_only` files hold the clean features: `mechanism` must be 'none', got "
                                 f"{self.mechanism!r}")
        if (self.label_epsilon is not None or self.keep_clean_test or self.plan is not None
                or self.store_input_density):
            raise ParameterError("`local_only` files hold clean features and true labels and are never shared: "
                                 "leave out `label_epsilon`, `keep_clean_test`, `store_input_density` and `plan`")
        if not releases.parse_release(self.release).is_flatten:
            raise ParameterError(f"`local_only` files hold the extractor's features: `release` must be flatten, "
                                 f"got {self.release!r}")

    def _check_dp(self) -> None:
        """DP-SGD of the client CNNs (``cnn_epsilon``, ``cnn_delta``): validate, and pick jax as the backend."""
        if self.cnn_epsilon is None:
            if self.cnn_delta is not None:
                raise ParameterError("`cnn_delta` is the δ of DP-SGD training: give `cnn_epsilon` as well")
            if self.keras_backend is None:
                object.__setattr__(self, "keras_backend", "tensorflow")
            return
        delta = DEFAULT_CNN_DELTA if self.cnn_delta is None else self.cnn_delta
        check_budget(self.cnn_epsilon, delta)
        object.__setattr__(self, "cnn_epsilon", float(self.cnn_epsilon))
        object.__setattr__(self, "cnn_delta", float(delta))
        if self.keras_backend is None:
            object.__setattr__(self, "keras_backend", "jax")
        elif self.keras_backend != "jax":
            raise ParameterError(f"`keras_backend` must be jax under `cnn_epsilon` (DP-SGD by jax-privacy), "
                                 f"got {self.keras_backend!r}")
        if self.from_models is not None:
            raise ParameterError("`cnn_epsilon` trains the CNNs with DP-SGD; `from_models` reuses trained CNNs "
                                 "(their training record is carried along)")
        if self.noise_aware:
            raise ParameterError("`noise_aware` is not available under `cnn_epsilon` (DP-SGD) yet")

    def dp_budget(self) -> Any:
        """Return the ``dp_training.DPBudget`` of DP-SGD training, or None for ordinary training."""
        if self.cnn_epsilon is None:
            return None

        assert self.cnn_delta is not None  # filled in at construction
        return DPBudget(self.cnn_epsilon, self.cnn_delta)

    def exported_clients(self) -> list[int]:
        """Return the client indices this export writes: all N, or the silo's own in single-silo mode."""
        return list(range(self.clients)) if self.client_index is None else [self.client_index]

    def training(self) -> cnn.TrainingConfig:
        """Return the CNN training settings (IV-C)."""
        # no augmentation under DP-SGD (``ldpfl.stage1_features.models.dp_training``)
        return cnn.TrainingConfig(epochs=self.epochs, batch_size=self.batch_size,
                                  augment=self.augment and self.cnn_epsilon is None)

    def mechanism_spec(self, features: int | None) -> mechanisms.MechanismSpec:
        """Resolve ``mechanism`` and ``mechanism_params`` over records of ``features`` values (r).

        A key of ``DEFAULT_MECHANISM_PARAMS`` that the mechanism does not take is dropped while it
        keeps its IV-D default, and refused otherwise (``MechanismSpec.resolve``).
        """
        return mechanisms.MechanismSpec.resolve(self.mechanism, self.mechanism_params, features=features,
                                                defaults=DEFAULT_MECHANISM_PARAMS)

    def public_dict(self) -> dict[str, Any]:
        """Return the config as written to the manifest: everything but the seed, the device and the Ray settings."""
        out = dataclasses.asdict(dataclasses.replace(self, plan=None))
        for key in ("seed", "device", *RAY_FIELDS):  # a cluster's address is nobody's business in a shared file
            del out[key]
        out["mechanism_params"] = dict(self.mechanism_params)
        out["data_options"] = {k: list(v) if isinstance(v, tuple) else v for k, v in self.data_options.items()}
        out["plan"] = None if self.plan is None else self.plan.fingerprint
        return out


def require_own_data(settings: list[str], data: object) -> None:
    """Refuse settings of the user's own data (``plan``, ``client_index``, a reader option) without ``data``.

    ``ldpfl export`` calls it with the flags given (``name`` among them), the config with its fields, so both
    refuse with the same message.
    """
    if data is not None or not settings:
        return
    first = settings[0]
    if first == "client_index":
        raise ParameterError("`client_index` (single-silo mode) exports the user's own `data`; a benchmark dataset "
                             "is partitioned among the clients instead")
    if first == "plan":
        raise ParameterError("a shared `plan` applies to the user's own `data`")
    raise ParameterError(f"`{first}` applies to the user's own `data`; a benchmark dataset has its own reader")


def _check_label_epsilon(value: Any) -> None:
    """Refuse a label budget that k-RR does not take (finite, > 0, at most ``MAX_EPSILON``), naming the field."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ParameterError(f"`label_epsilon` must be a number, got {value!r}")
    try:
        label_mechanism(float(value), 2)
    except ValueError as error:
        raise ParameterError(f"`label_epsilon` (k-RR of the labels): {error}") from None


def _int_at_least(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)
