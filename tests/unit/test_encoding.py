"""Fixed-point encoding of LDPFL eq. 14 (sign bit, m integer bits, n fraction bits) and bit packing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ldpfl.mechanisms import FixedPointEncoding, default_rng, pack_bits, unpack_bits

# (m, n) layouts: the paper's (4, 5), no integer part, no fraction part, and a wide one whose
# 23 magnitude bits still decode exactly in float32.
LAYOUTS = [(4, 5), (0, 8), (6, 0), (10, 13)]


def expected_decoding(x: np.ndarray, n: int) -> np.ndarray:
    """sign(x) · ⌊|x|·2^n⌋ / 2^n, the value eq. 14 keeps."""
    return np.sign(x) * np.floor(np.abs(x) * 2.0**n) / 2.0**n


@pytest.mark.parametrize(("m", "n"), LAYOUTS)
def test_round_trip_inside_range(m: int, n: int) -> None:
    enc = FixedPointEncoding(m, n)
    top = enc.max_magnitude
    x = default_rng(11).uniform(-top, top, size=(50, 40))
    x[0, :6] = [0.0, -0.0, top, -top, 2.0**-n, -(2.0**-n)]
    bits = enc.encode(x)
    assert bits.dtype == np.uint8
    assert bits.shape == (50, 40 * (m + n + 1))
    assert set(np.unique(bits)) <= {0, 1}
    decoded = enc.decode(bits)
    assert decoded.dtype == np.float32
    np.testing.assert_array_equal(decoded, expected_decoding(x, n))
    assert np.all(np.abs(decoded - x) < 2.0**-n)


def test_layout_of_one_value() -> None:
    """5.75 with m = 4, n = 5: sign 0, integer part 0101, fraction 11000 (most significant first)."""
    enc = FixedPointEncoding(4, 5)
    assert enc.bits_per_value == 10
    np.testing.assert_array_equal(enc.encode(np.array([5.75])), [0, 0, 1, 0, 1, 1, 1, 0, 0, 0])
    np.testing.assert_array_equal(enc.encode(np.array([-5.75])), [1, 0, 1, 0, 1, 1, 1, 0, 0, 0])
    assert enc.position_labels() == [
        "sign",
        "2^3",
        "2^2",
        "2^1",
        "2^0",
        "2^-1",
        "2^-2",
        "2^-3",
        "2^-4",
        "2^-5",
    ]


def test_sign_bit() -> None:
    enc = FixedPointEncoding(4, 5)
    x = np.array([1.5, -1.5, 0.0, -0.0, -0.01, 0.01])
    signs = enc.encode(x).reshape(len(x), enc.bits_per_value)[:, 0]
    np.testing.assert_array_equal(signs, [0, 1, 0, 0, 1, 0])
    decoded = enc.decode(enc.encode(x))
    np.testing.assert_array_equal(np.signbit(decoded), [False, True, False, False, True, False])
    np.testing.assert_array_equal(np.abs(decoded), [1.5, 1.5, 0.0, 0.0, 0.0, 0.0])


@pytest.mark.parametrize(("m", "n"), LAYOUTS)
@pytest.mark.parametrize("big", [1e9, -1e9, math.inf, -math.inf, 2.0**31, -(2.0**40)])
def test_saturation_leaves_neighbours_alone(m: int, n: int, big: float) -> None:
    enc = FixedPointEncoding(m, n)
    l = enc.bits_per_value
    assert enc.max_magnitude == 2.0**m - 2.0**-n
    neighbours = default_rng(5).uniform(-enc.max_magnitude, enc.max_magnitude, size=4)
    plain = np.array([neighbours[0], neighbours[1], 0.0, neighbours[2], neighbours[3]])
    overflowing = plain.copy()
    overflowing[2] = big
    reference = enc.encode(plain).reshape(5, l)
    saturated = enc.encode(overflowing).reshape(5, l)
    np.testing.assert_array_equal(saturated[[0, 1, 3, 4]], reference[[0, 1, 3, 4]])
    assert saturated[2, 0] == (1 if big < 0 else 0)
    np.testing.assert_array_equal(saturated[2, 1:], np.ones(l - 1, dtype=np.uint8))
    assert enc.decode(saturated.reshape(-1))[2] == math.copysign(enc.max_magnitude, big)


@pytest.mark.parametrize("bad", [[np.nan], [1.0, np.nan, 2.0]])
def test_nan_is_refused(bad: list[float]) -> None:
    with pytest.raises(ValueError, match="NaN"):
        FixedPointEncoding(4, 5).encode(np.array(bad))


@pytest.mark.parametrize(("m", "n", "quoted"), [(-1, 5, "-1"), (4, -3, "-3"), (-2, -2, "-2")])
def test_negative_widths_are_refused(m: int, n: int, quoted: str) -> None:
    with pytest.raises(ValueError, match=f"got {quoted}"):
        FixedPointEncoding(m, n)


def test_decode_refuses_a_width_that_is_not_a_multiple_of_l() -> None:
    with pytest.raises(ValueError, match="not a multiple of l = 10"):
        FixedPointEncoding(4, 5).decode(np.zeros(15, dtype=np.uint8))


@pytest.mark.parametrize("width", [1, 7, 9, 10, 13, 80, 11520, 11523])
def test_pack_unpack_round_trip(width: int) -> None:
    bits = default_rng(width).integers(0, 2, size=(6, width), dtype=np.uint8)
    packed = pack_bits(bits)
    assert packed.dtype == np.uint8
    assert packed.shape == (6, math.ceil(width / 8))
    np.testing.assert_array_equal(unpack_bits(packed, width), bits)


def test_pack_is_big_endian_and_zero_padded() -> None:
    packed = pack_bits(np.array([[1, 0, 1, 1, 0, 0, 0, 0, 1, 1]], dtype=np.uint8))
    np.testing.assert_array_equal(packed, [[0b10110000, 0b11000000]])
