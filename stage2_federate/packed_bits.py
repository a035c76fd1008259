"""Packed feature bits unpacked in torch, per batch: client files keep r·l bits as ``np.packbits`` bytes."""

from __future__ import annotations

import torch

_SHIFTS_CACHE: dict[torch.device, torch.Tensor] = {}


def _shifts(device: torch.device) -> torch.Tensor:
    """7, 6, …, 0: ``np.packbits`` is big-endian, the first bit sits in the most significant place."""
    if device not in _SHIFTS_CACHE:
        _SHIFTS_CACHE[device] = torch.arange(7, -1, -1, dtype=torch.uint8, device=device)
    return _SHIFTS_CACHE[device]


def unpack_bits(packed: torch.Tensor, width: int) -> torch.Tensor:
    """Unpack uint8 rows (``np.packbits`` layout) into float32 0/1 rows of ``width`` bits."""
    if packed.dtype != torch.uint8 or packed.ndim != 2:
        raise ValueError(f"packed bits must be a 2-D uint8 tensor, got {packed.dtype} of shape {tuple(packed.shape)}")
    if not 0 < width <= packed.shape[1] * 8:
        raise ValueError(f"width must lie in [1, {packed.shape[1] * 8}] for {packed.shape[1]} bytes, got {width}")
    bits = torch.bitwise_and(torch.bitwise_right_shift(packed.unsqueeze(-1), _shifts(packed.device)), 1)
    return bits.reshape(packed.shape[0], -1)[:, :width].to(torch.float32)
