"""Client data of one export run, validated and held in memory once, batched in torch.

Packed-bit files stay packed: each client's split is one uint8 tensor of shape (rows, ceil(r·l/8)), and
every batch is unpacked in torch (shift and mask, then float) right before the forward pass. A float copy
of a whole split is never made. Float-feature files (real-valued mechanisms) are float32 tensors.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from contract.client_reader import read_client_file
from contract.manifest import Manifest
from contract.run_dir import validate_run
from contract.schema import SPLITS, ClientMetadata, FormatError
from mechanisms.base import PACKED_BITS

_SHIFTS_CACHE: dict[torch.device, torch.Tensor] = {}


def _shifts(device: torch.device) -> torch.Tensor:
    """7, 6, …, 0: ``np.packbits`` is big-endian, the first bit sits in the most significant place."""
    if device not in _SHIFTS_CACHE:
        _SHIFTS_CACHE[device] = torch.arange(7, -1, -1, dtype=torch.uint8, device=device)
    return _SHIFTS_CACHE[device]


def unpack_bits(packed: torch.Tensor, width: int) -> torch.Tensor:
    """Unpack uint8 rows (``np.packbits`` layout) into float32 0/1 rows of ``width`` bits."""
    if packed.dtype != torch.uint8 or packed.ndim != 2:
        raise ValueError(f"packed bits must be a 2-D uint8 tensor, got {packed.dtype} of shape {tuple(packed.shape)}")
    if not 0 < width <= packed.shape[1] * 8:
        raise ValueError(f"width must lie in [1, {packed.shape[1] * 8}] for {packed.shape[1]} bytes, got {width}")
    bits = torch.bitwise_and(torch.bitwise_right_shift(packed.unsqueeze(-1), _shifts(packed.device)), 1)
    return bits.reshape(packed.shape[0], -1)[:, :width].to(torch.float32)


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
        order = torch.randperm(n, generator=generator, device=generator.device)
        if order.device != self.features.device:
            order = order.to(self.features.device)
        for start in range(0, n, batch_size):
            index = order[start:start + batch_size]
            yield self.inputs(index), self.labels[index]


@dataclass
class ClientDataset:
    """Client ``index``'s train and test splits and its file's metadata."""

    index: int
    path: Path
    metadata: ClientMetadata
    train: ClientSplit
    test: ClientSplit

    @property
    def label_histogram(self) -> tuple[int, ...]:
        """Training-split label counts (from the file's attributes, else counted)."""
        recorded = self.metadata.label_histograms.get("train")
        if recorded is not None and len(recorded) == self.metadata.num_classes:
            return tuple(int(v) for v in recorded)
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
    """Validate the run (``contract.run_dir.validate_run``) and load every client's splits onto ``device``.

    Packed bits stay packed.
    """
    run_dir = Path(run_dir)
    manifest, checked = validate_run(run_dir)
    device = torch.device(device)
    clients = []
    for record, _meta in checked:
        data = read_client_file(run_dir / record.path)
        meta = data.metadata
        packed = meta.feature_format == PACKED_BITS
        splits = {}
        for split in SPLITS:
            features = np.ascontiguousarray(data.features[split])
            labels = np.ascontiguousarray(data.labels[split], dtype=np.int64)
            splits[split] = ClientSplit(torch.from_numpy(features).to(device), torch.from_numpy(labels).to(device),
                                        meta.feature_width, packed)
        if len(splits["train"]) == 0:
            raise FormatError(run_dir / record.path, "the training split is empty")
        clients.append(ClientDataset(record.client_index, run_dir / record.path, meta, splits["train"],
                                     splits["test"]))
    clients.sort(key=lambda c: c.index)
    return FederatedData(run_dir, manifest, clients)


def evaluation_splits(data: FederatedData, clients: Sequence[int] | None = None) -> list[ClientSplit]:
    """Return the clients' randomized test splits, whose union the global model is evaluated on."""
    chosen = data.clients if clients is None else [c for c in data.clients if c.index in set(clients)]
    return [c.test for c in chosen if len(c.test)]
