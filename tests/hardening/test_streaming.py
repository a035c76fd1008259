"""Issue 13, stage 2 memory: client splits streamed in row blocks give the same run as resident ones, every
row once per pass, with memory O(block) whatever a file's size.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import torch
from federate_files import write_run

import ldpfl.stage2_federate.data as data_module
from ldpfl.contract.layout import client_file_name
from ldpfl.stage2_federate import streaming
from ldpfl.stage2_federate.data import ClientSplit, load_client, load_run
from ldpfl.stage2_federate.federation import FederationConfig, run_federation
from ldpfl.stage2_federate.model_file import read_model
from ldpfl.stage2_federate.streaming import ResidencyBudget, StreamedSplit, shuffled_blocks

FAST = dict(hidden=(8,), local_epochs=2, batch_size=4, threads=1, seed=5, rounds=2)


@pytest.mark.parametrize("n, per_block", [(10, 16), (10, 10), (37, 8), (64, 4), (1, 1)])
def test_shuffled_blocks_visit_every_row_once(n, per_block) -> None:
    generator = torch.Generator().manual_seed(3)
    rows = torch.cat([perm + start for start, perm in shuffled_blocks(n, per_block, generator)])
    assert sorted(rows.tolist()) == list(range(n))
    if n <= per_block:  # one block: the whole split permuted, as before streaming existed
        assert torch.equal(rows, torch.randperm(n, generator=torch.Generator().manual_seed(3)))


def test_streamed_and_resident_splits_give_the_same_batches(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(streaming, "BLOCK_BYTES", 6 * 8)  # 8 rows of 6 bytes per block: several blocks
    run = write_run(tmp_path / "run", clients=1, rows=40)
    path = run / client_file_name(0)
    resident = load_client(path, torch.device("cpu"), ResidencyBudget(2**30))
    streamed = load_client(path, torch.device("cpu"), ResidencyBudget(0))
    assert isinstance(resident.train, ClientSplit) and isinstance(streamed.train, StreamedSplit)
    assert streamed.label_histogram == resident.label_histogram
    for generator_seed in (None, 1, 2):
        def batches(split, seed=generator_seed):
            generator = None if seed is None else torch.Generator().manual_seed(seed)
            return list(split.batches(4, generator=generator))
        a, b = batches(resident.train), batches(streamed.train)
        assert len(a) == len(b) == 10
        for (xa, ya), (xb, yb) in zip(a, b, strict=True):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_a_streamed_run_equals_a_resident_run(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(streaming, "BLOCK_BYTES", 6 * 8)
    run = write_run(tmp_path / "run", clients=3, rows=40)
    whole = run_federation(run, FederationConfig(**FAST), out_dir=tmp_path / "resident", progress=False)
    monkeypatch.setattr(data_module.ResidencyBudget, "from_memory", classmethod(lambda cls: cls(0)))
    assert all(isinstance(c.train, StreamedSplit) for c in load_run(run).clients)
    streamed = run_federation(run, FederationConfig(**FAST), out_dir=tmp_path / "streamed", progress=False)
    a = read_model(whole.paths["model"]).state_dict
    b = read_model(streamed.paths["model"]).state_dict
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["test_accuracy"] for r in whole.history] == [r["test_accuracy"] for r in streamed.history]


def test_streamed_reading_holds_one_block(tmp_path, monkeypatch) -> None:
    # 8000 rows x 2000 float32 = 61 MiB of training features, read in blocks of about 1 MiB
    monkeypatch.setattr(streaming, "BLOCK_BYTES", 2**20)
    run = write_run(tmp_path / "run", clients=1, rows=8000, features=2000, feature_format="float32")
    client = load_client(run / client_file_name(0), torch.device("cpu"), ResidencyBudget(0))
    tracemalloc.start()
    seen = 0
    for inputs, labels in client.train.batches(256, generator=torch.Generator().manual_seed(0)):
        seen += len(labels)
        del inputs, labels
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert seen == 8000
    assert peak < 8 * 2**20, f"peak {peak / 2**20:.1f} MiB"  # numpy's block buffers, not the 61 MiB split


def test_budget_keeps_small_splits_resident() -> None:
    budget = ResidencyBudget(100, split_limit=60)
    assert budget.take(50) and not budget.take(70) and not budget.take(51) and budget.take(50)
    assert not budget.take(1)
    assert np.isclose(ResidencyBudget.from_memory().split_limit, streaming.RESIDENT_SPLIT_BYTES)
