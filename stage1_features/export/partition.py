"""Splitting a pooled dataset among clients, and each client's own test hold-out.

Three kinds, each deterministic for a given ``numpy.random.Generator``:

``iid``        LDPFL IV-B: shuffle the pool of T_r records, cut it into N_h equal groups of
               T_r // N_h records, client i takes group i.
``dirichlet``  Wu et al. 5.3: each class is split among the clients with proportions ~ Dir(β·1).
``shards``     DP-FedAW 5.1: every client gets ``shards_per_client`` blocks; a fraction ``unb`` of the
               clients (the non-IID ones) get blocks cut from the label-sorted pool, the others blocks
               of shuffled records (details beside ``_shards``).

Decisions (the papers leave these open):

* Every kind partitions among N_h = max(max_clients, num_clients) groups and returns the first
  ``num_clients``, so, for one seed, client i's records are the same whatever N is (LDPFL IV-B fixes the
  per-client share by the largest client count tested). Records of groups beyond N stay unused.
* Records that do not fill a whole group or block (T_r mod N_h, or T_r mod N_h·shards_per_client) are
  dropped at random, never the tail of a label-sorted order.
* Each client's index array is in random order: it carries no label order (``mnist5k`` is sorted by
  label), and its first rows are a uniform sample of the client's data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import Any

import numpy as np

PARTITION_KINDS = ("iid", "dirichlet", "shards")
DIRICHLET_MAX_ATTEMPTS = 1000
DEFAULT_TEST_FRACTION = 0.1  # LDPFL IV-C: "each client used 90% of local data for training and 10% for testing"


@dataclass(frozen=True, eq=False)
class Partition:
    """The result of a partition: the clients' index arrays plus what produced them.

    Attributes
    ----------
    kind : str
        One of ``PARTITION_KINDS``.
    clients : list of np.ndarray
        ``num_clients`` disjoint int64 arrays of row indices into the pooled dataset, each in random order.
    groups : int
        N_h, the number of groups the pool was cut into (``max(max_clients, num_clients)``).
    non_iid : np.ndarray or None
        ``shards`` only: bool per returned client, True for the clients whose blocks come from the
        label-sorted pool.
    parameters : dict
        The parameters that matter for ``kind`` (β, unb, shards_per_client …).
    """

    kind: str
    clients: list[np.ndarray] = field(repr=False)
    groups: int
    non_iid: np.ndarray | None = field(repr=False)
    parameters: dict[str, Any]

    def describe(self) -> dict[str, Any]:
        """Return a JSON-ready record of the partition (for the ``partition`` attribute of the output files)."""
        record: dict[str, Any] = {"kind": self.kind, "num_clients": len(self.clients), "groups": self.groups,
                                  "client_sizes": [int(c.size) for c in self.clients], **self.parameters}
        if self.non_iid is not None:
            record["non_iid_clients"] = [int(i) for i in np.flatnonzero(self.non_iid)]
        return record


def make_partition(labels: np.ndarray, num_clients: int, *, kind: str, rng: np.random.Generator,
                   max_clients: int | None = None, beta: float = 0.5, unb: float = 0.5,
                   shards_per_client: int = 2, min_samples: int = 10) -> Partition:
    """Split the rows of ``labels`` among ``num_clients`` clients; see the module docstring for the kinds.

    Parameters
    ----------
    labels : np.ndarray
        Non-negative integer labels of the pooled dataset, shape (T_r,).
    num_clients : int
        N ≥ 1, the clients returned.
    kind : str
        ``iid``, ``dirichlet`` or ``shards``.
    rng : np.random.Generator
        Source of every random draw.
    max_clients : int, optional
        N_h, the largest client count of a series of runs (LDPFL IV-B); defaults to ``num_clients``.
    beta : float
        Dirichlet concentration β > 0 (``dirichlet``); small β gives skewed label mixes.
    unb : float
        Fraction 0 ≤ unb ≤ 1 of non-IID clients (``shards``).
    shards_per_client : int
        Blocks per client (``shards``; DP-FedAW uses 2).
    min_samples : int
        Least records per client (``dirichlet``); proportions are redrawn until it holds.

    Returns
    -------
    Partition

    Raises
    ------
    ValueError
        Bad parameters, fewer samples than clients (or blocks), or a Dirichlet split that cannot give
        every client ``min_samples`` records.
    """
    labels = _check_labels(labels)
    num_clients = _check_int("num_clients", num_clients, 1)
    if kind not in PARTITION_KINDS:
        raise ValueError(f"partition kind must be one of {', '.join(PARTITION_KINDS)}; got {kind!r}")
    if max_clients is not None:
        _check_int("max_clients", max_clients, 1)
    groups = max(max_clients or num_clients, num_clients)
    total = labels.size
    if total < groups:
        raise ValueError(f"fewer samples ({total}) than clients ({groups}); need at least one sample each")

    if kind == "iid":
        return Partition(kind, _iid(total, groups, rng)[:num_clients], groups, None, {})
    if kind == "dirichlet":
        beta = _check_positive("beta", beta)
        min_samples = _check_int("min_samples", min_samples, 0)
        clients = _dirichlet(labels, groups, beta, min_samples, rng)[:num_clients]
        return Partition(kind, clients, groups, None, {"beta": beta, "min_samples": min_samples})
    if isinstance(unb, bool) or not isinstance(unb, Real) or not 0.0 <= unb <= 1.0:
        raise ValueError(f"unb must be a number in [0, 1], got {unb!r}")
    shards_per_client = _check_int("shards_per_client", shards_per_client, 1)
    clients, non_iid = _shards(labels, groups, float(unb), shards_per_client, rng)
    return Partition(kind, clients[:num_clients], groups, non_iid[:num_clients],
                     {"unb": float(unb), "shards_per_client": shards_per_client})


def partition_indices(labels: np.ndarray, num_clients: int, *, kind: str, rng: np.random.Generator,
                      max_clients: int | None = None, beta: float = 0.5, unb: float = 0.5,
                      shards_per_client: int = 2, min_samples: int = 10) -> list[np.ndarray]:
    """Return the clients' index arrays of ``make_partition`` (same parameters, same draws)."""
    return make_partition(labels, num_clients, kind=kind, rng=rng, max_clients=max_clients, beta=beta,
                          unb=unb, shards_per_client=shards_per_client, min_samples=min_samples).clients


def holdout_split(indices: np.ndarray, test_fraction: float,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Split one client's indices into its own (train, test) parts (LDPFL IV-C: 90 % / 10 %).

    The test part has round(test_fraction · n) records (halves round up), capped at n − 1 so that the
    training part is never empty; both parts are in random order.

    Parameters
    ----------
    indices : np.ndarray
        The client's row indices, shape (n,).
    test_fraction : float
        0 ≤ f < 1 (``DEFAULT_TEST_FRACTION`` = 0.1 in LDPFL).
    rng : np.random.Generator
        Chooses the test records.
    """
    if (isinstance(test_fraction, bool) or not isinstance(test_fraction, Real)
            or not 0.0 <= test_fraction < 1.0):
        raise ValueError(f"test_fraction must be a number in [0, 1), got {test_fraction!r}")
    indices = np.asarray(indices)
    if indices.ndim != 1 or not (indices.dtype.kind in "iu" or indices.size == 0):
        raise ValueError(f"indices must be a 1-D integer array, got {indices.dtype} {indices.shape}")
    n = indices.size
    n_test = min(math.floor(test_fraction * n + 0.5), max(n - 1, 0))
    order = indices.astype(np.int64)[rng.permutation(n)]
    return order[n_test:], order[:n_test]


# ---------------------------------------------------------------------------------------------------


def _iid(total: int, groups: int, rng: np.random.Generator) -> list[np.ndarray]:
    # LDPFL IV-B: group i = records [i·T_r//N_h, (i+1)·T_r//N_h) of one shuffle of the pool.
    size = total // groups
    return list(rng.permutation(total)[: groups * size].reshape(groups, size))


def _proportional_counts(proportions: np.ndarray, class_counts: np.ndarray) -> np.ndarray:
    """Integer counts per (class, client) that follow ``proportions`` and sum to each class count."""
    cumulative = np.floor(np.cumsum(proportions, axis=1) * class_counts[:, None]).astype(np.int64)
    cumulative = np.minimum(cumulative, class_counts[:, None])
    cumulative[:, -1] = class_counts  # the float cumsum may end a hair below 1
    return np.diff(cumulative, axis=1, prepend=0)


def _dirichlet(labels: np.ndarray, groups: int, beta: float, min_samples: int,
               rng: np.random.Generator) -> list[np.ndarray]:
    # Wu et al. 5.3: per class, proportions p_c ~ Dir(β·1_{N_h}). Decision: when some client would get
    # fewer than min_samples records, the whole matrix of proportions is redrawn (bounded attempts).
    total = labels.size
    if total < groups * min_samples:
        raise ValueError(f"dirichlet split impossible: {total} samples cannot give {groups} clients "
                         f"min_samples={min_samples} each")
    class_counts = np.bincount(labels)
    present = class_counts[class_counts > 0]
    for _ in range(DIRICHLET_MAX_ATTEMPTS):
        proportions = rng.dirichlet(np.full(groups, beta), size=present.size)
        if not np.all(np.isfinite(proportions)):
            continue
        counts = _proportional_counts(proportions, present)  # (classes, clients)
        if counts.sum(axis=0).min() >= min_samples:
            break
    else:
        raise ValueError(f"dirichlet split failed: no draw in {DIRICHLET_MAX_ATTEMPTS} gave all {groups} "
                         f"clients min_samples={min_samples} (beta={beta}); raise beta or lower min_samples")
    shuffled = rng.permutation(total)
    by_class = shuffled[np.argsort(labels[shuffled], kind="stable")]  # class by class, random within
    owner = np.repeat(np.tile(np.arange(groups), present.size), counts.ravel())  # same order as by_class
    order = np.lexsort((rng.random(total), owner))  # group by owner, random order within each client
    return np.split(by_class[order], np.cumsum(counts.sum(axis=0))[:-1])


def _shards(labels: np.ndarray, groups: int, unb: float, per_client: int,
            rng: np.random.Generator) -> tuple[list[np.ndarray], np.ndarray]:
    # DP-FedAW 5.1 builds 2 blocks per user, from the shuffled pool (IID) or from the label-sorted pool
    # (non-IID), and leaves open how the two mix for 0 < unb < 1. Decision:
    #  1. K = round(unb · N_h) clients (halves round up), chosen at random, are non-IID;
    #  2. the pool (less a random remainder) is sorted by label (random order within a label) and cut
    #     into N_h·per_client blocks of s = T_r // (N_h·per_client) records;
    #  3. K·per_client of these blocks are picked by systematic sampling along the label order (evenly
    #     spaced, random start), so every class gives up about the same fraction of its records, and
    #     they are dealt at random, per_client each, to the K non-IID clients (the paper's non-IID
    #     construction: a client may get two blocks of one class);
    #  4. the records of the other blocks are shuffled and dealt to the N_h − K IID clients, whose label
    #     mix therefore stays close to the pool's (within about one block per class).
    # unb = 0 is the paper's IID construction, unb = 1 its non-IID one. Each non-IID client's data is
    # per_client runs of s consecutive records of the label-sorted pool: when every class has ≥ s
    # records, each block spans ≤ 2 classes, so a non-IID client has ≤ 2·per_client classes.
    total = labels.size
    blocks = groups * per_client
    size = total // blocks
    if size == 0:
        raise ValueError(f"fewer samples ({total}) than shards ({groups} clients x {per_client} "
                         "shards_per_client)")
    k = min(math.floor(unb * groups + 0.5), groups)
    non_iid = np.zeros(groups, dtype=bool)
    non_iid[rng.permutation(groups)[:k]] = True
    kept = rng.permutation(total)[: blocks * size]
    sorted_blocks = kept[np.argsort(labels[kept], kind="stable")].reshape(blocks, size)
    chosen = k * per_client
    picked = np.zeros(blocks, dtype=bool)
    if chosen:
        # Steps of blocks/chosen ≥ 1 keep the floors distinct and below `blocks`.
        picked[np.floor((np.arange(chosen) + rng.random()) * (blocks / chosen)).astype(np.int64)] = True
    out = np.empty((groups, per_client * size), dtype=np.int64)
    out[non_iid] = rng.permutation(sorted_blocks[picked]).reshape(k, per_client * size)
    out[~non_iid] = rng.permutation(sorted_blocks[~picked].ravel()).reshape(groups - k, per_client * size)
    return list(rng.permuted(out, axis=1)), non_iid


def _check_labels(labels: np.ndarray) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise ValueError(f"labels must be a 1-D integer array, got {labels.dtype} {labels.shape}")
    if labels.size and labels.min() < 0:
        raise ValueError(f"labels must be >= 0, found {labels.min()}")
    return labels.astype(np.int64, copy=False)


def _check_int(name: str, value: int, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def _check_positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)
