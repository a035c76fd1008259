"""What one client does in the Flower engine, without flwr: its file, its streams, its step, its resume state.

A client opens only its own file. Its perturbation is built on the client from the run's configuration
and the ε_i, L_i, c_i the server resolved for it (``build_client_perturbations`` for one client, with its
own training size for δ = 1/|D_i|), and its upload is perturbed here (``rounds.client_step``): the
server never sees an unperturbed parameter.

Its random streams are the local engine's: the root's child ``position`` gives the perturbation
Generator and that child's child 0 the training torch Generator (``streams.Streams``), so a seeded run
draws the same numbers in either engine. Between rounds their states live in Flower's ``context.state``
(:func:`pack_streams` / :func:`unpack_streams`); for ``resume`` a client also keeps them in its own
state file (:class:`ResumeStore`), next to its data, never on the server.
"""

from __future__ import annotations

import base64
import json
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ldpfl import mechanisms as mech
from ldpfl.contract.atomic import atomic_write_text
from ldpfl.contract.digest import sha256_file
from ldpfl.contract.layout import client_stem, local_file_name
from ldpfl.mechanisms.randomness import portable_state, restore_state
from ldpfl.stage2_federate.client_description import ClientDescription
from ldpfl.stage2_federate.config import FederationConfig
from ldpfl.stage2_federate.data import ClientDataset, ClientSplit, load_clean_test, load_client
from ldpfl.stage2_federate.model import FederatedMLP, build_model, evaluate, set_vector
from ldpfl.stage2_federate.perturbation import ClientPerturbation
from ldpfl.stage2_federate.plan import configured_perturbations, resolve_device
from ldpfl.stage2_federate.rounds import Broadcast, ClientResult, LocalTraining, client_step, silo_evaluation
from ldpfl.stage2_federate.streaming import ResidencyBudget, StreamedSplit
from ldpfl.stage2_federate.streams import Streams, evaluation_generator

from .protocol import ClientSetup

_CACHE_SIZE = 8  # client files kept open per process (a simulation actor serves many clients)
_DATA: OrderedDict[tuple[str, int, str], ClientDataset] = OrderedDict()
_CLEAN: OrderedDict[tuple[str, int, str], ClientSplit] = OrderedDict()


def _remember(cache: OrderedDict[Any, Any], key: Any, value: Any) -> None:
    cache[key] = value
    while len(cache) > _CACHE_SIZE:
        cache.popitem(last=False)


def open_client(path: str | Path, device: torch.device) -> ClientDataset:
    """Open and validate one client file for ``device`` (cached per process by path and modification time).

    Stage 2's reader (``data.load_client``): a split is held in memory only when it is small and the
    memory budget allows, else streamed in row blocks, so a client's memory stays bounded as in the
    local engine. The budget (a quarter of the memory available, at most ``RESIDENT_TOTAL_BYTES``) is
    shared among the files a process may keep open.
    """
    path = Path(path)
    key = (str(path.resolve()), path.stat().st_mtime_ns, str(device))
    if key in _DATA:
        _DATA.move_to_end(key)
        return _DATA[key]
    budget = ResidencyBudget(ResidencyBudget.from_memory().left // _CACHE_SIZE)
    client = load_client(path, device, budget)
    _remember(_DATA, key, client)
    return client


def clean_test(client: ClientDataset, device: torch.device) -> ClientSplit:
    """Return the client's clean test split (its local-only file, ``data.load_clean_test``), cached per process."""
    path = client.path.parent / local_file_name(client.index)
    key = (str(path.resolve()), path.stat().st_mtime_ns if path.is_file() else -1, str(device))
    if key in _CLEAN:
        _CLEAN.move_to_end(key)
        return _CLEAN[key]
    split = load_clean_test(client, device)
    _remember(_CLEAN, key, split)
    return split


def summarize(client: ClientDataset, sha256: str | None = None) -> ClientDescription:
    """Return what the server may know of ``client``'s file (``ClientDescription.of``).

    ``sha256``: the file's digest when the caller has just computed it (else it is computed here).
    """
    return ClientDescription.of(client, sha256 or sha256_file(client.path))


def client_perturbation(config: FederationConfig, setup: ClientSetup, client: ClientDataset) -> ClientPerturbation:
    """Build this client's mechanism as the local engine does for it (``plan.configured_perturbations``)."""
    return configured_perturbations(
        config, dim=setup.dim, epsilons=[config.epsilon if setup.epsilon is None else setup.epsilon],
        ranges=None if setup.range_length is None else [setup.range_length],
        centres=None if setup.centre is None else [setup.centre], train_sizes=[len(client.train)],
        clients=[client.index])[0]


def fresh_streams(config: FederationConfig, setup: ClientSetup, device: torch.device
                  ) -> tuple[np.random.Generator, torch.Generator, str]:
    """Return the client's (perturbation Generator, training torch Generator, randomness mode) at round 0.

    With a seed these are the local engine's streams of the client at ``setup.position``; without one the
    client draws its own root from the OS CSPRNG.
    """
    randomness = mech.make_randomness(config.seed)
    streams = Streams.create(randomness, setup.clients)
    return streams.perturb[setup.position], streams.train[setup.position], randomness.mode


def pack_streams(perturb: np.random.Generator, train: torch.Generator) -> dict[str, str]:
    """Return both generators' states as JSON-ready text (for ``context.state`` and the resume file)."""
    return {"perturb": json.dumps(portable_state(perturb)),
            "train": base64.b64encode(bytes(train.get_state().numpy())).decode("ascii")}


def unpack_streams(state: Mapping[str, str], perturb: np.random.Generator, train: torch.Generator
                   ) -> np.random.Generator:
    """Set ``perturb`` and ``train`` to a state made by :func:`pack_streams`; return the perturbation Generator.

    ``perturb`` itself is set when the state is of its kind of generator; a state of another kind (saved by a
    run that started before the secure generator became the default) comes back as a new Generator.
    """
    restored = restore_state(perturb, json.loads(state["perturb"]))
    train.set_state(torch.frombuffer(bytearray(base64.b64decode(state["train"])), dtype=torch.uint8))
    return restored


class ResumeStore:
    """A client's own resume file: its stream states after the last rounds it trained in.

    The file holds generator states, which are seed-equivalent: it stays with the client (its silo, or
    the run's output directory in a simulation) and is deleted when the run completes, unless the run
    keeps its checkpoint. Three entries are kept: the server writes its checkpoint of round r when round
    r + 1's replies (which carry round r's evaluation) are in, so a run can stop after a client saved
    round r + 2 but before the server saved its checkpoint of round r + 1, and resume then needs the state
    of round r.
    """

    KEEP = 3

    def __init__(self, directory: str | Path, index: int):
        self.path = Path(directory) / f".{client_stem(index)}.flower-resume.json"

    def save(self, round_number: int, state: Mapping[str, str]) -> None:
        """Record the state after ``round_number`` (atomically)."""
        entries = [e for e in self._entries() if e["round"] < round_number]
        entries.append({"round": int(round_number), **state})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path, json.dumps({"entries": entries[-self.KEEP:]}))

    def load(self, at_round: int) -> dict[str, str] | None:
        """Return the latest state saved at or before ``at_round`` (None: the client had not trained yet)."""
        entries = [e for e in self._entries() if e["round"] <= at_round]
        if not entries:
            return None
        best = max(entries, key=lambda e: e["round"])
        return {"perturb": best["perturb"], "train": best["train"]}

    def remove(self) -> None:
        """Delete the file."""
        self.path.unlink(missing_ok=True)

    def _entries(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        return list(json.loads(self.path.read_text())["entries"])


@dataclass
class Trainer:
    """One client's model scratch space and settings for a run (rebuilt when the architecture changes)."""

    model: FederatedMLP
    device: torch.device

    @classmethod
    def build(cls, config: FederationConfig, setup: ClientSetup) -> Trainer:
        """Build the model (its initial weights are overwritten by every broadcast)."""
        device = resolve_device(config.device)
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        throwaway = torch.Generator(device=device).manual_seed(0)
        model = build_model(setup.input_width, config.hidden, setup.num_classes, dropout=config.dropout,
                            generator=throwaway, device=device)
        return cls(model, device)

    def broadcast(self, vector: np.ndarray) -> Broadcast:
        """Return the round's broadcast from the received global vector."""
        vector = np.ascontiguousarray(vector, dtype=np.float32)
        return Broadcast(torch.from_numpy(vector.copy()).to(self.device), vector)

    def train(self, config: FederationConfig, setup: ClientSetup, client: ClientDataset, vector: np.ndarray, *,
              generator: torch.Generator, rng: np.random.Generator) -> ClientResult:
        """LDPFL Algorithm 1 lines 19-20 on this client: ``rounds.client_step`` (train, then perturb here)."""
        training = LocalTraining(setup.optimizer, setup.lr, config.local_epochs, config.batch_size,
                                 setup.label_noise, {client.index: setup.training})
        return client_step(self.model, self.broadcast(vector), client.train, client_perturbation(config, setup, client),
                           training, generator=generator, rng=rng)

    def evaluate(self, config: FederationConfig, setup: ClientSetup, client: ClientDataset, vector: np.ndarray,
                 model_round: int) -> dict[str, tuple[float, int, int]]:
        """Return the sums of the global model (round ``model_round``'s) per test split.

        ``test``: the test split, released with the noise its training gives it (``SiloTraining.evaluation``,
        ``rounds.silo_evaluation``) from this client's stream for that round (the local engine's draws); ``clean``
        (with ``eval_clean``): the client's local-only clean test file (``data.load_clean_tests``). Summed over the
        clients, these give the local engine's evaluation on the union of the splits.
        """
        set_vector(self.model, self.broadcast(vector).weights)
        sums: dict[str, tuple[float, int, int]] = {}
        noise = setup.training.evaluation
        if noise is not None:
            noised = silo_evaluation(self.model, [client.test], config.eval_batch_size, noise,
                                     lambda: evaluation_generator(mech.make_randomness(config.seed),
                                                                  setup.position, model_round))
            sums["test"] = (noised.loss_sum, noised.correct, noised.rows)
        splits: dict[str, list[ClientSplit | StreamedSplit]] = {} if sums else {"test": [client.test]}
        if config.eval_clean:
            splits["clean"] = [clean_test(client, self.device)]
        for name, chosen in splits.items():
            rows = sum(len(s) for s in chosen)
            if rows == 0:
                sums[name] = (0.0, 0, 0)
                continue
            loss, accuracy = evaluate(self.model, chosen, config.eval_batch_size)
            sums[name] = (loss * rows, int(round(accuracy * rows)), rows)
        return sums
