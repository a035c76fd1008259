"""Client data of one export run, validated, held in memory or streamed in row blocks, batched in torch.

Packed-bit files stay packed: each client's split is one uint8 tensor of shape (rows, ceil(r·l/8)), and
every batch is unpacked in torch (shift and mask, then float) right before the forward pass. A float copy
of a whole split is never made. Float-feature files (real-valued mechanisms) are float32 tensors.

A split is read once and held (:class:`ClientSplit`) when it is small (``streaming.RESIDENT_SPLIT_BYTES``)
and the memory budget allows; otherwise it is read block by block at every pass
(``streaming.StreamedSplit``), so memory stays O(block) whatever a file's declared size. Both shuffle
alike (``streaming.shuffled_blocks``): the choice never changes a run's result.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import torch

from ldpfl.contract.client_reader import open_client_file, short_error
from ldpfl.contract.manifest import Manifest
from ldpfl.contract.run_dir import validate_run
from ldpfl.contract.schema import SPLITS, ClientMetadata, FormatError
from ldpfl.mechanisms.base import PACKED_BITS

from .clean_files import read_clean_test
from .packed_bits import unpack_bits
from .streaming import ResidencyBudget, StreamedSplit, block_rows, shuffled_blocks


@dataclass
class ClientSplit:
    """One split of one client: stored features (packed uint8 or float32) and int64 labels."""

    features: torch.Tensor
    labels: torch.Tensor
    width: int  # model input width (r·l bits, or r floats)
    packed: bool

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def inputs(self, index: torch.Tensor | slice) -> torch.Tensor:
        """Float32 model inputs of the rows ``index`` (unpacked here when the file holds bits)."""
        rows = self.features[index]
        return unpack_bits(rows, self.width) if self.packed else rows

    def batches(self, batch_size: int, *, generator: torch.Generator | None = None
                ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield (inputs, labels) batches; shuffled with ``generator`` when given, in file order otherwise."""
        n = len(self)
        if generator is None:
            for start in range(0, n, batch_size):
                yield self.inputs(slice(start, start + batch_size)), self.labels[start:start + batch_size]
            return
        row_bytes = int(np.prod(self.features.shape[1:])) * self.features.element_size()
        for block_start, order in shuffled_blocks(n, block_rows(row_bytes, batch_size), generator):
            if order.device != self.features.device:
                order = order.to(self.features.device)
            if block_start:
                order = order + block_start
            for start in range(0, len(order), batch_size):
                index = order[start:start + batch_size]
                yield self.inputs(index), self.labels[index]


@dataclass
class ClientDataset:
    """Client ``index``'s train and test splits and its file's metadata."""

    index: int
    path: Path
    metadata: ClientMetadata
    train: ClientSplit | StreamedSplit
    test: ClientSplit | StreamedSplit

    @property
    def label_histogram(self) -> tuple[int, ...]:
        """Training-split label counts (from the file's attributes, else counted)."""
        recorded = self.metadata.label_histograms.get("train")
        if recorded is not None and len(recorded) == self.metadata.num_classes:
            return tuple(int(v) for v in recorded)
        if isinstance(self.train, StreamedSplit):
            return self.train.label_histogram()
        counts = torch.bincount(self.train.labels.cpu(), minlength=self.metadata.num_classes)
        return tuple(int(v) for v in counts[: self.metadata.num_classes])


@dataclass
class FederatedData:
    """All clients of one run, checked to agree on schema, encoding, width and label space."""

    run_dir: Path
    manifest: Manifest
    clients: list[ClientDataset]

    @property
    def first(self) -> ClientMetadata:
        """Return the first client's metadata (every client agrees on what matters)."""
        return self.clients[0].metadata

    @property
    def input_width(self) -> int:
        """Return the model's input width (r·l bits or r floats)."""
        return self.first.feature_width

    @property
    def num_classes(self) -> int:
        """Return the number of classes."""
        return self.first.num_classes

    @property
    def dataset(self) -> str:
        """Return the dataset name."""
        return self.first.dataset

    @property
    def feature_format(self) -> str:
        """Return ``packed-bits`` or ``float32``."""
        return self.first.feature_format

    def describe(self) -> dict[str, object]:
        """Return a JSON-ready description: clients, format, width, classes, rows."""
        return {
            "run_dir": str(self.run_dir), "dataset": self.dataset, "clients": len(self.clients),
            "feature_format": self.feature_format, "input_width": self.input_width, "num_classes": self.num_classes,
            "feature_mechanism": self.first.mechanism,
            "train_rows": [len(c.train) for c in self.clients], "test_rows": [len(c.test) for c in self.clients],
        }


def load_run(run_dir: str | Path, device: torch.device | str = "cpu") -> FederatedData:
    """Validate the run (``ldpfl.contract.run_dir.validate_run``) and load every client's splits onto ``device``.

    Packed bits stay packed.
    """
    run_dir = Path(run_dir)
    manifest, checked = validate_run(run_dir)
    device = torch.device(device)
    budget = ResidencyBudget.from_memory()
    clients = [load_client(run_dir / record.path, device, budget, index=record.client_index)
               for record, _meta in checked]
    clients.sort(key=lambda c: c.index)
    return FederatedData(run_dir, manifest, clients)


def load_client(path: str | Path, device: torch.device, budget: ResidencyBudget | None = None, *,
                index: int | None = None) -> ClientDataset:
    """Open one validated client file: each split held in memory if ``budget`` allows, else streamed.

    Parameters
    ----------
    path : path
        The client file.
    device : torch.device
        Where batches go.
    budget : ResidencyBudget, optional
        Memory for resident splits; by default a fresh one from the memory available.
    index : int, optional
        The client index (default: the file's attribute ``client_index``).

    Raises
    ------
    FormatError
        The structure, a checksum, a label outside the classes, an empty training split.
    """
    path = Path(path)
    budget = budget if budget is not None else ResidencyBudget.from_memory()
    with open_client_file(path) as (handle, meta, rows):
        packed = meta.feature_format == PACKED_BITS
        splits: dict[str, ClientSplit | StreamedSplit] = {}
        for split in SPLITS:
            features = handle[split]["features"]
            row_bytes = int(features.shape[1]) * features.dtype.itemsize
            if budget.take(rows[split] * (row_bytes + 8)):
                splits[split] = _resident_split(path, handle, split, meta, device, packed)
            else:
                splits[split] = StreamedSplit(path, split, rows[split], meta.feature_width, packed, meta.num_classes,
                                              device, row_bytes)
    if len(splits["train"]) == 0:
        raise FormatError(path, "the training split is empty")
    return ClientDataset(meta.client_index if index is None else index, path, meta, splits["train"], splits["test"])


def _resident_split(path: Path, handle: h5py.File, split: str, meta: ClientMetadata, device: torch.device,
                    packed: bool) -> ClientSplit:
    """Read one split whole (it fits the residency budget); HDF5 verifies every chunk's checksum."""
    try:
        features = np.ascontiguousarray(handle[split]["features"][()])
        labels = np.ascontiguousarray(handle[split]["labels"][()], dtype=np.int64)
    except OSError as error:
        raise FormatError(path, f"data of split {split!r} failed its checksum or could not be read "
                                f"({short_error(error)})") from None
    if labels.size and (labels.min() < 0 or labels.max() >= meta.num_classes):
        raise FormatError(path, f"labels of split {split!r} fall outside [0, {meta.num_classes})")
    return ClientSplit(torch.from_numpy(features).to(device), torch.from_numpy(labels).to(device),
                       meta.feature_width, packed)


def evaluation_splits(data: FederatedData, clients: Sequence[int] | None = None
                      ) -> list[ClientSplit | StreamedSplit]:
    """Return the clients' randomized test splits, whose union the global model is evaluated on."""
    chosen = data.clients if clients is None else [c for c in data.clients if c.index in set(clients)]
    return [c.test for c in chosen if len(c.test)]


def load_clean_tests(data: FederatedData, device: torch.device | str = "cpu") -> list[ClientSplit]:
    """Return each client's clean test split from its local-only file ``client_NNN.local.h5``.

    ``ldpfl export --keep-clean-test`` writes these files: the same records and release as the client's
    test split, UNRANDOMIZED (mechanism ``none``, attribute ``local_only``). Evaluating the global model
    on them is what a silo does when it predicts on its own records, which releases nothing (issue 17
    item 4). Each file must validate, be local-only, and match its client file (dataset, release, width,
    classes, rows of the test split). Clients with an empty clean test split are left out.

    Raises
    ------
    FormatError
        A client without its local file, or a file that does not match (the message says which).
    """
    splits = [load_clean_test(client, device) for client in data.clients]
    return [split for split in splits if len(split)]


def load_clean_test(client: ClientDataset, device: torch.device | str = "cpu") -> ClientSplit:
    """Return one client's clean test split from ``client_NNN.local.h5`` beside its file (:func:`load_clean_tests`).

    The file is read and matched to the client file by ``clean_files.read_clean_test``. A Flower client calls this
    for its own file only: the clean records never leave the silo.
    """
    clean = read_clean_test(client.path, client.index, client.metadata, len(client.test))
    meta = clean.metadata
    return ClientSplit(torch.from_numpy(clean.features).to(device), torch.from_numpy(clean.labels).to(device),
                       meta.feature_width, meta.feature_format == PACKED_BITS)
