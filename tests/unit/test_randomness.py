"""Where randomness comes from: seeds, the CSPRNG default, child streams, refusing global state."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ldpfl import mechanisms as mech
from ldpfl.mechanisms import randomness

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


# ----------------------------------------------------------------------------------------------------
# The secure generator (issue 23): every unseeded stream, and only those.


def test_unseeded_streams_draw_from_the_secure_generator() -> None:
    from randomgen import AESCounter, ChaCha

    root = mech.make_randomness()
    assert root.generator_name in randomness.SECURE_GENERATORS
    assert root.label == f"csprng ({root.generator_name})"
    kind = AESCounter if root.generator_name == "AES-CTR" else ChaCha
    streams = [root.generator(), *root.child_generators(3), *root.generator().spawn(2)]
    assert all(type(g.bit_generator) is kind for g in streams)
    assert "cryptographically secure" in root.description and "privacy" not in root.description


def test_aes_ni_decides_between_aes_ctr_and_chacha20() -> None:
    from randomgen import AESCounter

    assert randomness.secure_generator_name() == ("AES-CTR" if AESCounter(0).use_aesni else "ChaCha20")


def test_without_aes_ni_the_streams_are_chacha20_with_20_rounds(monkeypatch) -> None:
    from randomgen import ChaCha

    monkeypatch.setattr(randomness, "secure_generator_name", lambda: randomness.CHACHA20)
    root = mech.make_randomness()
    generator = root.generator()
    assert type(generator.bit_generator) is ChaCha and generator.bit_generator.state["state"]["rounds"] == 20
    assert root.label == "csprng (ChaCha20)"


def test_seeded_streams_stay_pcg64_byte_for_byte() -> None:
    root = mech.make_randomness(5)
    assert root.generator_name == "PCG64" and root.label == "seeded (PCG64)"
    expected = np.random.Generator(np.random.PCG64(np.random.SeedSequence(5)))
    np.testing.assert_array_equal(root.generator().random(8), expected.random(8))
    child = np.random.Generator(np.random.PCG64(np.random.SeedSequence(5).spawn(2)[1]))
    np.testing.assert_array_equal(root.child_generators(2)[1].integers(0, 2**63, size=8), child.integers(0, 2**63, 8))


@pytest.mark.parametrize("mode", ["csprng", "seeded"])
def test_generator_states_survive_json_and_resume_the_same_draws(mode: str) -> None:
    generator = randomness.stream_generator(np.random.SeedSequence(11), mode)
    generator.random(5)
    saved = json.loads(json.dumps(randomness.portable_state(generator)))
    expected = generator.random(6)
    fresh = randomness.stream_generator(np.random.SeedSequence(12), mode)
    restored = randomness.restore_state(fresh, saved)
    assert restored is fresh  # same kind: set in place
    np.testing.assert_array_equal(restored.random(6), expected)


def test_a_pcg64_state_restores_into_a_pcg64_stream_whatever_the_mode() -> None:
    """A run started before the secure default resumes on its own (PCG64) streams."""
    old = np.random.Generator(np.random.PCG64(7))
    saved = json.loads(json.dumps(randomness.portable_state(old)))
    expected = old.random(4)
    restored = randomness.restore_state(mech.make_randomness().generator(), saved)
    assert randomness.generator_name_of(restored) == "PCG64"
    np.testing.assert_array_equal(restored.random(4), expected)
    with pytest.raises(ValueError, match="unknown generator 'MT19937'"):
        randomness.restore_state(old, randomness.portable_state(np.random.Generator(np.random.MT19937(1))))


def test_reports_name_the_generator() -> None:
    report = mech.create_mechanism("krr").report().with_randomness("csprng", "AES-CTR")
    data = report.to_dict()
    assert data["generator"] == "AES-CTR" and "cryptographically secure" in data["randomness_description"]
    assert mech.PrivacyReport.from_dict(json.loads(json.dumps(data))) == report
    assert "randomness           csprng (AES-CTR): seeded from the OS CSPRNG" in report.format_text()
    old = report.with_randomness("csprng", "PCG64").to_dict()["randomness_description"]
    assert "not cryptographic" in old
    with pytest.raises(ValueError, match="generator must be one of AES-CTR, ChaCha20, PCG64, got 'MT'"):
        report.with_randomness("csprng", "MT")
    with pytest.raises(ValueError, match="key 'generator' must be one of"):
        mech.PrivacyReport.from_dict(data | {"generator": "dice"})
