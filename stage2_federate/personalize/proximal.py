"""SGD with a proximal pull toward the global model: Ditto's personalization objective (torch).

Ditto (Li et al. 2021, eq. 2) personalizes by minimizing F_i(v) + λ/2·‖v − w*‖², the silo's loss plus a tie to the
global model w*. :class:`ProximalSGD` takes plain SGD's step on the (noisy) gradient of F_i, then the proximal step of
the tie, prox(v) = (v + ηλ·w*) / (1 + ηλ), i.e. v ← v − ρ(v − w*) with ρ = ηλ / (1 + ηλ) (forward-backward
splitting; stable at every η and λ). The tie involves no record, so under DP-SGD it is post-processing of the noisy
step: the silo's accountant is unchanged. λ = 0 is plain SGD; λ → ∞ keeps the global model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

__all__ = ["ProximalSGD"]


class ProximalSGD(torch.optim.SGD):
    """``torch.optim.SGD`` followed, at every step, by the proximal step of λ/2·‖v − anchor‖² (one parameter group).

    Parameters
    ----------
    params : iterable of tensors
        The model's parameters, in the order of ``anchor``.
    anchor : iterable of tensors
        The global model's parameters w* (copied).
    proximal : float
        Ditto's λ ≥ 0.
    lr, momentum : float
        SGD's.
    """

    def __init__(self, params: Iterable[torch.Tensor], anchor: Iterable[torch.Tensor], *, proximal: float,
                 lr: float, momentum: float = 0.0):
        super().__init__(list(params), lr=lr, momentum=momentum)
        self.anchor = [a.detach().clone() for a in anchor]
        self.proximal = float(proximal)
        if len(self.anchor) != len(self.param_groups[0]["params"]):
            raise ValueError(f"`anchor` has {len(self.anchor)} tensors for {len(self.param_groups[0]['params'])} "
                             "parameters")

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """SGD's step, then v ← v − ρ(v − w*), ρ = ηλ / (1 + ηλ) (the prox of Ditto's tie)."""
        loss = super().step(closure)
        scaled = self.param_groups[0]["lr"] * self.proximal
        rho = scaled / (1.0 + scaled)
        if rho:
            for parameter, anchor in zip(self.param_groups[0]["params"], self.anchor, strict=True):
                parameter.sub_(rho * (parameter - anchor))
        return loss
