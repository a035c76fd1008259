"""``personalize.proximal.ProximalSGD``: SGD's step, then the proximal step of Ditto's λ/2·‖v − w*‖² (Li et al. 2021).

Exact checks on small tensors: one step equals prox(v − η·g) = (v − η·g + ηλ·w*) / (1 + ηλ); λ = 0 is
``torch.optim.SGD`` bit for bit (with momentum); a huge λ returns the anchor; a mismatched anchor is refused.
"""

from __future__ import annotations

import pytest
import torch

from ldpfl.stage2_federate.personalize.proximal import ProximalSGD


def _step(optimizer: torch.optim.Optimizer, parameter: torch.Tensor, gradient: torch.Tensor) -> None:
    parameter.grad = gradient.clone()
    optimizer.step()


def test_one_step_is_the_prox_of_the_tie_after_sgd() -> None:
    generator = torch.Generator().manual_seed(0)
    start, anchor, gradient = (torch.randn(7, generator=generator, dtype=torch.float64) for _ in range(3))
    lr, lam = 0.5, 3.0
    parameter = torch.nn.Parameter(start.clone())
    _step(ProximalSGD([parameter], [anchor], proximal=lam, lr=lr), parameter, gradient)
    expected = (start - lr * gradient + lr * lam * anchor) / (1 + lr * lam)
    torch.testing.assert_close(parameter.detach(), expected, rtol=1e-12, atol=1e-12)


def test_zero_lambda_is_sgd_with_momentum_bit_for_bit() -> None:
    generator = torch.Generator().manual_seed(1)
    start = torch.randn(5, 3, generator=generator)
    gradients = [torch.randn(5, 3, generator=generator) for _ in range(4)]
    ours, theirs = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    proximal = ProximalSGD([ours], [torch.zeros(5, 3)], proximal=0.0, lr=0.3, momentum=0.9)
    plain = torch.optim.SGD([theirs], lr=0.3, momentum=0.9)
    for gradient in gradients:
        _step(proximal, ours, gradient)
        _step(plain, theirs, gradient)
    assert torch.equal(ours.detach(), theirs.detach())


def test_a_huge_lambda_keeps_the_anchor_and_a_moderate_one_moves_toward_it() -> None:
    anchor = torch.arange(4.0)
    far = torch.nn.Parameter(torch.full((4,), 10.0))
    _step(ProximalSGD([far], [anchor], proximal=1e12, lr=1.0), far, torch.ones(4))
    torch.testing.assert_close(far.detach(), anchor)
    plain, tied = torch.nn.Parameter(torch.full((4,), 10.0)), torch.nn.Parameter(torch.full((4,), 10.0))
    _step(torch.optim.SGD([plain], lr=1.0), plain, torch.ones(4))
    _step(ProximalSGD([tied], [anchor], proximal=0.5, lr=1.0), tied, torch.ones(4))
    assert float((tied - anchor).norm()) < float((plain - anchor).norm())


def test_an_anchor_of_another_length_is_refused() -> None:
    with pytest.raises(ValueError, match="`anchor` has 2 tensors for 1 parameters"):
        ProximalSGD([torch.nn.Parameter(torch.zeros(2))], [torch.zeros(2), torch.zeros(2)], proximal=1.0, lr=0.1)
