"""The pure bit statistics of ``ldpfl inspect`` (``ldpfl.inspection.bits``), against plain numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ldpfl.inspection.bits import count_ones_per_position, position_class_names, reduce_per_class


@pytest.mark.parametrize("width", [1, 7, 8, 64, 120, 121, 1000])
@pytest.mark.parametrize("rows", [0, 1, 300, 700])
def test_count_ones_per_position_equals_unpackbits(width: int, rows: int) -> None:
    """Byte-lane counting (up to 255 rows per lane block) against a plain unpack-and-sum."""
    bits = (np.random.default_rng(width * 1000 + rows).random((rows, width)) < 0.7).astype(np.uint8)
    packed = np.packbits(bits, axis=1) if rows else np.zeros((0, math.ceil(width / 8)), np.uint8)
    np.testing.assert_array_equal(count_ones_per_position(packed, width), bits.sum(axis=0, dtype=np.int64))


def test_count_ones_saturated_rows_do_not_carry() -> None:
    """All-ones rows: 255 per lane block is the largest count a byte holds; 700 rows must not overflow."""
    packed = np.full((700, 9), 0xFF, np.uint8)
    np.testing.assert_array_equal(count_ones_per_position(packed, 72), np.full(72, 700))


def test_reduce_per_class_by_hand() -> None:
    """r = 2 values of l = 3 bits: positions 0..5; even = 0+2+4, odd = 1+3+5, digit j = j + (3 + j)."""
    values = np.arange(6)
    np.testing.assert_array_equal(reduce_per_class(values, 3), [15, 6, 9, 3, 5, 7])
    np.testing.assert_allclose(reduce_per_class(values, 3, how="mean"), [2.5, 2, 3, 1.5, 2.5, 3.5])
    assert position_class_names(["sign", "2^0", "2^-1"]) == ["all", "even", "odd", "sign", "2^0", "2^-1"]
