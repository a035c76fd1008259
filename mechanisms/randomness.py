"""Where every random draw comes from.

A root ``numpy.random.SeedSequence`` is built from the user's seed (reproducible) or from the OS
CSPRNG (the default). Each client gets its own child stream through ``SeedSequence.spawn``, so work
done in parallel gives the same result as work done in order. The seed itself is never written to any
output: only the *mode* and the generator's name are.

The bit generator behind each stream depends on the mode:

* ``csprng`` (no seed): a cryptographically secure generator, keyed by the stream's seed sequence (128 bits
  of OS entropy): AES-128 in counter mode (randomgen's ``AESCounter``) where the CPU has AES-NI, else
  ChaCha20 (randomgen's ``ChaCha``, 20 rounds; software AES would be slow and its table lookups leak
  timing). Without the key, its outputs cannot be told from uniform bits, so the noise cannot be
  predicted from released values, however many (the security of AES and ChaCha20 as pseudorandom
  functions).
* ``seeded``: numpy's PCG64, fast and reproducible, and not cryptographic: anyone who knows the seed
  knows every noise value, and PCG64's state can in principle be recovered from enough outputs.

Samplers that need uniform 64-bit words take them with :func:`random_words`, which is exact for every numpy
bit generator (MT19937 too), so a ``Generator`` on any bit generator keeps the reported probabilities.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from numbers import Integral
from typing import Any

import numpy as np

CSPRNG = "csprng"
SEEDED = "seeded"

AES_CTR = "AES-CTR"
CHACHA20 = "ChaCha20"
PCG64 = "PCG64"
UNRECORDED = "unspecified"

GENERATORS = {
    AES_CTR: "AES-128 in counter mode, AES-NI (randomgen AESCounter)",
    CHACHA20: "ChaCha20 stream cipher, 20 rounds (randomgen ChaCha)",
    PCG64: "numpy PCG64, a statistical generator (not cryptographic)",
}
"""Every generator name a report or a file may carry, with what it is."""
SECURE_GENERATORS = (AES_CTR, CHACHA20)

RANDOMNESS_DESCRIPTIONS = {
    CSPRNG: "seeded from the OS CSPRNG (not reproducible)",
    SEEDED: "user-seeded: reproducible, for testing and research only; NO privacy against anyone who knows "
            "or can guess the seed (every noise value is then known, so the input can be read back exactly)",
}
"""Each mode, whatever its generator (:func:`describe_randomness` adds what the generator protects against)."""


def describe_randomness(mode: str, generator: str = UNRECORDED) -> str:
    """One line saying where the randomness came from and what it protects against.

    ``generator`` is the bit generator's name (:data:`GENERATORS`); files and reports written before the
    name was recorded used PCG64 in both modes.
    """
    if mode != CSPRNG:
        return RANDOMNESS_DESCRIPTIONS.get(mode, UNRECORDED)
    if generator in SECURE_GENERATORS:
        return (f"seeded from the OS CSPRNG into a cryptographically secure generator ({GENERATORS[generator]}): "
                "not reproducible, and the noise cannot be predicted from the outputs")
    if generator == PCG64:
        return ("seeded from the OS CSPRNG into PCG64 (not reproducible); PCG64 is not cryptographic: its state, "
                "and so every noise value, can in principle be recovered from enough of its outputs")
    return f"{RANDOMNESS_DESCRIPTIONS[CSPRNG]}; generator not recorded"


def randomness_label(mode: str, generator: str = UNRECORDED) -> str:
    """Return ``mode (generator)``, e.g. ``csprng (AES-CTR)``; the mode alone when the generator is unrecorded."""
    return mode if generator == UNRECORDED else f"{mode} ({generator})"


@functools.cache
def secure_generator_name() -> str:
    """Return the secure generator of this machine: ``AES-CTR`` with AES-NI, else ``ChaCha20``."""
    from randomgen import AESCounter

    return AES_CTR if AESCounter(0).use_aesni else CHACHA20


def secure_bit_generator(seed: np.random.SeedSequence | int | None) -> np.random.BitGenerator:
    """Return the secure bit generator (:func:`secure_generator_name`) keyed by ``seed`` (None: OS entropy)."""
    from randomgen import AESCounter, ChaCha

    return AESCounter(seed) if secure_generator_name() == AES_CTR else ChaCha(seed, rounds=20)


def stream_generator(seed_sequence: np.random.SeedSequence, mode: str) -> np.random.Generator:
    """Return the Generator of one stream: PCG64 for ``seeded``, the secure generator for ``csprng``."""
    if mode == SEEDED:
        return np.random.Generator(np.random.PCG64(seed_sequence))
    if mode == CSPRNG:
        return np.random.Generator(secure_bit_generator(seed_sequence))
    raise ValueError(f"randomness mode must be one of {CSPRNG}, {SEEDED}; got {mode!r}")


@dataclass(frozen=True)
class Randomness:
    """A root seed sequence plus how it was obtained (``mode`` is ``csprng`` or ``seeded``)."""

    seed_sequence: np.random.SeedSequence
    mode: str

    @property
    def generator_name(self) -> str:
        """The bit generator of every stream: ``PCG64`` when seeded, ``AES-CTR`` or ``ChaCha20`` otherwise."""
        return PCG64 if self.mode == SEEDED else secure_generator_name()

    @property
    def label(self) -> str:
        """``csprng (AES-CTR)``, ``seeded (PCG64)``, ...: the mode and the generator, as outputs name them."""
        return randomness_label(self.mode, self.generator_name)

    @property
    def description(self) -> str:
        """One line saying where the randomness comes from."""
        return describe_randomness(self.mode, self.generator_name)

    def generator(self) -> np.random.Generator:
        """Return a generator on the root stream."""
        return stream_generator(self.seed_sequence, self.mode)

    def stream(self, seed_sequence: np.random.SeedSequence) -> np.random.Generator:
        """Return a generator of this mode on ``seed_sequence`` (a child of the root)."""
        return stream_generator(seed_sequence, self.mode)

    def child_sequences(self, count: int) -> list[np.random.SeedSequence]:
        """``count`` independent child seed sequences, the same ones on every call."""
        return [
            np.random.SeedSequence(self.seed_sequence.entropy, spawn_key=(*self.seed_sequence.spawn_key, i))
            for i in range(count)
        ]

    def child_generators(self, count: int) -> list[np.random.Generator]:
        """One independent generator per client (index ``i`` always maps to the same stream)."""
        return [self.stream(s) for s in self.child_sequences(count)]


def make_randomness(seed: int | None = None) -> Randomness:
    """Build the root randomness: from ``seed`` if given (reproducible), else from the OS CSPRNG."""
    if seed is None:
        return Randomness(np.random.SeedSequence(), CSPRNG)
    if isinstance(seed, bool) or not isinstance(seed, Integral) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return Randomness(np.random.SeedSequence(int(seed)), SEEDED)


def random_words(size: int | tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Draw uniform 64-bit words (uint64) of shape ``size`` from any numpy bit generator.

    ``Generator.integers(0, 2**64, dtype=uint64)`` returns the bit generator's ``next_uint64``, 64 uniform bits
    for every numpy bit generator (MT19937 joins two 32-bit outputs). ``bit_generator.random_raw`` does not:
    MT19937 fills only the low 32 bits of each word, so a 64-bit threshold test ``u < T`` would almost always
    succeed. For the 64-bit generators (PCG64, PCG64DXSM, Philox, SFC64, AES-CTR, ChaCha) both return the
    same words and advance the state alike, so seeded outputs are unchanged.
    """
    return rng.integers(0, 2**64, size=size, dtype=np.uint64)


def default_rng(seed: int | None = None) -> np.random.Generator:
    """Shorthand for ``make_randomness(seed).generator()``."""
    return make_randomness(seed).generator()


# --------------------------------------------------------------------------------------------------
# Generator states that survive JSON and ``torch.load(weights_only=True)`` (checkpoints, resume files).

_ARRAY = "ndarray"
_STATE_KINDS = {"PCG64": PCG64, "randomgen.aes.AESCounter": AES_CTR, "randomgen.chacha.ChaCha": CHACHA20}
"""The ``bit_generator`` entry of each generator's state -> its name."""


def _bit_generator_classes() -> Mapping[str, Callable[[], np.random.BitGenerator]]:
    from randomgen import AESCounter, ChaCha

    return {"PCG64": lambda: np.random.PCG64(0), "randomgen.aes.AESCounter": lambda: AESCounter(0),
            "randomgen.chacha.ChaCha": lambda: ChaCha(0, rounds=20)}


def _portable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return {_ARRAY: value.dtype.str, "values": value.tolist()}
    if isinstance(value, Mapping):
        return {str(k): _portable(v) for k, v in value.items()}
    if isinstance(value, np.generic):
        return value.item()
    return value


def _native(value: Any) -> Any:
    if isinstance(value, Mapping):
        if set(value) == {_ARRAY, "values"}:
            return np.asarray(value["values"], dtype=np.dtype(value[_ARRAY]))
        return {k: _native(v) for k, v in value.items()}
    return value


def generator_name_of(generator: np.random.Generator) -> str:
    """Return the name (:data:`GENERATORS`) of ``generator``'s bit generator; ``unspecified`` for another kind."""
    return _STATE_KINDS.get(generator.bit_generator.state["bit_generator"], UNRECORDED)


def portable_state(generator: np.random.Generator) -> dict[str, Any]:
    """Return the bit generator's state with its arrays as ``{"ndarray": dtype, "values": list}``."""
    return _portable(generator.bit_generator.state)


def restore_state(generator: np.random.Generator, state: Mapping[str, Any]) -> np.random.Generator:
    """Set ``generator`` to ``state`` (from :func:`portable_state`) and return it.

    A state of another kind of bit generator (a run started before the secure generator became the default)
    gives a new Generator of that kind instead: the caller keeps the returned one.
    """
    native = _native(state)
    kind = str(native.get("bit_generator")) if isinstance(native, Mapping) else repr(native)
    if kind == generator.bit_generator.state["bit_generator"]:
        generator.bit_generator.state = native
        return generator
    classes = _bit_generator_classes()
    if kind not in classes:
        raise ValueError(f"a saved random stream is of an unknown generator {kind!r}; known: {', '.join(classes)}")
    bit_generator = classes[kind]()
    bit_generator.state = native
    return np.random.Generator(bit_generator)
