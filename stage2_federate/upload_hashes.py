"""Stale and copied uploads (issue 42): an upload whose bytes the server has seen before is refused and named.

An honest silo never repeats itself: with noisy training or a perturbation its upload carries fresh noise; without
noise its update is a function of the new global model and of its own training stream, which moves on every round.
So an upload equal, byte for byte, to one of the silo's own uploads of an earlier round is *stale* (resent), one
equal to another silo's upload of an earlier round is *replayed*, and two equal uploads of one round are *copied*:
neither can be told from the other, so both are refused. The server keeps the sha256 of every upload it checked
(:class:`UploadHistory`: digest → the silo and round that first sent it), and the checkpoint keeps them, so a
resumed run still knows the uploads of the rounds before it.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from .round_record import Rejection
from .rounds import ClientResult


def upload_digest(upload: np.ndarray) -> str:
    """Return the sha256 of an upload's dtype, shape and bytes (hex)."""
    array = np.ascontiguousarray(upload)
    digest = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode())
    digest.update(array.tobytes())
    return digest.hexdigest()


@dataclass
class UploadHistory:
    """The digests of the uploads the server has checked: digest → (silo, round) of its first sender."""

    seen: dict[str, tuple[int, int]] = field(default_factory=dict)

    def check(self, round_number: int, results: Sequence[ClientResult]
              ) -> tuple[tuple[ClientResult, ...], tuple[Rejection, ...]]:
        """Return the results whose upload is new, and the silos refused for a stale, replayed or copied upload.

        Every upload's digest is then remembered (a refused one too: resending it later is refused again).
        """
        digests = {r.client: upload_digest(r.upload) for r in results if r.upload is not None}
        counts = Counter(digests.values())
        kept: list[ClientResult] = []
        rejected: list[Rejection] = []
        for result in results:
            digest = digests.get(result.client)
            reason = None if digest is None else self._problem(result.client, digest, digests, counts[digest])
            if reason is None:
                kept.append(result)
            else:
                rejected.append((result.client, reason))
        for client, digest in digests.items():
            self.seen.setdefault(digest, (client, round_number))
        return tuple(kept), tuple(rejected)

    def _problem(self, client: int, digest: str, digests: Mapping[int, str], count: int) -> str | None:
        if count > 1:
            others = sorted(c for c, d in digests.items() if d == digest and c != client)
            return (f"its upload is identical to client {', '.join(map(str, others))}'s in this round (a copied "
                    "upload; neither can be told from the other)")
        if digest in self.seen:
            sender, earlier = self.seen[digest]
            if sender == client:
                return f"its upload repeats its own upload of round {earlier} (a stale upload)"
            return f"its upload repeats client {sender}'s upload of round {earlier} (a replayed upload)"
        return None

    def state(self) -> dict[str, list[int]]:
        """Return the digests as the checkpoint keeps them: digest → [silo, round]."""
        return {digest: [client, round_number] for digest, (client, round_number) in self.seen.items()}

    @classmethod
    def from_state(cls, state: object) -> UploadHistory:
        """Read :meth:`state` back (a checkpoint without it, written before issue 42, gives an empty history)."""
        if not isinstance(state, Mapping):
            return cls()
        return cls({str(d): (int(v[0]), int(v[1])) for d, v in state.items()})

    def copy(self) -> UploadHistory:
        """Return an independent copy (a round's snapshot)."""
        return dataclasses.replace(self, seen=dict(self.seen))
