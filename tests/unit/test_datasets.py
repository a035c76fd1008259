"""Dataset loaders: small files in the real formats (tests/dataset_files.py), the embedded sets, errors."""

from __future__ import annotations

import gzip
import os
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
from dataset_files import (
    cifar_batch_bytes,
    write_cifar10_batches,
    write_covtype,
    write_idx_dataset,
    write_idx_file,
    write_svhn_mat,
)
from repository import ROOT

from ldpfl.contract.datasets import (
    FASHION_MNIST_SYSTEM_DIR,
    DatasetEntry,
    dataset_entry,
    dataset_names,
    paper_optimizer,
    register_dataset,
)
from ldpfl.stage1_features.datasets import loaders as datasets
from ldpfl.stage1_features.datasets.errors import DatasetError
from ldpfl.stage1_features.datasets.loaders import Dataset, load_dataset
from ldpfl.stage1_features.models import cnn


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20240501)


def _check_pooled(ds: Dataset, expected_x: np.ndarray, expected_y: np.ndarray) -> None:
    assert ds.x.dtype == expected_x.dtype and ds.y.dtype == np.int64
    np.testing.assert_array_equal(ds.x, expected_x)
    np.testing.assert_array_equal(ds.y, expected_y)
    assert len(ds) == len(expected_y) and ds.input_shape == expected_x.shape[1:]


# ---------------------------------------------------------------------------------------------------
# Registry


def test_registry_names_and_unknown_name():
    assert dataset_names() == sorted(["mnist", "fashion-mnist", "mnist5k", "digits", "cifar10", "svhn",
                                      "svhn-extra", "covtype"])
    with pytest.raises(ValueError, match=r"unknown dataset 'emnist'; valid names: cifar10, covtype, "):
        load_dataset("emnist")


def test_registry_refuses_a_duplicate_name():
    with pytest.raises(ValueError, match="'mnist' is already registered"):
        register_dataset(dataset_entry("mnist"))


def test_every_registered_dataset_has_a_loader_an_extractor_and_the_papers_optimizer():
    for name in dataset_names():
        entry = dataset_entry(name)
        assert entry.loader in datasets.LOADERS and entry.extractor in cnn.extractor_names()
        assert cnn.resolve_extractor("auto", name) == entry.extractor
    assert [n for n in dataset_names() if paper_optimizer(n) == "adam"] == ["mnist", "mnist5k"]  # LDPFL IV-E
    assert paper_optimizer("my-scans") == "sgd" and cnn.resolve_extractor("auto", "my-scans") == "none"  # own data
    with pytest.raises(ValueError, match="optimizer must be 'adam' or 'sgd'"):
        DatasetEntry("x", "", "", "idx", "none", "rmsprop")


# ---------------------------------------------------------------------------------------------------
# IDX: mnist, fashion-mnist


@pytest.mark.parametrize("gz", [True, False])
@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_idx_loads_pooled_train_then_test(tmp_path, rng, gz, name):
    written = write_idx_dataset(tmp_path, 30, 12, gz=gz, rng=rng)
    ds = load_dataset(name, tmp_path)
    _check_pooled(ds, written.x, written.y)
    assert ds.x.shape == (42, 28, 28, 1) and ds.num_classes == 10 and ds.pixel_scale == pytest.approx(1 / 255)
    assert str(tmp_path) in ds.source and ("t10k-images-idx3-ubyte.gz" in ds.source) == gz


def test_idx_other_image_shape_and_folder_under_data_dir(tmp_path, rng):
    written = write_idx_dataset(tmp_path / "mnist", 8, 4, shape=(10, 12), rng=rng)
    ds = load_dataset("mnist", tmp_path)  # data_dir/<folder> is searched too
    _check_pooled(ds, written.x, written.y)
    assert ds.input_shape == (10, 12, 1)


def test_default_search_uses_repo_data_folder(tmp_path, rng, monkeypatch):
    written = write_idx_dataset(tmp_path / "mnist", 6, 3, rng=rng)
    monkeypatch.setenv(datasets.DATA_DIR_ENV, str(tmp_path))
    _check_pooled(load_dataset("mnist"), written.x, written.y)


def test_default_data_dir_in_a_checkout_and_in_a_wheel(tmp_path, monkeypatch):
    monkeypatch.delenv(datasets.DATA_DIR_ENV, raising=False)
    assert datasets.default_data_dir() == ROOT / "data"  # this checkout
    monkeypatch.setattr(datasets, "SOURCE_DATA_DIR", tmp_path / "site-packages" / "ldpfl" / "data")  # a wheel
    monkeypatch.chdir(tmp_path)
    assert datasets.default_data_dir() == tmp_path / "data"
    monkeypatch.setenv(datasets.DATA_DIR_ENV, str(tmp_path / "mine"))
    assert datasets.default_data_dir() == tmp_path / "mine"


def test_fashion_mnist_searches_the_debian_directory(tmp_path, monkeypatch):
    monkeypatch.setenv(datasets.DATA_DIR_ENV, str(tmp_path))
    dirs = datasets.search_dirs(dataset_entry("fashion-mnist"), None)
    assert dirs == (tmp_path / "fashion-mnist", Path("/usr/share/datasets/fashion-mnist"))
    assert datasets.search_dirs(dataset_entry("mnist"), None) == (tmp_path / "mnist",)
    assert datasets.search_dirs(dataset_entry("mnist"), tmp_path / "d") == (tmp_path / "d", tmp_path / "d" / "mnist")


def test_missing_files_name_files_dirs_and_source(tmp_path):
    with pytest.raises(DatasetError) as caught:
        load_dataset("fashion-mnist", tmp_path)
    message = str(caught.value)
    assert isinstance(caught.value, ValueError) and "\n" not in message  # the CLI shows ValueErrors as one line
    for part in ("train-images-idx3-ubyte[.gz]", "t10k-labels-idx1-ubyte[.gz]", str(tmp_path),
                 str(tmp_path / "fashion-mnist"), "zalandoresearch/fashion-mnist",
                 "apt-get install dataset-fashion-mnist"):
        assert part in message


def test_one_missing_file_is_named_as_partial(tmp_path, rng):
    written = write_idx_dataset(tmp_path, 5, 5, rng=rng)
    written.files[3].unlink()  # t10k-labels-idx1-ubyte.gz
    with pytest.raises(DatasetError, match=rf"partial: {tmp_path} lacks t10k-labels-idx1-ubyte\[\.gz\]\);.*"
                                           r"searched .*yann\.lecun\.com"):
        load_dataset("mnist", tmp_path)


def _corrupt_message(tmp_path: Path, name: str = "mnist") -> str:
    with pytest.raises(DatasetError) as caught:
        load_dataset(name, tmp_path)
    message = str(caught.value)
    assert "\n" not in message and f"searched {tmp_path}" in message and "source: " in message
    return message


def test_bad_magic_is_refused(tmp_path, rng):
    write_idx_dataset(tmp_path, 5, 5, gz=False, rng=rng)
    path = tmp_path / "train-images-idx3-ubyte"
    data = bytearray(path.read_bytes())
    data[3] = 0x01  # 2049 (a labels file) where 2051 is expected
    path.write_bytes(bytes(data))
    message = _corrupt_message(tmp_path)
    assert f"{path} is not a valid IDX image file (bad magic number 2049, expected 2051)" in message


@pytest.mark.parametrize("gz", [False, True])
def test_truncated_file_is_refused(tmp_path, rng, gz):
    written = write_idx_dataset(tmp_path, 5, 5, gz=gz, rng=rng)
    path = written.files[2]  # t10k images
    path.write_bytes(path.read_bytes()[:-40])
    message = _corrupt_message(tmp_path)
    assert f"{path} is not a valid IDX image file" in message
    if not gz:
        assert "truncated: expected 3920 bytes, found 3880" in message


def test_trailing_bytes_and_inconsistent_counts_are_refused(tmp_path, rng):
    written = write_idx_dataset(tmp_path, 5, 5, gz=False, rng=rng)
    labels = written.files[1]
    labels.write_bytes(labels.read_bytes() + b"\x00")
    assert "trailing bytes after the 5 declared" in _corrupt_message(tmp_path)
    write_idx_file(labels, np.zeros(4, dtype=np.uint8), gz=False)
    assert "holds 5 images but" in _corrupt_message(tmp_path)


def test_gzip_garbage_and_out_of_range_labels_are_refused(tmp_path, rng):
    written = write_idx_dataset(tmp_path, 5, 5, rng=rng)
    write_idx_file(written.files[3], np.array([0, 1, 2, 3, 10], dtype=np.uint8))
    assert "labels span [0, 10], expected [0, 9]" in _corrupt_message(tmp_path)
    written.files[0].write_bytes(b"not gzip at all")
    assert f"{written.files[0]} is not a valid IDX image file" in _corrupt_message(tmp_path)


# ---------------------------------------------------------------------------------------------------
# Embedded: mnist5k, digits


def test_mnist5k_is_embedded():
    ds = load_dataset("mnist5k", "/nonexistent")  # data_dir is ignored
    assert ds.x.shape == (5000, 28, 28, 1) and ds.x.dtype == np.uint8 and ds.num_classes == 10
    np.testing.assert_array_equal(np.bincount(ds.y), np.full(10, 500))
    assert ds.x.max() == 255 and 0.05 < (ds.x > 0).mean() < 0.5  # real strokes, not blank or noise
    first = ds.features([0, 4999])
    assert first.dtype == np.float32 and first.shape == (2, 28, 28, 1) and first.max() == 1.0


def test_digits_scale_is_one_sixteenth():
    ds = load_dataset("digits")
    assert ds.x.shape == (1797, 8, 8, 1) and ds.x.max() == 16 and ds.pixel_scale == 1 / 16
    features = ds.features()
    assert features.max() == 1.0 and features.min() == 0.0 and set(np.unique(ds.y)) == set(range(10))


@pytest.mark.skipif(not all((FASHION_MNIST_SYSTEM_DIR / f"{n}.gz").is_file()
                            for n in ("train-images-idx3-ubyte", "t10k-labels-idx1-ubyte")),
                    reason="Fashion-MNIST is not installed in /usr/share/datasets/fashion-mnist "
                           "(apt-get install dataset-fashion-mnist)")
def test_fashion_mnist_from_the_debian_package(monkeypatch, tmp_path):
    monkeypatch.setenv(datasets.DATA_DIR_ENV, str(tmp_path))  # only the system directory can answer
    ds = load_dataset("fashion-mnist")
    assert ds.x.shape == (70000, 28, 28, 1) and ds.x.dtype == np.uint8
    np.testing.assert_array_equal(np.bincount(ds.y), np.full(10, 7000))
    assert "/usr/share/datasets/fashion-mnist" in ds.source


# ---------------------------------------------------------------------------------------------------
# Dataset record


def test_dataset_is_read_only_and_features_are_fresh_float32(rng):
    x = rng.integers(0, 256, size=(6, 4, 4, 1), dtype=np.uint8)
    ds = Dataset("t", x, np.arange(6) % 3, 3, (4, 4, 1), "test", 1 / 255)
    with pytest.raises(ValueError, match="read-only"):
        ds.x[0, 0, 0, 0] = 1
    batch = ds.features(slice(2, 5))
    np.testing.assert_allclose(batch, x[2:5] / 255, rtol=1e-6)
    batch[...] = 7
    assert ds.features(np.array([2]))[0].max() <= 1.0
    np.testing.assert_array_equal(ds.features()[[1, 3]], ds.features([1, 3]))


@pytest.mark.parametrize(("x", "y", "problem"), [
    (np.zeros((3, 2), np.float32), np.zeros(2, np.int64), "3 samples but 2 labels"),
    (np.zeros((3, 2), np.float64), np.zeros(3, np.int64), "x must be float32"),
    (np.zeros((3, 2), np.float32), np.array([0, 1, 5]), r"labels must lie in \[0, 2\], found \[0, 5\]"),
    (np.zeros((3, 2), np.float32), np.zeros(3, np.int32), "labels must be int64"),
])
def test_dataset_validates_its_arrays(x, y, problem):
    with pytest.raises(ValueError, match=problem):
        Dataset("t", x, y, 3, (2,), "test", None)


# ---------------------------------------------------------------------------------------------------
# CIFAR-10


@pytest.mark.parametrize(("py2", "subdir"), [(True, True), (False, False)])
def test_cifar10_batches(tmp_path, rng, py2, subdir):
    written = write_cifar10_batches(tmp_path, 4, 3, rng=rng, py2=py2, subdir=subdir)
    ds = load_dataset("cifar10", tmp_path)
    _check_pooled(ds, written.x, written.y)
    assert ds.x.shape == (23, 32, 32, 3) and ds.pixel_scale == pytest.approx(1 / 255)


def test_cifar10_rows_are_channel_first(tmp_path, rng):
    write_cifar10_batches(tmp_path, 2, rng=rng, subdir=False)
    row = np.zeros((1, 3072), np.uint8)
    row[0, :1024] = 200  # the red plane
    row[0, 1024 + 1] = 77  # green, pixel (row 0, column 1)
    row[0, 2048 + 32] = 99  # blue, pixel (row 1, column 0)
    (tmp_path / "test_batch").write_bytes(pickle.dumps({b"data": row, b"labels": [3]}, protocol=2))
    image = load_dataset("cifar10", tmp_path).x[-1]
    assert np.all(image[..., 0] == 200) and image[0, 1, 1] == 77 and image[1, 0, 2] == 99
    assert image[..., 1:].sum() == 77 + 99


class _RunsShell:
    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_restricted_unpickler_refuses_code_execution(tmp_path, rng):
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_RunsShell(f"echo pwned > {marker}"), protocol=2)
    pickle.loads(payload)  # the plain unpickler runs it: the payload is live
    assert marker.exists()
    marker.unlink()
    write_cifar10_batches(tmp_path, 2, rng=rng, subdir=False)
    (tmp_path / "data_batch_3").write_bytes(payload)
    with pytest.raises(DatasetError, match=rf"{tmp_path / 'data_batch_3'}: refused to unpickle the global "
                                           rf"{os.system.__module__}\.system"):
        load_dataset("cifar10", tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize("payload", [
    pickle.dumps({b"data": eval}, protocol=2),
    pickle.dumps({b"data": np.load}, protocol=4),
    b"\x80\x02c_codecs\nencode\nX\x03\x00\x00\x00abcX\x05\x00\x00\x00rot13\x86R.",
])
def test_restricted_unpickler_refuses_other_globals(tmp_path, rng, payload):
    write_cifar10_batches(tmp_path, 2, rng=rng, subdir=False)
    (tmp_path / "test_batch").write_bytes(payload)
    with pytest.raises(DatasetError, match=r"test_batch: (refused to unpickle the global|not a CIFAR-10)"):
        load_dataset("cifar10", tmp_path)


@pytest.mark.parametrize(("payload", "problem"), [
    (cifar_batch_bytes(np.zeros((2, 32, 32, 3), np.uint8), np.zeros(2))[:-30], "not a CIFAR-10 python batch"),
    (pickle.dumps([1, 2]), "holds a list, expected a dict"),
    (pickle.dumps({b"data": np.zeros((2, 3071), np.uint8), b"labels": [0, 1]}),
     r"'data' must be uint8 of shape \(n, 3072\), got uint8 \(2, 3071\)"),
    (pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}), "must hold 2 labels"),
    (pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": 2}), "must hold 2 labels"),
    (pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": [10]}), r"labels span \[10, 10\]"),
])
def test_corrupt_cifar_batch(tmp_path, rng, payload, problem):
    write_cifar10_batches(tmp_path, 2, rng=rng)
    path = tmp_path / "cifar-10-batches-py" / "data_batch_5"
    path.write_bytes(payload)
    message = _corrupt_message(tmp_path, "cifar10")
    assert str(path) in message and "cifar-10-python.tar.gz" in message
    assert re.search(problem, message)


def test_cifar_missing_batch(tmp_path, rng):
    write_cifar10_batches(tmp_path, 2, rng=rng)
    (tmp_path / "cifar-10-batches-py" / "data_batch_2").unlink()
    with pytest.raises(DatasetError, match=r"lacks data_batch_2.*searched .*cifar-10-batches-py"):
        load_dataset("cifar10", tmp_path)


# ---------------------------------------------------------------------------------------------------
# SVHN


def test_svhn_and_svhn_extra(tmp_path, rng):
    written = write_svhn_mat(tmp_path, 7, 5, n_extra=4, rng=rng)
    ds = load_dataset("svhn", tmp_path)
    _check_pooled(ds, written.x[:12], written.y[:12])
    assert ds.x.shape == (12, 32, 32, 3) and ds.num_classes == 10
    _check_pooled(load_dataset("svhn-extra", tmp_path), written.x, written.y)


def test_svhn_label_ten_is_digit_zero_and_layout(tmp_path, rng):
    from scipy.io import savemat

    write_svhn_mat(tmp_path, 2, 2, rng=rng)
    x = rng.integers(0, 256, size=(32, 32, 3, 3), dtype=np.uint8)
    savemat(tmp_path / "test_32x32.mat", {"X": x, "y": np.array([[10], [1], [9]], dtype=np.uint8)})
    ds = load_dataset("svhn", tmp_path)
    np.testing.assert_array_equal(ds.y[-3:], [0, 1, 9])
    np.testing.assert_array_equal(ds.x[-2], x[:, :, :, 1])


def test_svhn_errors(tmp_path, rng):
    from scipy.io import savemat

    write_svhn_mat(tmp_path, 2, 2, rng=rng)
    with pytest.raises(DatasetError, match=r"lacks extra_32x32\.mat.*ufldl\.stanford\.edu"):
        load_dataset("svhn-extra", tmp_path)
    savemat(tmp_path / "test_32x32.mat", {"X": np.zeros((32, 32, 3, 1), np.uint8), "y": np.zeros((1, 1))})
    assert "labels span [0, 0], expected [1, 10]" in _corrupt_message(tmp_path, "svhn")
    savemat(tmp_path / "test_32x32.mat", {"X": np.zeros((28, 28, 1), np.uint8), "y": np.ones((1, 1))})
    assert "'X' must be uint8 of shape (32, 32, 3, n)" in _corrupt_message(tmp_path, "svhn")
    (tmp_path / "test_32x32.mat").write_bytes(b"garbage" * 30)
    assert f"{tmp_path / 'test_32x32.mat'} is not a readable .mat file" in _corrupt_message(tmp_path, "svhn")


# ---------------------------------------------------------------------------------------------------
# Covertype


@pytest.mark.parametrize("gz", [False, True])
def test_covtype_min_max_scaled(tmp_path, rng, gz):
    written = write_covtype(tmp_path / "covtype", 300, rng=rng, gz=gz)
    ds = load_dataset("covtype", tmp_path)
    assert ds.x.dtype == np.float32 and ds.x.shape == (300, 54) and ds.input_shape == (54,)
    assert ds.pixel_scale is None and ds.num_classes == 7
    np.testing.assert_allclose(ds.x, written.x, atol=1e-6)
    np.testing.assert_array_equal(ds.y, written.y)
    assert ds.x.min() == 0.0 and ds.x.max() == 1.0 and set(np.unique(ds.y)) == set(range(7))
    np.testing.assert_array_equal(ds.features([3, 1]), ds.x[[3, 1]])


def test_covtype_errors(tmp_path, rng):
    path = tmp_path / "covtype.data"
    path.write_text("1,2,3\n4,5,6\n")
    assert f"{path} has shape (2, 3), expected (rows, 55)" in _corrupt_message(tmp_path, "covtype")
    path.write_text(",".join(["1"] * 54 + ["1.5"]) + "\n")
    assert f"{path} is not a covtype CSV of integers" in _corrupt_message(tmp_path, "covtype")
    path.write_text(",".join(["1"] * 54 + ["8"]) + "\n")
    assert "labels span [8, 8], expected [1, 7]" in _corrupt_message(tmp_path, "covtype")
    path.unlink()
    (tmp_path / "covtype.data.gz").write_bytes(gzip.compress(b"1,2\n")[:-6])
    assert "covtype.data.gz is not a covtype CSV" in _corrupt_message(tmp_path, "covtype")
