"""Where randomness comes from: seeds, the CSPRNG default, child streams, refusing global state."""

from __future__ import annotations

import numpy as np
import pytest

from ldpfl import mechanisms as mech

RANDOMIZED = [name for name in mech.mechanism_names() if name != "none"]


def test_every_mechanism_but_none_is_randomized() -> None:
    assert {
        "uer",
        "moue",
        "oue",
        "rr",
        "gaussian",
        "gaussian-wu",
        "ldpsign",
        "pdpm",
        "fedaw-gaussian",
    } <= set(RANDOMIZED)


@pytest.mark.parametrize("name", RANDOMIZED)
def test_same_seed_same_output_different_seed_different_output(name, small_mechanism, sample_input) -> None:
    m = small_mechanism(name)
    x = sample_input(m)
    first = m.randomize(x, rng=mech.default_rng(2024))
    again = m.randomize(x, rng=mech.default_rng(2024))
    other = m.randomize(x, rng=mech.default_rng(2025))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    # The same through make_randomness, and a generator is consumed: two calls on one stream differ.
    rng = mech.make_randomness(2024).generator()
    np.testing.assert_array_equal(m.randomize(x, rng=rng), first)
    assert not np.array_equal(m.randomize(x, rng=rng), first)


@pytest.mark.parametrize("name", RANDOMIZED)
@pytest.mark.parametrize("rng", [0, 42, None, np.random.RandomState(0), np.random.PCG64(0)])
def test_a_non_generator_rng_is_refused(name, rng, small_mechanism, sample_input) -> None:
    m = small_mechanism(name)
    with pytest.raises(TypeError, match="numpy.random.Generator"):
        m.randomize(sample_input(m), rng=rng)


def test_rng_is_keyword_only(small_mechanism, sample_input) -> None:
    m = small_mechanism("uer")
    with pytest.raises(TypeError):
        m.randomize(sample_input(m), mech.default_rng(0))


def test_modes() -> None:
    assert mech.make_randomness(None).mode == "csprng"
    assert mech.make_randomness().mode == "csprng"
    assert mech.make_randomness(0).mode == "seeded"
    assert mech.make_randomness(7).mode == "seeded"
    assert "not reproducible" in mech.make_randomness().description
    assert "reproducible" in mech.make_randomness(7).description
    assert "NO privacy against anyone who knows or can guess the seed" in mech.make_randomness(7).description
    assert "privacy" not in mech.make_randomness().description


def test_csprng_mode_is_not_reproducible() -> None:
    a = mech.make_randomness().generator().integers(0, 2**63, size=4)
    b = mech.make_randomness().generator().integers(0, 2**63, size=4)
    assert not np.array_equal(a, b)


@pytest.mark.parametrize("bad", [-1, 1.5, "7", True])
def test_bad_seeds_are_refused(bad) -> None:
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        mech.make_randomness(bad)


def test_seeded_generator_is_reproducible() -> None:
    a = mech.make_randomness(99).generator().random(8)
    b = mech.default_rng(99).random(8)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, mech.default_rng(100).random(8))


def draws(generators: list[np.random.Generator]) -> list[np.ndarray]:
    return [g.random(6) for g in generators]


def test_child_generators_are_deterministic_per_index() -> None:
    root = mech.make_randomness(5)
    three = draws(root.child_generators(3))
    again = draws(root.child_generators(3))
    five = draws(mech.make_randomness(5).child_generators(5))
    for i in range(3):
        np.testing.assert_array_equal(three[i], again[i])
        np.testing.assert_array_equal(three[i], five[i])  # index i is the same stream whatever the count
    # Children differ from each other and from the root stream.
    streams = [tuple(d) for d in five] + [tuple(root.generator().random(6))]
    assert len(set(streams)) == len(streams)
    # Another seed gives other children.
    other = draws(mech.make_randomness(6).child_generators(3))
    assert all(not np.array_equal(a, b) for a, b in zip(three, other, strict=True))


def test_child_generators_match_seed_sequence_spawn() -> None:
    """The children are those of SeedSequence.spawn, so parallel and sequential work agree."""
    spawned = np.random.SeedSequence(5).spawn(4)
    ours = mech.make_randomness(5).child_sequences(4)
    for a, b in zip(spawned, ours, strict=True):
        np.testing.assert_array_equal(a.generate_state(4), b.generate_state(4))


def test_parallel_clients_equal_sequential_clients(small_mechanism, sample_input) -> None:
    m = small_mechanism("uer")
    batches = [sample_input(m, rows=4) for _ in range(3)]
    in_order = [
        m.randomize(b, rng=g)
        for b, g in zip(batches, mech.make_randomness(8).child_generators(3), strict=True)
    ]
    reversed_order = [None] * 3
    generators = mech.make_randomness(8).child_generators(3)
    for i in (2, 0, 1):
        reversed_order[i] = m.randomize(batches[i], rng=generators[i])
    for a, b in zip(in_order, reversed_order, strict=True):
        np.testing.assert_array_equal(a, b)


def test_report_randomness_label() -> None:
    report = mech.create_mechanism("rr", features=2).report()
    assert report.randomness == "unspecified"
    assert report.with_randomness("seeded").randomness == "seeded"
    assert (
        report.with_randomness("csprng").to_dict()["randomness_description"].startswith("seeded from the OS")
    )
    with pytest.raises(ValueError, match="'dice'"):
        report.with_randomness("dice")
    # The seed itself is never part of a report.
    assert "seed" not in report.with_randomness("seeded").to_dict()["parameters"]
