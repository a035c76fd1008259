"""Issue 24 items 3 and 4 for a user's own data: declared sizes before decoding, no reach outside the file.

Each reported input is rebuilt small: an ``.npz`` header declaring (10⁹, 784), a deflated member of
zeros (a zip bomb), an HDF5 dataset declaring (10⁹, 16) with no chunk written, external storage pointing
at another file, an external link, a virtual dataset, a 9000×9000 PNG, a FIFO named ``x.png``. Each is
refused with one line naming the file, and the memory taken is measured in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import h5py
import numpy as np
import pytest
from cli_checks import one_error_line, run
from memory_checks import peak_growth
from PIL import Image

from ldpfl.stage1_features.own_data.errors import DataError
from ldpfl.stage1_features.own_data.load import load_own_data

LABELS = np.arange(10) % 2


def npy_bytes(shape: tuple[int, ...], dtype: str, data: bytes) -> bytes:
    """Return an ``.npy`` file: a header declaring ``shape`` and ``dtype``, then ``data``."""
    import io

    stream = io.BytesIO()
    np.lib.format.write_array_header_2_0(stream, {"descr": np.dtype(dtype).str, "fortran_order": False,
                                                  "shape": shape})
    return stream.getvalue() + data


def labels_npy() -> bytes:
    return npy_bytes(LABELS.shape, "<i8", LABELS.astype("<i8").tobytes())


def test_npz_header_declaring_730_gib_is_refused_without_allocating(tmp_path):
    path = tmp_path / "huge.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.npy", npy_bytes((10**9, 784), "|u1", b"\x00" * 64))
        archive.writestr("y.npy", labels_npy())
    assert path.stat().st_size < 4096
    out, growth = peak_growth(f"""
        from ldpfl.stage1_features.own_data.load import load_own_data
        # --- measure
        load_own_data({str(path)!r})
    """)
    assert out.startswith("DataError") and "declares shape (1000000000, 784)" in out, out
    assert growth < 32, growth


def test_npz_zip_bomb_is_refused_without_decompressing(tmp_path):
    path = tmp_path / "bomb.npz"
    rows, width = 300_000, 1000  # 300 MB of zeros deflate to about 0.3 MB
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        with archive.open("x.npy", "w", force_zip64=True) as member:
            member.write(npy_bytes((rows, width), "|u1", b""))
            block = b"\x00" * (1 << 20)
            for _ in range(rows * width // len(block)):
                member.write(block)
            member.write(b"\x00" * (rows * width % len(block)))
        archive.writestr("y.npy", labels_npy())
    assert path.stat().st_size < 2 << 20
    out, growth = peak_growth(f"""
        from ldpfl.stage1_features.own_data.load import load_own_data
        # --- measure
        load_own_data({str(path)!r})
    """)
    assert out.startswith("DataError") and "decompression bomb" in out, out
    assert growth < 32, growth


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_hdf5_declaring_15_gib_with_nothing_written_is_refused(tmp_path, compression):
    path = tmp_path / "huge.h5"
    with h5py.File(path, "w") as handle:
        handle.create_dataset("x", shape=(10**9, 16), dtype="u1", chunks=(1024, 16), compression=compression)
        handle["y"] = LABELS
    assert path.stat().st_size < 64 * 1024
    out, growth = peak_growth(f"""
        from ldpfl.stage1_features.own_data.load import load_own_data
        # --- measure
        load_own_data({str(path)!r})
    """)
    assert out.startswith("DataError") and "dataset 'x'" in out, out
    assert growth < 32, growth


def test_hdf5_external_storage_is_refused(tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(bytes(range(256)) * 4)
    path = tmp_path / "external.h5"
    with h5py.File(path, "w") as handle:
        handle.create_dataset("x", shape=(16, 64), dtype="u1", external=[(str(secret), 0, 1024)])
        handle["y"] = np.arange(16) % 2
    with pytest.raises(DataError, match="dataset 'x' uses external storage"):
        load_own_data(path)


def test_hdf5_external_link_is_refused(tmp_path):
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as handle:
        handle["x"] = np.zeros((10, 4), dtype=np.float32)
    path = tmp_path / "linked.h5"
    with h5py.File(path, "w") as handle:
        handle["x"] = h5py.ExternalLink(str(other), "x")
        handle["y"] = LABELS
    with pytest.raises(DataError, match="'/x' is an external link"):
        load_own_data(path, x_key="x")


def test_hdf5_virtual_dataset_with_a_missing_source_is_refused(tmp_path):
    path = tmp_path / "virtual.h5"
    layout = h5py.VirtualLayout(shape=(10, 4), dtype="f4")
    layout[:] = h5py.VirtualSource(str(tmp_path / "missing.h5"), "x", shape=(10, 4))
    with h5py.File(path, "w") as handle:
        handle.create_virtual_dataset("x", layout, fillvalue=0)
        handle["y"] = LABELS
    with pytest.raises(DataError, match="dataset 'x' is a virtual dataset"):
        load_own_data(path)


def test_an_image_of_81_megapixels_is_refused_before_it_is_decoded(tmp_path):
    folder = tmp_path / "images"
    for label in ("a", "b"):
        (folder / label).mkdir(parents=True)
        Image.new("L", (8, 8)).save(folder / label / "small.png")
    Image.new("L", (9000, 9000)).save(folder / "a" / "huge.png")
    assert (folder / "a" / "huge.png").stat().st_size < 1 << 20
    out, growth = peak_growth(f"""
        from ldpfl.stage1_features.own_data.load import load_own_data
        # --- measure
        load_own_data({str(folder)!r})
    """)
    assert out.startswith("DataError") and "huge.png" in out and "9000x9000" in out, out
    assert growth < 32, growth


def test_a_fifo_named_like_an_image_does_not_hang_plan(tmp_path):
    folder = tmp_path / "images"
    for label in ("a", "b"):
        (folder / label).mkdir(parents=True)
        Image.new("L", (8, 8)).save(folder / label / "small.png")
    os.mkfifo(folder / "a" / "x.png")
    done = subprocess.run([sys.executable, "-m", "ldpfl.cli", "plan", "--data", str(folder), "--out",
                           str(tmp_path / "plan.json")], capture_output=True, text=True, timeout=120,
                          env=os.environ | {"OMP_NUM_THREADS": "1"})
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "x.png" in lines[0] and "FIFO" in lines[0], done.stderr
    assert not (tmp_path / "plan.json").exists()


@pytest.mark.parametrize("name", ["records.npz", "records.h5", "records.csv"])
def test_a_fifo_as_data_is_refused(tmp_path, name):
    fifo = tmp_path / name
    os.mkfifo(fifo)
    line = one_error_line(run("plan", "--data", fifo, "--out", tmp_path / "plan.json"))
    assert "FIFO" in line and name in line


def test_honest_files_still_read(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, size=(10, 8, 8)).astype(np.uint8)
    np.savez_compressed(tmp_path / "ok.npz", x=x, y=LABELS)
    with h5py.File(tmp_path / "ok.h5", "w") as handle:
        handle.create_dataset("x", data=x, compression="gzip")
        handle["y"] = LABELS
    for name in ("ok.npz", "ok.h5"):
        data = load_own_data(tmp_path / name)
        assert data.x.shape == (10, 8, 8, 1) and list(data.y) == list(LABELS)

