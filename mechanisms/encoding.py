"""Fixed-point binary encoding of real vectors (LDPFL eq. 14, Algorithm 1 line 7).

Each value becomes l = m + n + 1 bits: a sign bit (1 for negative), then m integer bits and n fraction
bits of |x|, most significant first. A record of r values becomes r·l bits, feature by feature.

Decisions:
* Eq. 14 indexes k from -m to n, which would give m fraction bits and n + 1 integer bits; the prose
  (and Section IV-D: m = 4 integer, n = 5 fraction bits for values in [0, 1]) says the opposite. We
  follow the prose: m integer bits, n fraction bits, plus the sign bit of Algorithm 1.
* The magnitude is ⌊|x|·2^n⌋ as in eq. 14's floor, so decoding loses at most 2^-n.
* Values beyond the largest magnitude (2^m - 2^-n) saturate to it: an overflow never spills into
  neighbouring bits or features. NaN is rejected.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .validation import require_int_in_range

MAX_MAGNITUDE_BITS = 31


@dataclass(frozen=True)
class FixedPointEncoding:
    """Sign-magnitude fixed point with ``integer_bits`` (m) and ``fraction_bits`` (n)."""

    integer_bits: int = 4
    fraction_bits: int = 5

    def __post_init__(self) -> None:
        """Validate m and n (each and their sum at most 31)."""
        require_int_in_range("m (integer bits)", self.integer_bits, 0, MAX_MAGNITUDE_BITS)
        require_int_in_range("n (fraction bits)", self.fraction_bits, 0, MAX_MAGNITUDE_BITS)
        if self.integer_bits + self.fraction_bits > MAX_MAGNITUDE_BITS:
            raise ValueError(
                f"m + n must be at most {MAX_MAGNITUDE_BITS}, got {self.integer_bits + self.fraction_bits}"
            )

    @property
    def bits_per_value(self) -> int:
        """Bits per value, l = m + n + 1."""
        return self.integer_bits + self.fraction_bits + 1

    @property
    def max_code(self) -> int:
        """The largest magnitude code, 2^(m+n) - 1."""
        return (1 << (self.integer_bits + self.fraction_bits)) - 1

    @property
    def max_magnitude(self) -> float:
        """The largest representable |x|: 2^m - 2^-n."""
        return self.max_code / float(1 << self.fraction_bits)

    def position_labels(self) -> list[str]:
        """Names of the l positions inside one value: ``sign``, ``2^(m-1)`` … ``2^0``, ``2^-1`` … ``2^-n``."""
        magnitude = [f"2^{k}" for k in range(self.integer_bits - 1, -self.fraction_bits - 1, -1)]
        return ["sign", *magnitude]

    def _shifts(self) -> np.ndarray:
        return np.arange(self.integer_bits + self.fraction_bits - 1, -1, -1, dtype=np.uint32)

    def encode(self, x: np.ndarray) -> np.ndarray:
        """Encode real values of shape (..., r) into uint8 bits of shape (..., r·l)."""
        x = np.asarray(x)
        if x.ndim == 0:
            raise ValueError("encode expects an array with a feature axis, got a scalar")
        if np.isnan(x).any():
            raise ValueError("cannot encode NaN values")
        scaled = np.abs(x, dtype=np.float64) * float(1 << self.fraction_bits)
        codes = np.minimum(np.floor(scaled), self.max_code).astype(np.uint32)  # eq. 14 floor, saturated
        out = np.empty((*x.shape, self.bits_per_value), dtype=np.uint8)
        out[..., 0] = np.signbit(x) & (x != 0)
        np.bitwise_and(codes[..., None] >> self._shifts(), 1, out=out[..., 1:], casting="unsafe")
        return out.reshape(*x.shape[:-1], x.shape[-1] * self.bits_per_value)

    def decode(self, bits: np.ndarray) -> np.ndarray:
        """Decode uint8 bits of shape (..., r·l) back to float32 values of shape (..., r)."""
        bits = np.asarray(bits)
        l = self.bits_per_value
        if bits.ndim == 0 or bits.shape[-1] % l:
            raise ValueError(f"bit width {bits.shape[-1] if bits.ndim else 0} is not a multiple of l = {l}")
        grouped = bits.reshape(*bits.shape[:-1], bits.shape[-1] // l, l)
        weights = (np.left_shift(1, self._shifts().astype(np.int64)) / float(1 << self.fraction_bits))
        magnitude = grouped[..., 1:].astype(np.float32) @ weights.astype(np.float32)
        return np.where(grouped[..., 0].astype(bool), -magnitude, magnitude).astype(np.float32)


def pack_bits(bits: np.ndarray) -> np.ndarray:
    """Pack 0/1 bits along the last axis into bytes (``np.packbits``, big-endian bit order)."""
    return np.packbits(np.asarray(bits, dtype=np.uint8), axis=-1)


def unpack_bits(packed: np.ndarray, width: int) -> np.ndarray:
    """Inverse of :func:`pack_bits`: the first ``width`` bits of each packed row."""
    return np.unpackbits(np.asarray(packed, dtype=np.uint8), axis=-1, count=width)
