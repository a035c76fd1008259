"""Stage-2 input: run validation, packed bits kept packed and unpacked per batch in torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from federate_files import write_run

from ldpfl import mechanisms as mech
from ldpfl.contract.client_reader import read_client_file
from ldpfl.contract.run_dir import validate_run
from ldpfl.contract.schema import FormatError
from ldpfl.stage2_federate.data import ClientSplit, load_run
from ldpfl.stage2_federate.packed_bits import unpack_bits


@pytest.mark.parametrize("width", [1, 7, 8, 13, 48, 80])
def test_unpack_bits_matches_numpy(width) -> None:
    rng = mech.default_rng(width)
    packed = rng.integers(0, 256, size=(17, (width + 7) // 8), dtype=np.uint8)
    out = unpack_bits(torch.from_numpy(packed), width)
    assert out.dtype == torch.float32 and out.shape == (17, width)
    np.testing.assert_array_equal(out.numpy(), np.unpackbits(packed, axis=-1, count=width).astype(np.float32))


def test_unpack_bits_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="uint8"):
        unpack_bits(torch.zeros(2, 3), 8)
    with pytest.raises(ValueError, match=r"width must lie in \[1, 24\]"):
        unpack_bits(torch.zeros(2, 3, dtype=torch.uint8), 25)


def test_batches_cover_every_row_once_and_follow_the_generator() -> None:
    rng = mech.default_rng(1)
    packed = torch.from_numpy(rng.integers(0, 256, size=(50, 2), dtype=np.uint8))
    labels = torch.arange(50)
    split = ClientSplit(packed, labels, 13, packed=True)
    seen = torch.cat([y for _, y in split.batches(16, generator=torch.Generator().manual_seed(3))])
    assert sorted(seen.tolist()) == list(range(50)) and seen.tolist() != list(range(50))
    again = torch.cat([y for _, y in split.batches(16, generator=torch.Generator().manual_seed(3))])
    assert torch.equal(seen, again)
    other = torch.cat([y for _, y in split.batches(16, generator=torch.Generator().manual_seed(4))])
    assert not torch.equal(seen, other)
    in_order = list(split.batches(16))
    assert [len(y) for _, y in in_order] == [16, 16, 16, 2]
    x0, y0 = in_order[0]
    np.testing.assert_array_equal(x0.numpy(), np.unpackbits(packed[:16].numpy(), axis=-1, count=13))
    assert y0.tolist() == list(range(16))


def test_load_packed_run_keeps_bits_packed(tmp_path) -> None:
    write_run(tmp_path, clients=3, rows=40, features=8)
    data = load_run(tmp_path)
    assert len(data.clients) == 3 and data.input_width == 8 * 6 and data.num_classes == 4
    client = data.clients[1]
    assert client.train.features.dtype == torch.uint8 and client.train.features.shape == (40, 6)
    assert client.train.labels.dtype == torch.int64
    assert sum(client.label_histogram) == 40
    stored = read_client_file(tmp_path / "client_001.h5")
    np.testing.assert_array_equal(client.train.features.numpy(), stored.features["train"])
    x, _ = next(client.train.batches(8))
    assert x.shape == (8, 48) and set(torch.unique(x).tolist()) <= {0.0, 1.0}


def test_load_float_run(tmp_path) -> None:
    write_run(tmp_path, clients=2, rows=20, features=5, feature_format=mech.FLOAT32)
    data = load_run(tmp_path)
    assert data.input_width == 5 and data.feature_format == mech.FLOAT32
    assert data.clients[0].train.features.dtype == torch.float32


def test_mismatched_feature_width_names_the_files_and_the_attribute(tmp_path) -> None:
    write_run(tmp_path, clients=3, rows=16, features=8, features_of={2: 9})
    with pytest.raises(ValueError, match=r"attribute 'features' differs: client_000\.h5 has 8, client_002\.h5 has 9"):
        validate_run(tmp_path)


def test_hash_mismatch_and_missing_manifest(tmp_path) -> None:
    write_run(tmp_path, clients=2, rows=16)
    with open(tmp_path / "client_001.h5", "ab") as handle:
        handle.write(b"tampered")
    with pytest.raises(FormatError, match=r"client_001\.h5: sha256 .* does not match"):
        validate_run(tmp_path)
    with pytest.raises(FormatError, match="no manifest"):
        validate_run(tmp_path / "elsewhere")
