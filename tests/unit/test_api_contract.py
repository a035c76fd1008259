"""The Python API's edge cases, run over every registered mechanism (issue 23 item 4).

A new mechanism is checked here without new test code: the cases are chosen from its declared domain and
record parameter. Each case failed on the code before issue 23 for at least one mechanism (named in its
docstring); the explicit tests at the end pin those.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from ldpfl import mechanisms as mech
from ldpfl.mechanisms.clipping import clip_l2_norm

NAMES = mech.mechanism_names()
RANDOMIZING = [n for n in NAMES if mech.mechanism_class(n).RANDOMIZES]
REAL_VALUED = [n for n in RANDOMIZING if mech.mechanism_class(n).DOMAIN in ("real", "bounded")]
CATEGORICAL = [n for n in RANDOMIZING if mech.mechanism_class(n).DOMAIN == "category"]
NOT_FLOAT16 = {"clip": 0.3, "safe_range_length": 0.6, "sensitivity": 0.6}
"""Input bounds that float16 cannot hold (0.3 is 0.30005 in float16), where a mechanism takes them."""


def declared(name: str, small_mechanism, sample_input, **params):
    """The mechanism with its record parameter declared as the sample's width, and that sample."""
    cls = mech.mechanism_class(name)
    if cls.RECORD_PARAMETER in ("dim", "width") and mech.create_mechanism(name).record_size() is None:
        params.setdefault(cls.RECORD_PARAMETER, sample_input(mech.create_mechanism(name)).shape[-1])
    m = small_mechanism(name, **params)
    return m, sample_input(m)


def one_line_value_error(call) -> str:
    """Run ``call``; it must raise a ValueError (not numpy's AxisError) with a one-line message."""
    with pytest.raises(ValueError) as caught:
        call()
    assert not isinstance(caught.value, np.exceptions.AxisError), caught.value
    message = str(caught.value)
    assert message and "\n" not in message
    return message


@pytest.mark.parametrize("name", RANDOMIZING)
def test_a_0d_input_is_refused_in_one_line(name: str, small_mechanism, sample_input) -> None:
    """Before: gaussian, gaussian-wu, pdpm and ldpsign randomized a 0-d value; fedaw-gaussian raised AxisError."""
    m, x = declared(name, small_mechanism, sample_input)
    one_line_value_error(lambda: m.randomize(x.reshape(-1)[0], rng=mech.default_rng(1)))


@pytest.mark.parametrize("name", RANDOMIZING)
def test_the_declared_record_width_is_enforced(name: str, small_mechanism, sample_input) -> None:
    """A record of another width is refused naming both widths (before: gaussian, gaussian-wu, pdpm, ldpsign)."""
    m, x = declared(name, small_mechanism, sample_input)
    width = x.shape[-1]  # r*l bits, k categories, d values
    message = one_line_value_error(lambda: m.randomize(x[..., : width - 1], rng=mech.default_rng(1)))
    assert str(width) in message and str(width - 1) in message, message


@pytest.mark.parametrize("name", REAL_VALUED)
def test_inputs_are_clipped_in_float64(name: str, small_mechanism, sample_input) -> None:
    """float16 input gives what its exact float64 values give (before: gaussian clipped c = 0.3 at 0.30005)."""
    params = {k: v for k, v in NOT_FLOAT16.items() if k in mech.mechanism_class(name).parameter_names()}
    m, x = declared(name, small_mechanism, sample_input, **params)
    half = x.astype(np.float16)
    np.testing.assert_array_equal(m.randomize(half, rng=mech.default_rng(5)),
                                  m.randomize(half.astype(np.float64), rng=mech.default_rng(5)))


@pytest.mark.parametrize("name", REAL_VALUED)
def test_a_huge_record_is_clipped_like_a_large_one(name: str, small_mechanism, sample_input) -> None:
    """|x| ≈ 1e300 clips as |x| ≈ 1e6 does (before: fedaw-gaussian's norm overflowed and clipped to zero)."""
    m, x = declared(name, small_mechanism, sample_input)
    direction = np.sign(x.astype(np.float64)) * (1.0 + np.abs(x))  # every entry beyond any bound once scaled
    np.testing.assert_array_equal(m.randomize(direction * 1e300, rng=mech.default_rng(6)),
                                  m.randomize(direction * 1e6, rng=mech.default_rng(6)))


@pytest.mark.parametrize("name", CATEGORICAL)
@pytest.mark.parametrize(("dtype", "k"), [(np.int8, 200), (np.uint8, 300), (np.int16, 40_000)])
def test_narrow_labels_are_widened_not_wrapped(name: str, dtype: type, k: int) -> None:
    """Labels near the top of their dtype with k beyond it (before: krr cast 199 back to int8 as -57)."""
    m = mech.create_mechanism(name, categories=k, epsilon=1.0)
    labels = np.full(400, np.iinfo(dtype).max, dtype=dtype)
    out = m.randomize_labels(labels, rng=mech.default_rng(7))
    if out.shape == labels.shape:  # a label out (krr); oue-label releases k bits per label
        assert out.min() >= 0 and out.max() < k and out.max() > np.iinfo(dtype).max
        assert np.can_cast(np.min_scalar_type(k - 1), out.dtype)


@pytest.mark.parametrize("name", CATEGORICAL)
def test_one_hot_rows_at_large_k_need_no_k_by_k_matrix(name: str) -> None:
    """k = 10^5: the output row is k entries; np.eye(k) would be 10 GB (before: krr built it)."""
    k = 100_000
    m = mech.create_mechanism(name, categories=k, epsilon=1.0)
    row = np.zeros((1, k), dtype=np.uint8)
    row[0, 7] = 1
    tracemalloc.start()
    try:
        out = m.randomize(row, rng=mech.default_rng(8))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out.shape == row.shape and out.dtype == row.dtype
    assert peak < 64 * 2**20, peak


@pytest.mark.parametrize("kind", [np.random.MT19937, np.random.Philox, np.random.SFC64, np.random.PCG64DXSM])
@pytest.mark.parametrize("name", RANDOMIZING)
def test_any_numpy_bit_generator_is_accepted(name: str, kind: type, small_mechanism, sample_input) -> None:
    """Generators on other bit generators are accepted; their rates are checked in test_bit_generators.py."""
    m, x = declared(name, small_mechanism, sample_input)
    rng = np.random.Generator(kind(9))
    y = m.randomize(x, rng=rng)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert not np.array_equal(y, m.randomize(x, rng=rng))


# --------------------------------------------------------------------------------------------------
# The cases of issue 23, one by one.


def test_krr_int8_labels_with_200_categories_keep_their_values() -> None:
    m = mech.create_mechanism("krr", categories=200, epsilon=0.5)
    out = m.randomize_labels(np.arange(100, dtype=np.int8).repeat(50), rng=mech.default_rng(10))
    assert out.dtype == np.int16 and out.min() >= 0 and out.max() >= 128


def test_fedaw_clips_a_record_of_1e154_to_its_norm_not_to_zero() -> None:
    x = np.full(8, 1e154)
    clipped = clip_l2_norm(x, 1.0)
    assert np.linalg.norm(clipped) == pytest.approx(1.0, rel=1e-12)
    np.testing.assert_allclose(clipped, np.full(8, 1.0 / np.sqrt(8.0)), rtol=1e-12)
    m = mech.create_mechanism("fedaw-gaussian", epsilon=1.0, dim=8)
    rounded = m.lattice_input(x)
    assert np.linalg.norm(rounded) > 0.99 * m.sensitivity / 2.0


def test_gaussian_clips_a_float16_input_at_exactly_0_3() -> None:
    m = mech.create_mechanism("gaussian", epsilon=1.0, clip=0.3, dim=1)
    clipped = m.lattice_input(np.array([1.0], dtype=np.float16))
    assert clipped.dtype == np.float64 and clipped[0] == 0.3


@pytest.mark.parametrize("name", ["gaussian", "gaussian-wu", "pdpm", "ldpsign"])
def test_a_5_value_record_under_dim_3_is_refused(name: str) -> None:
    m = mech.create_mechanism(name, dim=3)
    with pytest.raises(ValueError, match=r"dim = 3.*5|5.*dim = 3"):
        m.randomize(np.zeros((2, 5)), rng=mech.default_rng(11))
