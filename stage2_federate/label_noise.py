"""Training on k-RR labels (issue 22 item 2): the transition matrix T and the loss corrections of Patrini et al.

Patrini, Rozza, Menon, Nock & Qu, "Making deep neural networks robust to label noise: a loss correction
approach", CVPR 2017. With T[i, j] = P(noisy j | clean i), known from the files' ``label_release``:

* **forward** (their Theorem 2): ℓ→(z, ỹ) = CE(Tᵀ softmax(z), ỹ) = -ln Σ_i softmax(z)_i T[i, ỹ]. Not
  unbiased, but its expectation over the noise is minimized by the clean posterior (a proper composite loss).
* **backward** (their Theorem 1): ℓ←(z, ỹ) = (T⁻¹ ℓ(z))_ỹ, with ℓ(z) the vector of the k per-class losses
  -ln softmax(z)_c. Unbiased: E_{ỹ | y}[ℓ←(z, ỹ)] = Σ_j T[y, j] (T⁻¹ ℓ)_j = ℓ_y(z), the clean loss.

``auto`` picks forward when the labels are randomized, none when they are clear. Both engines train with
:func:`label_loss` inside ``model.train_local``; T reaches a Flower client in its ``ClientSetup``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ldpfl.common.errors import ParameterError
from ldpfl.contract.label_release import LabelRelease

if TYPE_CHECKING:
    import torch

from .config import LABEL_NOISE_CORRECTIONS

FORWARD = "forward"
BACKWARD = "backward"
NONE = "none"


@dataclass(frozen=True)
class LabelNoise:
    """The known label noise of a run and the correction training applies (``transition``: T, row-major)."""

    correction: str
    transition: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        """Check the correction and that T is square, row-stochastic and (for backward) invertible."""
        if self.correction not in (FORWARD, BACKWARD):
            raise ValueError(f"label noise correction must be {FORWARD} or {BACKWARD}, got {self.correction!r}")
        matrix = self.matrix()
        if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1] or matrix.shape[0] < 2:
            raise ValueError(f"transition matrix must be k × k with k >= 2, got shape {matrix.shape}")
        if np.any(matrix < 0) or not np.allclose(matrix.sum(axis=1), 1.0, atol=1e-9):
            raise ValueError("transition matrix rows must be probability vectors")

    def matrix(self) -> np.ndarray:
        """Return T as a float64 array."""
        return np.asarray(self.transition, dtype=np.float64)

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form (``ClientSetup.label_noise``, the run's resolved settings)."""
        return {"correction": self.correction, "transition": [list(row) for row in self.transition]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> LabelNoise | None:
        """Rebuild from :meth:`to_dict` (``None`` stays ``None``: plain cross-entropy)."""
        if data is None:
            return None
        return cls(str(data["correction"]), tuple(tuple(float(v) for v in row) for row in data["transition"]))


def resolve_label_noise(correction: str, releases: Sequence[tuple[str, LabelRelease | None]]) -> LabelNoise | None:
    """Return the run's label noise from each client file's ``label_release``, or ``None`` (plain cross-entropy).

    Parameters
    ----------
    correction : str
        ``auto`` (forward for randomized labels, none for clear), ``forward``, ``backward`` or ``none``.
    releases : sequence of (file name, LabelRelease or None)
        Every client file's label release (None, from an older file: clear); all must agree (the same T), or the
        run is refused.

    Raises
    ------
    ParameterError
        Files that disagree on the label release, or a correction asked for clear labels (names
        ``label_noise_correction``).
    """
    if correction not in LABEL_NOISE_CORRECTIONS:
        raise ParameterError(f"`label_noise_correction` must be one of {', '.join(LABEL_NOISE_CORRECTIONS)}, "
                             f"got {correction!r}")
    if not releases:
        return None
    read = [(name, LabelRelease.from_json(value)) for name, value in releases]  # None: an older file's clear labels
    first_name, first = read[0]
    for name, value in read[1:]:
        if _comparable(value) != _comparable(first):
            raise ValueError(f"client files do not share one label release: {name} has {_comparable(value)}, "
                             f"{first_name} has {_comparable(first)}; export every client with the same "
                             "--label-epsilon")
    if first.clear or first.synthetic:
        if correction in (FORWARD, BACKWARD):
            raise ParameterError(f"`label_noise_correction` {correction} needs randomized labels; the files' labels "
                                 "are clear (export with --label-epsilon)")
        return None
    if correction == NONE:
        return None
    matrix = first.transition_matrix()
    assert matrix is not None
    return LabelNoise(FORWARD if correction == "auto" else correction, tuple(tuple(row) for row in matrix.tolist()))


def _comparable(release: LabelRelease) -> dict[str, object]:
    """Return what two files' label releases must share (mechanism, k, p_keep, p_other_each), as the error shows it."""
    written = release.to_json()
    return {k: written[k] for k in ("mechanism", "num_classes", "p_keep", "p_other_each") if k in written}


def label_loss(logits: torch.Tensor, labels: torch.Tensor, noise: LabelNoise | None,
               reduction: str = "mean") -> torch.Tensor:
    """Return the (corrected) cross-entropy of ``logits`` against the released ``labels``.

    ``None``: plain cross-entropy. Forward: -ln (softmax(z) T)_ỹ, in log space as logsumexp_i(log softmax(z)_i
    + ln T[i, ỹ]). Backward: (T⁻¹ ℓ)_ỹ with ℓ_c = -log softmax(z)_c (module docstring).
    """
    import torch
    import torch.nn.functional as F

    if noise is None:
        return F.cross_entropy(logits, labels, reduction=reduction)
    log_p = F.log_softmax(logits, dim=1)
    matrix = torch.as_tensor(noise.matrix(), dtype=log_p.dtype, device=log_p.device)
    if noise.correction == FORWARD:
        log_noisy = torch.logsumexp(log_p.unsqueeze(2) + torch.log(matrix).unsqueeze(0), dim=1)  # ln (p T)_j
        per_row = -log_noisy.gather(1, labels.unsqueeze(1)).squeeze(1)
    else:
        inverse = torch.linalg.inv(matrix)
        per_row = ((-log_p) @ inverse.T).gather(1, labels.unsqueeze(1)).squeeze(1)  # (T⁻¹ ℓ)_ỹ per row
    if reduction == "sum":
        return per_row.sum()
    if reduction == "none":
        return per_row
    return per_row.mean()


__all__ = ["BACKWARD", "FORWARD", "NONE", "LabelNoise", "label_loss", "resolve_label_noise"]
