"""Everything a federation run fixes before round 1, shared by every engine.

:func:`plan_federation` loads the client files, builds the model and the random streams, gives each
client its perturbation (its mechanism's declared wiring, its own ε_i, δ_i and τ_i), the strategy (with
sign aggregation when the mechanism's uploads are signs), the server rule, and the records written to
``config.json`` and the privacy section of ``metrics.json``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ldpfl import mechanisms as mech
from ldpfl.common.errors import ParameterError
from ldpfl.contract.file_checks import float32_overflow
from ldpfl.contract.run_dir import screen_run
from ldpfl.contract.schema import FormatError

from . import budgets
from .client_description import ClientDescription
from .client_privacy import ClientPrivacy
from .config import DEVICES, FederationConfig
from .data import FederatedData, load_client
from .label_claims import LabelClaimCap, cap_unchecked, screen_files
from .label_noise import resolve_label_noise
from .left_out import LeftOut, enough_remain, needed_silos
from .model import (
    FederatedMLP,
    build_model,
    evaluation_rows,
    get_vector,
    parameter_count,
    resolve_optimizer,
    set_vector,
)
from .perturbation import (
    ClientPerturbation,
    ServerRule,
    build_client_perturbations,
    perturbation_wiring,
    resolve_target,
)
from .resources import check_model
from .rounds import LocalTraining
from .server_optimizers import ServerOptimizer, create_server_optimizer
from .silo_training import training_method
from .strategies import FedAW, SignAggregation, Strategy, StrategyOptions, create_strategy
from .streaming import ResidencyBudget
from .streams import Streams


def resolve_device(name: str) -> torch.device:
    """``auto``: CUDA when available, else CPU. ``cuda`` without a GPU is refused."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ParameterError("`device` cuda was requested but torch sees no CUDA device (use `device` cpu or auto)")
    if name not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {name!r}")
    return torch.device(name)


@dataclass(frozen=True)
class ClientPlan:
    """The per-client values of a run, in client order: ε_i, and L_i, c_i when the perturbation takes ranges."""

    ids: tuple[int, ...]
    epsilons: tuple[float, ...]
    ranges: tuple[float, ...] | None
    centres: tuple[float, ...] | None


def plan_clients(config: FederationConfig, clients: Sequence[ClientDescription]) -> ClientPlan:
    """Resolve the per-client lists (explicit, preset or one default) for ``clients``."""
    n = len(clients)
    epsilons = budgets.resolve_values(config.client_epsilons, config.epsilon, n, what="client epsilons")
    ranges = centres = None
    if config.takes_ranges:
        ranges = budgets.resolve_values(config.client_ranges, config.range_length, n, what="client ranges")
        centres = (tuple(float(c) for c in config.client_centres) if config.client_centres is not None
                   else (config.range_centre,) * n)
        if len(centres) != n:
            raise ValueError(f"client centres list has {len(centres)} values but the run has {n} clients")
    return ClientPlan(tuple(c.index for c in clients), epsilons, ranges, centres)


def configured_perturbations(config: FederationConfig, *, dim: int, epsilons: Sequence[float],
                             ranges: Sequence[float] | None, centres: Sequence[float] | None,
                             train_sizes: Sequence[int], clients: Sequence[int],
                             target: str | None = None) -> list[ClientPerturbation]:
    """Build the mechanisms of ``clients`` with the run's options and the per-client ε_i (L_i, c_i, |D_i|).

    The one place a client's perturbation is set up: the local engine for every client
    (:func:`plan_perturbations`), a Flower client for itself from what the server resolved for it.
    ``target``: what the uploads perturb, as the plan resolved it (None: resolved here, ``perturbation_target``).
    """
    target = perturbation_target(config) if target is None else target
    return build_client_perturbations(
        config.perturbation, dim=dim, epsilons=epsilons, target=target, ranges=ranges, centres=centres,
        train_sizes=train_sizes, rounds=config.rounds, clients=clients,
        **config.perturbation_options)


def perturbation_target(config: FederationConfig) -> str:
    """Return what the run's uploads perturb, ``parameters`` or ``update`` (``perturbation.resolve_target``)."""
    return resolve_target(config.perturbation, config.perturb_target, config.sign_mode)


def plan_perturbations(config: FederationConfig, clients: Sequence[ClientDescription], dim: int, target: str,
                       ) -> tuple[ClientPlan, dict[int, ClientPerturbation]]:
    """Each client's perturbation over ``dim`` model parameters of ``target``; also the per-client lists."""
    plan = plan_clients(config, clients)
    built = configured_perturbations(config, dim=dim, epsilons=plan.epsilons, ranges=plan.ranges,
                                     centres=plan.centres, train_sizes=[c.train_rows for c in clients],
                                     clients=plan.ids, target=target)
    return plan, {p.client: p for p in built}


def plan_strategy(config: FederationConfig, clients: Sequence[ClientDescription],
                  perturbations: dict[int, ClientPerturbation], target: str, *,
                  unchecked_histograms: Collection[int] = ()) -> tuple[Strategy, LabelClaimCap | None]:
    """Build the aggregation strategy over the clients, wrapped for sign uploads (WU eqs. 10, 13, 16).

    ``perturbations``: each client's (σ_i for the weights of WU's rules); ``target``: what the uploads perturb.
    ``unchecked_histograms``: the clients whose histogram the coordinator could not check; under DP-FedAW their
    weight is capped (``label_claims.cap_unchecked``), and the cap is returned (None: nothing to cap).
    """
    options = StrategyOptions(config.clients_per_round, config.sample_weighted, config.fraction,
                              config.max_client_weight, config.trim_fraction, target, config.outlier_report)
    strategy: Strategy = create_strategy(config.aggregation, clients, options,
                                         {c.index: perturbations[c.index].noise_scale for c in clients})
    cap = None
    if isinstance(strategy, FedAW) and unchecked_histograms:  # issue 42 item 3: an unchecked claim is bounded
        strategy.similarities, cap = cap_unchecked(strategy.similarities, unchecked_histograms)
    if perturbation_wiring(config.perturbation).sign_aggregation:
        strategy = SignAggregation(strategy)
    if config.drop_per_round > strategy.clients_per_round:
        raise ValueError(f"drop per round ({config.drop_per_round}) exceeds the {strategy.clients_per_round} "
                         "clients selected per round")
    return strategy, cap


def check_noise_scales(config: FederationConfig, perturbations: dict[int, ClientPerturbation]) -> None:
    """Refuse a noise scale whose draws overflow float32 (every upload would be ±inf and excluded).

    Sign uploads (ldpsign) are finite whatever σ and are not checked.

    Raises
    ------
    ParameterError
        Naming the client, its ε and σ (e.g. ``gaussian`` at ε = 1e-300 gives σ ≈ 4e301).
    """
    if perturbation_wiring(config.perturbation).sign_aggregation:
        return  # the uploads are signs: finite whatever σ
    for cid, perturbation in perturbations.items():
        problem = float32_overflow(perturbation.noise_scale)
        if problem is not None:
            raise ParameterError(f"perturbation {config.perturbation!r} of client {cid} (epsilon "
                                 f"{perturbation.epsilon:g}): {problem}; choose a larger `epsilon` (or "
                                 "`client_epsilons`)")


@dataclass
class FederationPlan:
    """A run, set up: the clients, device, streams, the model, and the per-client and server wiring."""

    config: FederationConfig
    clients: tuple[ClientDescription, ...]  # in client-index order
    device: torch.device
    randomness: mech.Randomness
    streams: Streams
    model: FederatedMLP
    perturbations: dict[int, ClientPerturbation]
    strategy: Strategy
    rule: ServerRule
    training: LocalTraining
    client_plan: ClientPlan
    privacy: tuple[ClientPrivacy, ...]  # in client-index order: metrics.json's privacy entries
    record: dict[str, Any]
    server_optimizer: ServerOptimizer  # the server's step after the strategy (FedAvgM...), its state

    def relabel_randomness(self, mode: str) -> None:
        """Label the records with ``mode`` and the streams' generator (a resumed run keeps those it started with).

        The records are replaced by labelled copies (``ClientPrivacy.with_randomness``), never changed in place.
        """
        generator = self.streams.generator_name
        self.record = {**self.record, "randomness": mode, "generator": generator}
        self.privacy = tuple(p.with_randomness(mode, generator) for p in self.privacy)

    @property
    def vector(self) -> np.ndarray:
        """Return the current global vector (float32, CPU)."""
        return get_vector(self.model).cpu().numpy()

    def set_vector(self, vector: np.ndarray) -> None:
        """Make ``vector`` the global model."""
        set_vector(self.model, torch.from_numpy(np.ascontiguousarray(vector, dtype=np.float32)).to(self.device))

    def base(self) -> dict[str, Any]:
        """Return this plan's fields by name (for an engine's plan that extends it)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(FederationPlan)}


@dataclass
class LocalPlan(FederationPlan):
    """The local engine's plan: also the client files it loaded."""

    data: FederatedData


def resolve_lr(config: FederationConfig) -> float:
    """Return the local learning rate: ``lr``, else the default of the silos' way of training (``silo_training``)."""
    if config.lr is not None:
        return float(config.lr)
    return training_method(config).default_lr


def resolved_settings(*, device: torch.device, training: LocalTraining, dim: int, target: str, rule: ServerRule,
                      plan: ClientPlan, budgeted: bool, perturbations: dict[int, ClientPerturbation],
                      strategy: Strategy, threads: int | None) -> dict[str, Any]:
    """Return the ``resolved`` section of ``config.json``: what the run's defaults and budgets became.

    Both engines write it (the local loop and the Flower server), so a run's record does not depend on
    where it ran.
    """
    return {
        "device": str(device), "optimizer": training.optimizer, "lr": training.lr, "parameters": dim,
        "perturbation_target": target, "sign_aggregation": rule.signed, "server_update": rule.describe(),
        "client_ids": list(plan.ids), "client_epsilons": list(plan.epsilons) if budgeted else None,
        "client_ranges": None if plan.ranges is None else list(plan.ranges),
        "client_centres": None if plan.centres is None else list(plan.centres),
        "noise_scales": [perturbations[i].noise_scale for i in plan.ids],
        "clients_per_round": strategy.clients_per_round, "strategy": strategy.describe(),
        "threads": threads, "label_noise": None if training.label_noise is None else training.label_noise.to_dict(),
    }


def build_plan(config: FederationConfig, clients: Sequence[ClientDescription], *, device: torch.device,
               batch_rows: int, threads: int | None, run: dict[str, Any],
               engine: Mapping[str, Any] | None = None,
               unchecked_histograms: Collection[int] = ()) -> FederationPlan:
    """Set up everything ``config`` describes for ``clients`` (sorted by index), for either engine.

    ``batch_rows``: the rows of the largest training plus evaluation batch this process holds (0 on a
    server whose clients train elsewhere), for the memory check; ``threads`` and ``run`` go to the record
    (``config.json``), as do ``engine``'s entries (the Flower engine: ``engine`` and, under ``resolved``,
    ``flower``). ``unchecked_histograms``: the clients whose label histogram the coordinator could not check
    (their DP-FedAW weight is capped, and the cap written as the record's ``label_claims``).
    """
    ordered = tuple(sorted(clients, key=lambda c: c.index))
    first = ordered[0]
    per_round = len(ordered) if config.clients_per_round is None else min(config.clients_per_round, len(ordered))
    check_model(first.feature_width, config.hidden, first.num_classes, per_round, batch_rows=batch_rows)  # before torch
    randomness = mech.make_randomness(config.seed)
    streams = Streams.create(randomness, len(ordered))
    model = build_model(first.feature_width, config.hidden, first.num_classes, dropout=config.dropout,
                        generator=streams.init, device=device)
    dim = parameter_count(model)
    target = perturbation_target(config)  # the one resolution of a build
    plan, perturbations = plan_perturbations(config, ordered, dim, target)
    check_noise_scales(config, perturbations)
    strategy, cap = plan_strategy(config, ordered, perturbations, target, unchecked_histograms=unchecked_histograms)
    rule = ServerRule.for_perturbation(config.perturbation, target, config.server_lr)
    label_noise = resolve_label_noise(config.label_noise_correction,  # issue 22: every file's T must agree
                                      [(c.file, c.label_release) for c in ordered])
    silos = training_method(config).plan(config, [(c.index, c.train_rows) for c in ordered])
    training = LocalTraining(resolve_optimizer(config.optimizer, first.dataset), resolve_lr(config),
                             config.local_epochs, config.batch_size, label_noise, silos)
    privacy = tuple(
        ClientPrivacy(c.index, perturbations[c.index].report(randomness.mode, randomness.generator_name),
                      perturbations[c.index].target, perturbations[c.index].noise_scale, c.file, c.feature_mechanism,
                      c.feature_privacy, c.release_guarantee,
                      silos[c.index], bool(c.local_only))
        for c in ordered)
    budgeted = perturbation_wiring(config.perturbation).budget
    extra = dict(engine or {})
    resolved_extra = extra.pop("resolved", {})
    record = {
        **config.to_dict(),
        "randomness": randomness.mode,
        "generator": randomness.generator_name,
        **extra,
        "resolved": {**resolved_settings(device=device, training=training, dim=dim, target=target, rule=rule,
                                         plan=plan, budgeted=budgeted, perturbations=perturbations,
                                         strategy=strategy, threads=threads), **resolved_extra},
        "run": run,
        **({} if cap is None else {"label_claims": cap.to_dict()}),
    }
    return FederationPlan(config, ordered, device, randomness, streams, model, perturbations, strategy, rule,
                          training, plan, privacy, record, create_server_optimizer(config))


def plan_federation(run_dir: Path, config: FederationConfig, *, min_clients: int | None = None) -> LocalPlan:
    """Load the run in ``run_dir`` and set up everything ``config`` describes. Raises ``ValueError``.

    A client whose file does not verify (:func:`load_silos`) or whose file's claims its own records do not bear
    out (``label_claims.screen_files``) is left out and named in ``run.left_out``, and the run goes on while
    enough remain (``left_out.needed_silos``: two, or ``min_clients`` or ``clients_per_round``), else
    :class:`~.left_out.TooFewSilosError` naming every left-out silo (issue 42 item 4).
    """
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    device = resolve_device(config.device)
    data, refused = load_silos(run_dir, device)
    listed = len(data.manifest.files)
    data.clients, disowned = screen_files(data.clients)
    left = sorted([*refused, *disowned], key=lambda x: (x.index, x.file))
    enough_remain(len(data.clients), listed, left, needed_silos(listed, min_clients=min_clients,
                                                                clients_per_round=config.clients_per_round))
    batch_rows = config.batch_size + evaluation_rows(config.eval_batch_size, data.input_width)
    digests = {record.client_index: record.sha256 for record in data.manifest.files}  # screen_run checked them
    described = [ClientDescription.of(c, digests[c.index]) for c in data.clients]
    plan = build_plan(config, described, device=device, batch_rows=batch_rows,
                      threads=torch.get_num_threads(), run=left_out_run(data.describe(), left))
    return LocalPlan(**plan.base(), data=data)


def load_silos(run_dir: str | Path, device: torch.device | str = "cpu") -> tuple[FederatedData, list[LeftOut]]:
    """Load the clients of ``run_dir`` whose files verify; leave out and name the others (issue 42 item 4).

    The checks are ``validate_run``'s (``contract.run_dir.screen_run``: the manifest's sha256, rows and label
    counts, the structure, the feature values), and a file that fails as it is read (a chunk's checksum, a label
    outside the classes, an empty training split) is left out too. What is wrong with the run itself (no manifest,
    files that do not form one run, files the manifest does not list) raises as it does in ``data.load_run``.
    Packed bits stay packed.
    """
    run_dir, device = Path(run_dir), torch.device(device)
    screened = screen_run(run_dir)
    left = [LeftOut.refused_file(r.record.client_index, r.record.path, r.error) for r in screened.refused]
    budget = ResidencyBudget.from_memory()
    clients = []
    for record, _metadata in screened.checked:
        try:
            clients.append(load_client(run_dir / record.path, device, budget, index=record.client_index))
        except FormatError as error:
            left.append(LeftOut.refused_file(record.client_index, record.path, error))
    clients.sort(key=lambda c: c.index)
    return FederatedData(run_dir, screened.manifest, clients), sorted(left, key=lambda x: (x.index, x.file))


def left_out_run(run: dict[str, Any], left: Sequence[LeftOut]) -> dict[str, Any]:
    """Return ``run`` (``config.json``'s ``run``) with the silos refused before round 1 as ``left_out``, if any."""
    return {**run, "left_out": [x.to_dict() for x in left]} if left else run
