"""Duplicated records inside one client file: counted by ``gather`` and ``inspect``, dropped by ``gather --dedupe``.

A record is a stored row and its label. A silo that repeats its records (issue 42: ten copies, with flipped
labels) takes more local steps and a larger share of the pooled test figure than its data earns, and test rows
that repeat its training rows score as if they were seen. Three counts describe a file:

* ``train``: training rows that repeat an earlier training row (rows minus distinct rows);
* ``test``: test rows that repeat an earlier test row;
* ``test_in_train``: test rows, not counted in ``test``, whose record is also a training row.

Rows are compared by a 128-bit digest computed in numpy, a block of rows at a time (never a Python loop over
rows): each 8-byte word of the row's bytes and label is mixed with a constant of its column (the SplitMix64
finaliser, a bijection of 64-bit words) and the mixed words are summed modulo 2^64, twice with independent
constants. Distinct records share a digest with probability about n²/2^129 for n rows, so the counts are exact
for any file ldpfl can read (n ≤ 5·10^7). Memory: 16 bytes per row, plus one block.

A release of few values per coordinate repeats rows by chance: PDPM's three outputs on 12 coordinates, a bit
mechanism over few bits. ``inspect`` flags the counts only beyond chance (:func:`beyond_chance`): two distinct
records, each coordinate drawn independently with the file's own shares of its values, are equal with probability
``P = prod_j sum_v p_jv^2``; n rows hold about ``n(n-1)/2 · P`` equal pairs (Poisson), and a count whose chance
is below ``CHANCE_ALPHA`` is flagged. A ``label`` release (one of k one-hot rows) repeats by construction: its
counts are reported, never flagged (:func:`expected`).

Imports contract and mechanisms only.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from ldpfl.contract import released_statistics
from ldpfl.contract.client_reader import open_client_file, short_error
from ldpfl.contract.client_writer import ClientFileWriter
from ldpfl.contract.release_point import LABEL, parse_release
from ldpfl.contract.schema import SPLITS, ClientMetadata, FormatError, label_histogram

BLOCK_BYTES = 8 << 20
"""Stored bytes of one block of rows read and digested at a time."""
DIGEST = np.dtype([("a", "<u8"), ("b", "<u8")])
"""One row's digest: two 64-bit sums, compared as one 128-bit key."""
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
CHANCE_ALPHA = 1e-6
"""A duplicate count is flagged when distinct records would reach it by chance with probability below this."""


@dataclass(frozen=True)
class DuplicateCount:
    """The duplicated records of one client file (see the module docstring for each count)."""

    train: int = 0
    test: int = 0
    test_in_train: int = 0

    @property
    def total(self) -> int:
        """Return the rows that repeat a record already in the file (what ``--dedupe`` drops)."""
        return self.train + self.test + self.test_in_train

    def to_dict(self) -> dict[str, int]:
        """Return the counts, JSON-ready."""
        return {"train": self.train, "test": self.test, "test_in_train": self.test_in_train, "total": self.total}

    def describe(self) -> str:
        """Return the counts on one line: ``12 duplicated training rows, 0 duplicated test rows, ...``."""
        return (f"{self.train} duplicated training rows, {self.test} duplicated test rows, {self.test_in_train} "
                "test rows that repeat a training row")


def expected(metadata: ClientMetadata) -> bool:
    """Return whether the release repeats rows by construction (``label``: one of k one-hot rows), so not a flag."""
    try:
        return parse_release(metadata.release).kind == LABEL
    except ValueError:
        return False


def log_equal_bits(density: np.ndarray) -> float:
    """Return log P(two rows are equal) for independent bit positions of densities ``density`` (d² + (1-d)²)."""
    d = np.clip(np.asarray(density, dtype=np.float64), 0.0, 1.0)
    return float(np.sum(np.log(np.maximum(d * d + (1.0 - d) * (1.0 - d), 1e-300))))


def log_equal_values(shares: np.ndarray) -> float:
    """Return log P(two rows are equal) from each coordinate's shares of its few values, ``shares`` (r, V).

    A value outside the V counted ones is taken as never repeated (it adds nothing to the sum).
    """
    q = np.sum(np.asarray(shares, dtype=np.float64) ** 2, axis=-1)
    return float(np.sum(np.log(np.maximum(q, 1e-300))))


def chance_pairs(rows: int, log_equal: float) -> float:
    """Return the equal pairs that ``rows`` distinct records hold by chance: ``n(n-1)/2 · exp(log_equal)``."""
    return rows * (rows - 1) / 2.0 * float(np.exp(min(log_equal, 0.0)))


def beyond_chance(count: int, pairs: float, alpha: float = CHANCE_ALPHA) -> bool:
    """Return whether ``count`` repeated rows are beyond chance: P(Poisson(``pairs``) ≥ count) < ``alpha``."""
    if count <= 0:
        return False
    from scipy import special  # lazy: scipy's import is not paid by readers that never flag

    return bool(special.pdtrc(count - 1, max(pairs, 0.0)) < alpha)


def _mix(words: np.ndarray) -> np.ndarray:
    """Return SplitMix64's finaliser of each uint64 word (a bijection that spreads every input bit)."""
    x = words ^ (words >> np.uint64(30))
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _column_constants(columns: int, salt: int) -> np.ndarray:
    """Return one distinct constant per word column (so equal words in other columns do not cancel)."""
    with np.errstate(over="ignore"):
        return _mix((np.arange(columns, dtype=np.uint64) + np.uint64(salt)) * _GOLDEN)


def row_digests(features: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Return the 128-bit digest (``DIGEST``) of each row of ``features`` with its label, vectorized.

    Parameters
    ----------
    features : numpy.ndarray
        (n, w) stored rows, any fixed-size dtype (packed bytes or float32); rows are compared byte for byte.
    labels : numpy.ndarray
        (n,) integer labels.

    Returns
    -------
    numpy.ndarray
        (n,) of dtype ``DIGEST``.
    """
    rows = np.ascontiguousarray(features).reshape(len(features), -1).view(np.uint8)
    width = rows.shape[1]
    padded = np.zeros((len(rows), (width + 7) // 8 * 8 + 8), dtype=np.uint8)
    padded[:, :width] = rows
    padded[:, -8:] = np.asarray(labels, dtype="<i8").reshape(-1, 1).view(np.uint8)
    words = padded.view("<u8")
    out = np.empty(len(rows), dtype=DIGEST)
    with np.errstate(over="ignore"):
        for name, salt in (("a", 1), ("b", 0x5BD1E995)):
            mixed = _mix(words ^ _column_constants(words.shape[1], salt))
            out[name] = mixed.sum(axis=1, dtype=np.uint64)
    return out


def _blocks(path: Path, handle: h5py.File, split: str, block_bytes: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield (features, labels) of ``split`` in row blocks, read through the checksum filter."""
    features, labels = handle[split]["features"], handle[split]["labels"]
    row_bytes = max(1, int(np.prod(features.shape[1:], dtype=np.int64)) * features.dtype.itemsize)
    step = max(1, block_bytes // row_bytes)
    for start in range(0, features.shape[0], step):
        try:
            yield features[start:start + step], labels[start:start + step]
        except OSError as error:
            raise FormatError(path, f"split {split!r} rows {start}:{start + step} failed their checksum or could "
                                    f"not be read ({short_error(error)})") from None


def split_digests(path: str | os.PathLike[str], handle: h5py.File, split: str,
                  block_bytes: int = BLOCK_BYTES) -> np.ndarray:
    """Return the digest of every row of ``split`` of an open client file, in row order (read in blocks)."""
    parts = [row_digests(f, y) for f, y in _blocks(Path(path), handle, split, block_bytes)]
    return np.concatenate(parts) if parts else np.empty(0, dtype=DIGEST)


def first_copies(digests: np.ndarray) -> np.ndarray:
    """Return a boolean mask of the rows whose digest has not appeared earlier (the first copy of each record)."""
    keep = np.zeros(len(digests), dtype=bool)
    if len(digests):
        _, first = np.unique(digests, return_index=True)
        keep[first] = True
    return keep


def count_and_keep(digests: Mapping[str, np.ndarray]) -> tuple[DuplicateCount, dict[str, np.ndarray]]:
    """Return the counts of a file's row digests per split, and the rows ``--dedupe`` keeps per split.

    A test row is kept when it is the first copy among the test rows and its record is not a training row.
    """
    train, test = digests["train"], digests["test"]
    keep_train, keep_test = first_copies(train), first_copies(test)
    in_train = np.isin(test, train) if len(train) and len(test) else np.zeros(len(test), dtype=bool)
    counts = DuplicateCount(train=int(len(train) - keep_train.sum()), test=int(len(test) - keep_test.sum()),
                            test_in_train=int(np.count_nonzero(keep_test & in_train)))
    return counts, {"train": keep_train, "test": keep_test & ~in_train}


def file_digests(path: str | os.PathLike[str], handle: h5py.File,
                 block_bytes: int = BLOCK_BYTES) -> dict[str, np.ndarray]:
    """Return the row digests of both splits of an open client file."""
    return {split: split_digests(path, handle, split, block_bytes) for split in SPLITS}


def count_duplicates(path: str | os.PathLike[str], block_bytes: int = BLOCK_BYTES) -> DuplicateCount:
    """Validate a client file and count its duplicated records (one streamed read; ``FormatError`` if unreadable)."""
    with open_client_file(path) as (handle, _metadata, _rows):
        counts, _ = count_and_keep(file_digests(path, handle, block_bytes))
    return counts


def write_deduplicated(source: str | os.PathLike[str], target: str | os.PathLike[str],
                       keep: Mapping[str, np.ndarray], block_bytes: int = BLOCK_BYTES) -> str:
    """Write ``target``: the client file ``source`` with only the rows ``keep`` marks; return its sha256.

    Every attribute is kept but ``label_histograms``, which is recounted over the kept rows; so is
    ``/stats/input_bit_density``. A ``stats:K`` file is refused: its rows are regenerated from its released
    statistics, so dropping some would contradict them.

    Raises
    ------
    FormatError
        ``source`` does not validate, or is a ``stats:K`` file.
    """
    source = Path(source)
    with open_client_file(source) as (handle, metadata, _rows):
        if released_statistics.GROUP in handle:
            raise FormatError(source, "a stats:K file's rows are drawn from its released statistics; dropping "
                                      "duplicated rows would contradict them, so it is not deduplicated")
        kept_rows = {split: int(np.count_nonzero(keep[split])) for split in SPLITS}
        density = None
        if "stats" in handle and "input_bit_density" in handle["stats"]:
            density = handle["stats"]["input_bit_density"][()]
        labels_kept = {split: handle[split]["labels"][()][keep[split]] for split in SPLITS}
        histograms = {split: label_histogram(labels_kept[split], metadata.num_classes) for split in SPLITS}
        trimmed = dataclasses.replace(metadata, label_histograms=histograms)
        with ClientFileWriter(target, trimmed, kept_rows, input_bit_density=density) as writer:
            for split in SPLITS:
                written, start = 0, 0
                for features, labels in _blocks(source, handle, split, block_bytes):
                    mask = keep[split][start:start + len(features)]
                    start += len(features)
                    if mask.any():
                        writer.write_rows(split, written, features[mask], labels[mask])
                        written += int(mask.sum())
            return writer.commit()


__all__ = ["CHANCE_ALPHA", "DIGEST", "DuplicateCount", "beyond_chance", "chance_pairs", "count_and_keep",
           "count_duplicates", "expected", "file_digests", "first_copies", "log_equal_bits", "log_equal_values",
           "row_digests", "split_digests", "write_deduplicated"]
