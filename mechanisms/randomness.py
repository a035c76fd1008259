"""Where every random draw comes from.

A root ``numpy.random.SeedSequence`` is built from the user's seed (reproducible) or from the OS
CSPRNG (the default). Each client gets its own child stream through ``SeedSequence.spawn``, so work
done in parallel gives the same result as work done in order. The seed itself is never written to any
output: only the *mode* is.

Note: the bit generator is PCG64. Its seed comes from the OS CSPRNG, but PCG64 is a statistical
generator, not a cryptographic one.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral

import numpy as np

CSPRNG = "csprng"
SEEDED = "seeded"

RANDOMNESS_DESCRIPTIONS = {
    CSPRNG: "seeded from the OS CSPRNG (not reproducible)",
    SEEDED: "user-seeded: reproducible, for testing and research only; NO privacy against anyone who knows "
            "or can guess the seed (every noise value is then known, so the input can be read back exactly)",
}


@dataclass(frozen=True)
class Randomness:
    """A root seed sequence plus how it was obtained (``mode`` is ``csprng`` or ``seeded``)."""

    seed_sequence: np.random.SeedSequence
    mode: str

    @property
    def description(self) -> str:
        """One line saying where the randomness comes from."""
        return RANDOMNESS_DESCRIPTIONS[self.mode]

    def generator(self) -> np.random.Generator:
        """Return a generator on the root stream."""
        return np.random.Generator(np.random.PCG64(self.seed_sequence))

    def child_sequences(self, count: int) -> list[np.random.SeedSequence]:
        """``count`` independent child seed sequences, the same ones on every call."""
        return [
            np.random.SeedSequence(self.seed_sequence.entropy, spawn_key=(*self.seed_sequence.spawn_key, i))
            for i in range(count)
        ]

    def child_generators(self, count: int) -> list[np.random.Generator]:
        """One independent generator per client (index ``i`` always maps to the same stream)."""
        return [np.random.Generator(np.random.PCG64(s)) for s in self.child_sequences(count)]


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
    succeed. For the 64-bit generators (PCG64, PCG64DXSM, Philox, SFC64) both return the same words and
    advance the state alike, so seeded outputs are unchanged.
    """
    return rng.integers(0, 2**64, size=size, dtype=np.uint64)


def default_rng(seed: int | None = None) -> np.random.Generator:
    """Shorthand for ``make_randomness(seed).generator()``."""
    return make_randomness(seed).generator()
