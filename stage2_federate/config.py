"""``FederationConfig``: everything that defines a federation run, validated at construction.

This module imports no torch: a front end can build and check a configuration before torch loads.
Errors name the configuration's fields (``client_ranges``), never CLI flags; those that name fields
are :class:`~ldpfl.common.errors.ParameterError`, which a front end renders its own way.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ldpfl import mechanisms as mech
from ldpfl.common.errors import ParameterError
from ldpfl.mechanisms.accounting import NEIGHBOURS, REPLACE_ONE
from ldpfl.mechanisms.validation import require_finite_positive, require_int_in_range

from . import budgets
from .options import FEDERATION_OPTIONS
from .perturbation import SIGN_MODES, SIGN_UPDATE, TARGETS, perturbation_names, perturbation_wiring
from .server_optimizers import DEFAULT_SERVER_OPTIMIZER, create_server_optimizer, server_optimizer_names
from .strategies import MEDIAN, NORM_CLIPPED, TRIMMED_MEAN, strategy_names

ROBUST_RULES = (MEDIAN, TRIMMED_MEAN, NORM_CLIPPED)

DEVICES = ("auto", "cpu", "cuda")
DP_SGD_CLIP = 0.1
"""C of DP-SGD when ``clip`` is not given: Tramèr & Boneh 2021's choice for ScatterNet features (GroupNorm'd)."""
DP_SGD_SAMPLE_RATE = 0.1365
"""q of DP-SGD when ``sample_rate`` is not given: Tramèr & Boneh 2021's Fashion-MNIST rate (docs/RESULTS.md s. 7)."""
DP_SGD_DELTA = 1e-5
"""δ of DP-SGD when ``delta`` is not given (the literature's; well below 1/n for silos of thousands)."""
MAX_TARGET_EPSILON = 100.0
DP_SGD_LR = 4.0
"""The local learning rate under DP-SGD when ``lr`` is not given (SGD on clipped mean gradients of norm <= C)."""

# The model's options (``model`` builds it; kept here so that a configuration is checked without torch).
DEFAULT_HIDDEN = (2048,)
DEFAULT_DROPOUT = 0.1
ADAM = "adam"
SGD = "sgd"
AUTO = "auto"
OPTIMIZERS = (AUTO, ADAM, SGD)
DEFAULT_LR = 1e-3  # LDPFL IV-E: SGD with learning rate 0.001; Adam's lr is not given, PyTorch's default 1e-3
MLP = "mlp"
LDA = "lda"
HEADS = (MLP, LDA)
"""The model a run fits: the FC model trained over rounds (``mlp``), or the closed-form LDA head on the files'
pooled released statistics (``lda``, ``closed_form``)."""
LABEL_NOISE_CORRECTIONS = ("auto", "forward", "backward", "none")
"""How training corrects for k-RR labels (``label_noise``): auto is forward for randomized labels, none for clear."""


def _checked_delta(value: float | str | None) -> float | str | None:
    """Return δ as a number in (0, 1), or ``'1/n'`` (a number given as text is converted; ParameterError otherwise)."""
    if value is None or value == "1/n":
        return value
    number: object = value
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            raise ParameterError(f"`delta` {value!r} is neither a number in (0, 1) nor '1/n'") from None
    if isinstance(number, bool) or not isinstance(number, int | float) or not 0.0 < number < 1.0:
        raise ParameterError(f"`delta` must lie in the open interval (0, 1), got {value}")
    return float(number)


def _named(name: str, parse: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Return ``parse(*args, **kwargs)``; its ValueError becomes a ParameterError naming ``name`` (the flag)."""
    try:
        return parse(*args, **kwargs)
    except ParameterError:
        raise
    except ValueError as error:
        text = str(error)
        raise ParameterError(text if f"`{name}`" in text else f"`{name}`: {text}") from None


@dataclass(frozen=True)
class FederationConfig:
    """Everything that defines a federation run. ``seed`` is never written to any output.

    Per-client values (``client_epsilons``, ``client_ranges``) are a tuple with one value per client in
    client-index order, or the name of a preset from ``budgets`` (resolved once N is known).
    """

    rounds: int = 10
    clients_per_round: int | None = None
    local_epochs: int = 2
    batch_size: int = 64
    optimizer: str = AUTO
    lr: float | None = None
    hidden: tuple[int, ...] = DEFAULT_HIDDEN
    dropout: float = DEFAULT_DROPOUT
    # The closed-form head (``head`` lda, stage2_federate.closed_form): LDA on the stats:K files' pooled statistics,
    # its covariance ridge ``shrinkage`` noise edges (None: statistics_model.SHRINKAGE). No rounds, no uploads.
    head: str = MLP
    shrinkage: float | None = None
    aggregation: str = "fedavg"
    sample_weighted: bool = False
    fraction: float | None = None
    perturbation: str = "none"
    perturb_target: str = "auto"
    epsilon: float = 1.0
    client_epsilons: tuple[float, ...] | str | None = None
    client_ranges: tuple[float, ...] | str | None = None
    range_length: float = 2.0
    client_centres: tuple[float, ...] | str | None = None
    range_centre: float = 0.0
    clip: float | None = None
    delta: float | str | None = None
    sensitivity: float | None = None
    sample_rate: float | None = None
    sign_mode: str = SIGN_UPDATE
    server_lr: float = 1e-3
    drop_per_round: int = 0
    device: str = "auto"
    threads: int | None = None
    eval_batch_size: int = 1024
    eval_clean: bool = False  # also evaluate on the clients' local-only clean test files (export --keep-clean-test)
    label_noise_correction: str = "auto"  # loss correction for k-RR labels (stage2_federate.label_noise)
    # Record-level DP-SGD of every silo's local training (stage2_federate.dp_sgd): clip is C, sample_rate q,
    # delta δ; σ is noise_multiplier or calibrated from target_epsilon over the whole run, per silo.
    dp_sgd: bool = False
    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    neighbours: str = REPLACE_ONE
    # The test records' budget: each silo's evaluation replies get Gaussian noise calibrated to it over the run
    # (silo_training.evaluation_noise); None: the DP-SGD target (else what its planned steps spend); inf: clear.
    eval_epsilon: float | None = None
    # The global model is evaluated after every eval_every-th round and after the last (``schedule``): fewer
    # evaluation replies, so under DP-SGD less noise on each at the same ``eval_epsilon``.
    eval_every: int = 1
    local_steps: int = 1
    server_momentum: float = 0.0
    # The server optimizer that moves the model along each round's step (``server_optimizers``): fedavgm uses
    # ``server_momentum``; another reads its own parameters from ``server_params`` (name → number).
    server_optimizer: str = DEFAULT_SERVER_OPTIMIZER
    server_params: Mapping[str, float] = field(default_factory=dict)
    # The server's defences against a faulty or hostile silo (issue 31; stage2_federate.reply_checks, strategies):
    # the update-norm bound (None: 10 x the round's median), a cap on any silo's aggregation weight, and the
    # fraction the trimmed mean drops at each end of every coordinate.
    max_update_norm: float | None = None
    max_client_weight: float | None = None
    trim_fraction: float | None = None
    # FedAvg and the other non-robust rules: each round, each upload's distance from the round's coordinate-wise
    # median, a silo past ``outliers.OUTLIER_BOUND`` flagged (the robust rules always report what they discount).
    outlier_report: bool = False
    seed: int | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        """Normalize lists to tuples and validate every field (ValueError quoting the value)."""
        for name in ("hidden", "client_centres"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        for name in ("client_epsilons", "client_ranges"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(float(v) for v in value))
            elif isinstance(value, str):  # 1,1,10, @file.json, @file.csv or a preset name of the right kind
                kind = budgets.EPSILON if name == "client_epsilons" else budgets.RANGE
                object.__setattr__(self, name, _named(name, budgets.parse_value_list, value, what=f"`{name}`",
                                                      kind=kind))
        if isinstance(self.client_centres, str):
            object.__setattr__(self, "client_centres", _named("client_centres", budgets.parse_numbers,
                                                              self.client_centres, what="`client_centres`",
                                                              positive=False))
        object.__setattr__(self, "delta", _checked_delta(self.delta))
        require_int_in_range("rounds", self.rounds, 1)
        if self.clients_per_round is not None:
            require_int_in_range("clients per round", self.clients_per_round, 1)
        require_int_in_range("local epochs", self.local_epochs, 1)
        require_int_in_range("batch size", self.batch_size, 1)
        require_int_in_range("eval batch size", self.eval_batch_size, 1)
        _named("eval_every", require_int_in_range, "`eval_every`", self.eval_every, 1)
        require_int_in_range("drop per round", self.drop_per_round, 0)
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.lr is not None:
            require_finite_positive("learning rate", self.lr)
        for size in self.hidden:
            require_int_in_range("hidden layer size", size, 1)
        if not (isinstance(self.dropout, int | float) and 0.0 <= self.dropout < 1.0):
            raise ValueError(f"dropout must lie in [0, 1), got {self.dropout!r}")
        if self.aggregation not in strategy_names():
            raise ValueError(f"aggregation must be one of {', '.join(strategy_names())}, got {self.aggregation!r}")
        if self.perturbation not in perturbation_names():
            raise ValueError(f"perturbation must be one of {', '.join(perturbation_names())}, "
                             f"got {self.perturbation!r}")
        if self.perturb_target not in TARGETS:
            raise ValueError(f"perturbation target must be one of {', '.join(TARGETS)}, got {self.perturb_target!r}")
        if self.sign_mode not in SIGN_MODES:
            raise ValueError(f"sign mode must be one of {', '.join(SIGN_MODES)}, got {self.sign_mode!r}")
        require_finite_positive("epsilon", self.epsilon)
        require_finite_positive("range length L", self.range_length)
        require_finite_positive("server learning rate", self.server_lr)
        if not math.isfinite(self.range_centre):
            raise ValueError(f"range centre must be a finite number, got {self.range_centre!r}")
        if self.fraction is not None and not (isinstance(self.fraction, int | float) and 0 < self.fraction <= 1):
            raise ValueError(f"fraction γ must lie in (0, 1], got {self.fraction!r}")
        if self.label_noise_correction not in LABEL_NOISE_CORRECTIONS:
            raise ParameterError(f"`label_noise_correction` must be one of {', '.join(LABEL_NOISE_CORRECTIONS)}, "
                                 f"got {self.label_noise_correction!r}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.threads is not None:
            require_int_in_range("threads", self.threads, 1, 1024)
        wiring = perturbation_wiring(self.perturbation)
        if wiring.ranges is None and (self.client_ranges is not None or self.client_centres is not None):
            takers = [n for n in perturbation_names() if perturbation_wiring(n).ranges is not None]
            raise ParameterError(f"`client_ranges` and `client_centres` (safe ranges τ_i) apply to perturbation "
                                 f"{' or '.join(takers) or '(none registered)'} only, not {self.perturbation!r}")
        if not wiring.budget and self.client_epsilons is not None:
            raise ParameterError(f"`client_epsilons` budget the model perturbation; perturbation "
                                 f"{self.perturbation!r} takes no budget (choose a perturbation, or drop "
                                 "`client_epsilons`)")
        self._check_dp_sgd()
        self._check_server_optimizer()
        self._check_defences()
        self._check_head()
        if self.seed is not None:
            mech.make_randomness(self.seed)  # validates

    def _check_server_optimizer(self) -> None:
        """Refuse a server optimizer that is not registered, or options it does not take (quoting them)."""
        object.__setattr__(self, "server_params", _named("server_params", _checked_params, self.server_params))
        if self.server_optimizer not in server_optimizer_names():
            raise ParameterError(f"`server_optimizer` must be one of {', '.join(server_optimizer_names())}, got "
                                 f"{self.server_optimizer!r}")
        if self.server_optimizer != DEFAULT_SERVER_OPTIMIZER and self.server_momentum != 0.0:
            raise ParameterError(f"`server_momentum` is the beta of server optimizer {DEFAULT_SERVER_OPTIMIZER!r}; "
                                 f"{self.server_optimizer!r} takes its parameters from `server_params`")
        create_server_optimizer(self)  # its parameters' checks

    def _check_head(self) -> None:
        """Refuse an unknown head, a `shrinkage` without `head` lda, or lda with a training-time privacy option."""
        if self.head not in HEADS:
            raise ParameterError(f"`head` must be one of {', '.join(HEADS)}, got {self.head!r}")
        if self.shrinkage is not None:
            if self.head != LDA:
                raise ParameterError(f"`shrinkage` tunes `head` {LDA} only (the covariance ridge of the closed-form "
                                     f"head), not {self.head!r}")
            number = isinstance(self.shrinkage, int | float) and not isinstance(self.shrinkage, bool)
            if not (number and math.isfinite(self.shrinkage) and self.shrinkage >= 0):
                raise ParameterError(f"`shrinkage` must be a finite number >= 0 (noise edges), got {self.shrinkage!r}")
        if self.head != LDA:
            return
        if self.dp_sgd:
            raise ParameterError(f"`head` {LDA} is fitted once on the files' released statistics, with no training "
                                 "and no upload: it takes no `dp_sgd` (nothing to protect: drop one of them)")
        if self.perturbation != "none":
            raise ParameterError(f"`head` {LDA} uploads nothing to perturb: `perturbation` must be 'none', got "
                                 f"{self.perturbation!r}")

    @property
    def closed_form(self) -> bool:
        """Whether the run fits a closed-form head (``head`` lda) instead of training over rounds."""
        return self.head == LDA

    def _check_defences(self) -> None:
        """Refuse an update-norm bound, weight cap or trim fraction out of range (quoting the value)."""
        if self.max_update_norm is not None:
            require_finite_positive("max update norm", self.max_update_norm)
        if self.max_client_weight is not None and not (
                isinstance(self.max_client_weight, int | float) and 0.0 < self.max_client_weight <= 1.0):
            raise ParameterError(f"`max_client_weight` must lie in (0, 1], got {self.max_client_weight!r}")
        if self.trim_fraction is not None:
            if self.aggregation != TRIMMED_MEAN:
                raise ParameterError(f"`trim_fraction` applies to aggregation {TRIMMED_MEAN!r} only, not "
                                     f"{self.aggregation!r}")
            if not (isinstance(self.trim_fraction, int | float) and 0.0 <= self.trim_fraction < 0.5):
                raise ParameterError(f"`trim_fraction` must lie in [0, 0.5), got {self.trim_fraction!r}")
        if self.outlier_report and self.aggregation in ROBUST_RULES:
            raise ParameterError(f"`outlier_report`: aggregation {self.aggregation!r} reports the silos it discounts "
                                 "or clips in every round already; the option is for the non-robust rules")

    def _check_dp_sgd(self) -> None:
        """Refuse DP-SGD settings that cannot be used together (one line naming the fields)."""
        require_int_in_range("local steps", self.local_steps, 1)
        if not (isinstance(self.server_momentum, int | float) and 0.0 <= self.server_momentum < 1.0):
            raise ParameterError(f"`server_momentum` must lie in [0, 1), got {self.server_momentum!r}")
        if self.neighbours not in NEIGHBOURS:
            raise ParameterError(f"`neighbours` must be one of {', '.join(NEIGHBOURS)}, got {self.neighbours!r}")
        given = [name for name in ("noise_multiplier", "target_epsilon") if getattr(self, name) is not None]
        for name in given:
            require_finite_positive(name.replace("_", " "), getattr(self, name))
        eval_epsilon = self.eval_epsilon
        number = isinstance(eval_epsilon, int | float) and not isinstance(eval_epsilon, bool)
        if eval_epsilon is not None and not (number and (0.0 < eval_epsilon <= MAX_TARGET_EPSILON
                                                         or eval_epsilon == math.inf)):
            raise ParameterError(f"`eval_epsilon` must lie in (0, {MAX_TARGET_EPSILON:g}], or be inf (the evaluation "
                                 f"replies in clear: test records not protected), got {eval_epsilon!r}")
        if not self.dp_sgd:
            extra = given + (["neighbours"] if self.neighbours != REPLACE_ONE else []) + (
                ["local_steps"] if self.local_steps != 1 else []) + (
                ["eval_epsilon"] if eval_epsilon is not None else [])
            if extra:
                raise ParameterError(f"`{'`, `'.join(extra)}` apply to `dp_sgd` only (record-level DP-SGD)")
            return
        if self.perturbation != "none":
            raise ParameterError(f"`dp_sgd` protects each record inside the silo's training; it replaces the model "
                                 f"perturbation, so `perturbation` must be 'none', got {self.perturbation!r}")
        if len(given) != 1:
            raise ParameterError("`dp_sgd` needs exactly one of `noise_multiplier` (sigma) and `target_epsilon` "
                                 "(sigma calibrated per silo over the whole run)" + (", not both" if given else ""))
        if self.eval_clean and eval_epsilon != math.inf:
            raise ParameterError("`eval_clean` sends clean test sums in clear; under `dp_sgd` the silos' evaluation "
                                 "is noised: drop `eval_clean`, or set `eval_epsilon` to inf (not private)")
        if self.sensitivity is not None:
            raise ParameterError("`sensitivity` belongs to the model perturbations; under `dp_sgd` the per-record "
                                 "sensitivity is `clip`")
        if isinstance(self.delta, str):
            raise ParameterError(f"`delta` must be a number in (0, 1) under `dp_sgd` ('1/n' is far too large for "
                                 f"record-level DP), got {self.delta!r}")
        if self.target_epsilon is not None and self.target_epsilon > MAX_TARGET_EPSILON:
            raise ParameterError(f"`target_epsilon` must lie in (0, {MAX_TARGET_EPSILON:g}], got "
                                 f"{self.target_epsilon!r}")

    @property
    def dp_clip(self) -> float:
        """C, the per-record clip of DP-SGD (``clip``, default :data:`DP_SGD_CLIP`)."""
        return DP_SGD_CLIP if self.clip is None else float(self.clip)

    @property
    def dp_sample_rate(self) -> float:
        """q, the Poisson rate of each DP-SGD step (``sample_rate``, default :data:`DP_SGD_SAMPLE_RATE`)."""
        return DP_SGD_SAMPLE_RATE if self.sample_rate is None else float(self.sample_rate)

    @property
    def dp_delta(self) -> float:
        """δ of DP-SGD (``delta``, default :data:`DP_SGD_DELTA`)."""
        return DP_SGD_DELTA if self.delta is None else float(self.delta)

    @property
    def perturbation_options(self) -> dict[str, Any]:
        """The federation options the model perturbation takes (none under ``dp_sgd``: they are DP-SGD's)."""
        return {option: None if self.dp_sgd else getattr(self, option) for option in FEDERATION_OPTIONS}

    @property
    def takes_ranges(self) -> bool:
        """Whether the perturbation takes per-client safe ranges τ_i (``client_ranges``, ``client_centres``)."""
        return perturbation_wiring(self.perturbation).ranges is not None

    def to_dict(self) -> dict[str, Any]:
        """Return the configuration as JSON-ready values, without the seed.

        The fields of :data:`WRITTEN_WHEN_SET` are left out at their defaults: a run without them writes the
        ``config.json`` (and checkpoint) it wrote before they existed.
        """
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "seed"}
        for key, value in data.items():
            if isinstance(value, tuple):
                data[key] = list(value)
            elif isinstance(value, Mapping):
                data[key] = dict(value)
        for key, default in WRITTEN_WHEN_SET.items():
            if data[key] == default:
                del data[key]
        return data


WRITTEN_WHEN_SET: Mapping[str, Any] = {"server_optimizer": DEFAULT_SERVER_OPTIMIZER, "server_params": {}}
"""Fields that ``FederationConfig.to_dict`` writes only when they differ from these defaults."""


def _checked_params(value: Mapping[str, float]) -> dict[str, float]:
    """Return ``value`` (NAME → number) as a dict sorted by name; ValueError for anything else."""
    if not isinstance(value, Mapping):
        raise ValueError(f"must map names to numbers, got {type(value).__name__}")
    for name, number in value.items():
        if not isinstance(name, str) or isinstance(number, bool) or not isinstance(number, int | float):
            raise ValueError(f"{name!r}: {number!r} is not a name and a number")
    return {name: float(value[name]) for name in sorted(value)}
