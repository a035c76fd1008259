"""Every random stream of a federation run, derived from one root seed sequence.

The root (the user's seed or the OS CSPRNG, ``ldpfl.mechanisms.make_randomness``) gives independent streams:
the server's numpy Generator (selection, dropouts, ω), a torch Generator for the initialization, and per
client a numpy Generator (its perturbation, the root's child i) and a torch Generator (its shuffles and
dropout masks, that child's child 0). The numpy Generators are the secure generator without a seed and PCG64
with one (``Randomness.stream``). ``state``/``restore`` round-trip them exactly (as JSON-safe values,
``mechanisms.randomness.portable_state``), so a resumed run equals an uninterrupted one bit for bit (at a
fixed thread count and device).

The torch Generators live on the CPU whatever device the run computes on: the initial model, the
shuffles and the dropout masks are drawn there and moved (``model.build_model``, ``data.ClientSplit.batches``,
``model.GeneratorDropout``). A CUDA generator is another algorithm (Philox, not the CPU's Mersenne
Twister) with another state format, so with generators on the device a CUDA run would start from another
initial model than a CPU run of the same seed, and a checkpoint could not be resumed on the other device
(``device`` is one of ``checkpoint.RESUMABLE_CHANGES``). Drawn on the CPU, a run takes the same random
draws on every device, and its results differ between devices by float rounding only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ldpfl import mechanisms as mech
from ldpfl.mechanisms.randomness import generator_name_of, portable_state, restore_state

# Spawn keys of the server's streams, beyond any client index.
SERVER_KEY = 2**31
INIT_KEY = 2**31 + 1
EVALUATION_KEY = 1  # a client's evaluation noise: its child (1, round); child 0 is its training torch Generator


def evaluation_generator(randomness: mech.Randomness, position: int, model_round: int) -> np.random.Generator:
    """Return client ``position``'s Generator for the noise of its evaluation of round ``model_round``'s model.

    One fresh stream per (client, round), the child (1, round) of the client's own sequence (the root's child
    ``position``, as :meth:`Streams.create`): no state to checkpoint, the same draws on both engines and after a
    resume, whatever order the evaluations arrive in.
    """
    root = randomness.seed_sequence
    return randomness.stream(np.random.SeedSequence(
        root.entropy, spawn_key=(*root.spawn_key, int(position), EVALUATION_KEY, int(model_round))))


@dataclass
class Streams:
    """Every Generator of a run; ``state``/``restore`` round-trip them exactly."""

    server: np.random.Generator
    init: torch.Generator
    perturb: list[np.random.Generator]
    train: list[torch.Generator]

    @classmethod
    def create(cls, randomness: mech.Randomness, clients: int) -> Streams:
        """Create the streams of a run with ``clients`` clients; torch generators on the CPU for every device."""
        root = randomness.seed_sequence

        def child(*key: int) -> np.random.SeedSequence:
            return np.random.SeedSequence(root.entropy, spawn_key=(*root.spawn_key, *key))

        def torch_generator(seq: np.random.SeedSequence) -> torch.Generator:
            return torch.Generator(device="cpu").manual_seed(int(seq.generate_state(1, np.uint64)[0]))

        client_seqs = randomness.child_sequences(clients)  # client i's stream is the root's child i
        return cls(
            server=randomness.stream(child(SERVER_KEY)),
            init=torch_generator(child(INIT_KEY)),
            perturb=[randomness.stream(s) for s in client_seqs],
            train=[torch_generator(np.random.SeedSequence(s.entropy, spawn_key=(*s.spawn_key, 0)))
                   for s in client_seqs],
        )

    @property
    def generator_name(self) -> str:
        """The bit generator of the perturbation streams (``AES-CTR``, ``ChaCha20``, ``PCG64``), as restored."""
        return generator_name_of(self.server)

    def state(self) -> dict[str, Any]:
        """Every generator's state (for the checkpoint)."""
        return {
            "server": portable_state(self.server),
            "init": self.init.get_state(),
            "perturb": [portable_state(g) for g in self.perturb],
            "train": [g.get_state() for g in self.train],
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Set every generator to ``state`` (from :meth:`state`); a different client count is refused."""
        if len(state["perturb"]) != len(self.perturb) or len(state["train"]) != len(self.train):
            raise ValueError(f"the checkpoint holds random streams for {len(state['perturb'])} clients, "
                             f"this run has {len(self.perturb)}")
        self.server = restore_state(self.server, state["server"])
        self.init.set_state(state["init"])
        self.perturb = [restore_state(g, saved) for g, saved in zip(self.perturb, state["perturb"], strict=True)]
        for torch_generator, saved in zip(self.train, state["train"], strict=True):
            torch_generator.set_state(saved)
