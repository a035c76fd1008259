"""Client splits read from their file in row blocks, so stage 2's memory stays O(block) whatever a file's size.

A split is either *resident* (read once, held as a tensor: ``data.ClientSplit``) or *streamed*
(:class:`StreamedSplit`: each pass reads ``block_rows`` rows at a time from the HDF5 file, every chunk's
Fletcher-32 checksum verified by HDF5 as it is read). Which one is a caching decision only: both
shuffle the same way (:func:`shuffled_blocks`), so a run's result does not depend on it, and a resumed
run may decide differently (with other memory available) and still continue the same run.

The shuffle of one local epoch: the blocks of ``block_rows`` rows in a random order, and the rows of
each block in a random order (both drawn from the client's torch generator). A split of one block
(every split below ``BLOCK_BYTES``) is simply permuted as a whole, as it always was.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np
import torch

from ldpfl.contract.client_reader import short_error
from ldpfl.contract.memory import available_memory
from ldpfl.contract.schema import FormatError

from .packed_bits import unpack_bits

BLOCK_BYTES = 64 * 2**20
"""Stored bytes of one block of rows (features); fixed, so that the shuffle does not depend on the machine."""
RESIDENT_SPLIT_BYTES = 256 * 2**20
"""A split up to this size is read once and held in memory (if the memory budget allows); larger ones stream."""
RESIDENT_TOTAL_BYTES = 4 * 2**30
"""At most this much of all clients' splits is held in memory, and at most a quarter of the memory available."""


class ResidencyBudget:
    """How many bytes of split data may still be held in memory; splits that do not fit are streamed.

    Parameters
    ----------
    total : int
        The bytes available for resident splits.
    split_limit : int
        The largest split held in memory.
    """

    def __init__(self, total: int, split_limit: int = RESIDENT_SPLIT_BYTES) -> None:
        self.left = int(total)
        self.split_limit = int(split_limit)

    @classmethod
    def from_memory(cls) -> ResidencyBudget:
        """Return a budget of a quarter of the memory available, at most ``RESIDENT_TOTAL_BYTES``."""
        available, _ = available_memory()
        total = RESIDENT_TOTAL_BYTES if available is None else min(available // 4, RESIDENT_TOTAL_BYTES)
        return cls(total)

    def take(self, nbytes: int) -> bool:
        """Reserve ``nbytes`` for a resident split and return True, or return False (stream it)."""
        if nbytes > self.split_limit or nbytes > self.left:
            return False
        self.left -= nbytes
        return True


def block_rows(row_bytes: int, batch_size: int) -> int:
    """Return the rows of one block: about ``BLOCK_BYTES`` of stored features, a multiple of ``batch_size``."""
    rows = max(1, BLOCK_BYTES // max(int(row_bytes), 1))
    return max(batch_size, rows - rows % batch_size)


def shuffled_blocks(n: int, rows_per_block: int, generator: torch.Generator) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield ``(block start, permutation of the block's rows)`` for one shuffled pass over ``n`` rows.

    One block (``n <= rows_per_block``): one ``randperm(n)``, the whole split permuted. More: the
    blocks in ``randperm(blocks)`` order, each block's rows in a ``randperm`` of its length.
    """
    if n <= rows_per_block:
        yield 0, torch.randperm(n, generator=generator, device=generator.device)
        return
    blocks = -(-n // rows_per_block)
    for block in torch.randperm(blocks, generator=generator, device=generator.device).tolist():
        start = block * rows_per_block
        length = min(rows_per_block, n - start)
        yield start, torch.randperm(length, generator=generator, device=generator.device)


@dataclass
class StreamedSplit:
    """One split of one client file, read block by block at each pass (never held whole).

    Attributes
    ----------
    path : Path
        The client file (already validated: structure, sha256).
    split : str
        ``train`` or ``test``.
    rows : int
        Its rows.
    width : int
        Model input width (r·l bits, or r floats).
    packed : bool
        Whether the features are packed bits (unpacked per batch).
    num_classes : int
        Labels must lie in ``[0, num_classes)``.
    device : torch.device
        Where batches go.
    row_bytes : int
        Stored bytes of one row.
    """

    path: Path
    split: str
    rows: int
    width: int
    packed: bool
    num_classes: int
    device: torch.device
    row_bytes: int
    _histogram: tuple[int, ...] | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return self.rows

    @contextlib.contextmanager
    def _reader(self) -> Iterator[Callable[..., tuple[torch.Tensor | None, torch.Tensor]]]:
        """Open the file for one pass; yield ``read(start, stop, with_features=True)`` -> (features, labels)."""
        try:
            with h5py.File(self.path, "r") as handle:
                features, labels = handle[self.split]["features"], handle[self.split]["labels"]

                def read(start: int, stop: int, with_features: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
                    block = np.ascontiguousarray(features[start:stop]) if with_features else None
                    block_labels = np.asarray(labels[start:stop], dtype=np.int64)
                    if block_labels.size and (block_labels.min() < 0 or block_labels.max() >= self.num_classes):
                        raise FormatError(self.path, f"labels of split {self.split!r} fall outside "
                                                     f"[0, {self.num_classes})")
                    labels_out = torch.from_numpy(block_labels).to(self.device)
                    return None if block is None else torch.from_numpy(block).to(self.device), labels_out

                yield read
        except OSError as error:
            raise FormatError(self.path, f"data of split {self.split!r} failed its checksum or could not be read "
                                         f"({short_error(error)})") from None

    def _inputs(self, rows: torch.Tensor) -> torch.Tensor:

        return unpack_bits(rows, self.width) if self.packed else rows

    def batches(self, batch_size: int, *, generator: torch.Generator | None = None
                ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield (inputs, labels) batches; shuffled with ``generator`` (:func:`shuffled_blocks`), else in order."""
        per_block = block_rows(self.row_bytes, batch_size)
        with self._reader() as read:
            if generator is None:
                for block_start in range(0, self.rows, per_block):
                    features, labels = read(block_start, min(block_start + per_block, self.rows))
                    assert features is not None
                    for start in range(0, len(labels), batch_size):
                        yield self._inputs(features[start:start + batch_size]), labels[start:start + batch_size]
                return
            for block_start, perm in shuffled_blocks(self.rows, per_block, generator):
                features, labels = read(block_start, block_start + len(perm))
                assert features is not None
                perm = perm.to(features.device)
                for start in range(0, len(perm), batch_size):
                    index = perm[start:start + batch_size]
                    yield self._inputs(features[index]), labels[index]

    def label_histogram(self) -> tuple[int, ...]:
        """Count each class over the split, block by block (cached)."""
        if self._histogram is None:
            counts = np.zeros(self.num_classes, dtype=np.int64)
            per_block = block_rows(self.row_bytes, 1)
            with self._reader() as read:
                for start in range(0, self.rows, per_block):
                    _, labels = read(start, min(start + per_block, self.rows), with_features=False)
                    counts += np.bincount(labels.cpu().numpy(), minlength=self.num_classes)[: self.num_classes]
            self._histogram = tuple(int(c) for c in counts)
        return self._histogram
