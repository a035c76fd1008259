"""``ldpfl.stage1_features.own_data``: a silo's own files (image folder, .npz, HDF5, CSV, Parquet) into a Dataset.

Every test writes small files in the real formats with the ecosystem's writers (Pillow, numpy, h5py,
pandas) and checks what ``load_own_data`` gives back: shapes, class order, scaling, and the one-line
``DataError`` naming the file for each bad input.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest
from PIL import Image

from ldpfl.stage1_features.datasets.loaders import Dataset
from ldpfl.stage1_features.own_data.errors import DataError
from ldpfl.stage1_features.own_data.formats import CSV, HDF5, IMAGE_FOLDER, NPZ, PARQUET
from ldpfl.stage1_features.own_data.labels import encode_labels
from ldpfl.stage1_features.own_data.load import OwnDataset, default_extractor, detect_format, load_own_data


def write_image_folder(root: Path, classes: dict[str, int], *, size=(6, 5), mode="L", rng, suffix=".png") -> dict:
    """``classes``: name -> number of images. Returns {relative path: pixel array} as written."""
    written = {}
    for name, count in classes.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            shape = (size[0], size[1]) if mode == "L" else (size[0], size[1], 3)
            pixels = rng.integers(0, 256, size=shape, dtype=np.uint8)
            rel = f"{name}/img_{i:02d}{suffix}"
            Image.fromarray(pixels).save(root / rel)
            written[rel] = pixels
    return written


def assert_one_line(error: pytest.ExceptionInfo, path: Path, *fragments: str) -> None:
    message = str(error.value)
    assert "\n" not in message
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, message


# ---------------------------------------------------------------------------------------------------
# Image folders


def test_image_folder_grayscale_pixels_classes_in_folder_order(tmp_path):
    rng = np.random.default_rng(0)
    root = tmp_path / "silo"
    written = write_image_folder(root, {"dog": 3, "cat": 2, "bird": 1}, rng=rng)
    (root / "README.txt").write_text("ignored")
    (root / "cat" / "notes.txt").write_text("ignored too")
    data = load_own_data(root)
    assert isinstance(data, OwnDataset) and isinstance(data, Dataset)
    assert data.data_format == IMAGE_FOLDER and data.name == "silo"
    assert data.class_names == ("bird", "cat", "dog")  # sorted folder names, as Keras
    assert data.x.dtype == np.uint8 and data.x.shape == (6, 6, 5, 1) and data.input_shape == (6, 5, 1)
    assert data.y.tolist() == [0, 1, 1, 2, 2, 2]
    assert data.pixel_scale == pytest.approx(1 / 255)
    order = ["bird/img_00.png", "cat/img_00.png", "cat/img_01.png", "dog/img_00.png", "dog/img_01.png",
             "dog/img_02.png"]
    np.testing.assert_array_equal(data.x[..., 0], np.stack([written[k] for k in order]))
    features = data.features()
    assert features.dtype == np.float32 and 0.0 <= features.min() and features.max() <= 1.0
    np.testing.assert_allclose(features[..., 0], np.stack([written[k] for k in order]) / 255, atol=1e-6)
    assert data.label_counts() == {"bird": 1, "cat": 2, "dog": 3}


def test_image_folder_rgb_resize_and_color_modes(tmp_path):
    rng = np.random.default_rng(1)
    write_image_folder(tmp_path / "a", {"x": 2}, size=(10, 8), mode="RGB", rng=rng, suffix=".jpg")
    write_image_folder(tmp_path / "a", {"y": 2}, size=(7, 9), mode="RGB", rng=rng)
    data = load_own_data(tmp_path / "a", image_size=(4, 6))
    assert data.x.shape == (4, 4, 6, 3) and data.class_names == ("x", "y")
    grey = load_own_data(tmp_path / "a", image_size=(4, 6), color_mode="grayscale")
    assert grey.x.shape == (4, 4, 6, 1)
    # grayscale images asked for as rgb: R = G = B
    write_image_folder(tmp_path / "g", {"p": 1, "q": 1}, rng=rng)
    rgb = load_own_data(tmp_path / "g", color_mode="rgb")
    assert rgb.x.shape == (2, 6, 5, 3)
    np.testing.assert_array_equal(rgb.x[..., 0], rgb.x[..., 2])


def test_image_folder_mixed_grey_and_colour_without_color_mode_gives_rgb(tmp_path):
    rng = np.random.default_rng(2)
    write_image_folder(tmp_path / "m", {"a": 1}, mode="L", rng=rng)
    write_image_folder(tmp_path / "m", {"b": 1}, mode="RGB", rng=rng)
    data = load_own_data(tmp_path / "m")
    assert data.x.shape == (2, 6, 5, 3)


def test_image_folder_with_plan_classes_keeps_their_order(tmp_path):
    rng = np.random.default_rng(3)
    write_image_folder(tmp_path / "s", {"cat": 1, "dog": 2}, rng=rng)
    data = load_own_data(tmp_path / "s", classes=["dog", "bird", "cat"])
    assert data.class_names == ("dog", "bird", "cat") and data.num_classes == 3
    assert data.y.tolist() == [2, 0, 0]
    with pytest.raises(DataError) as error:
        load_own_data(tmp_path / "s", classes=["dog", "bird"])
    assert_one_line(error, tmp_path / "s", "'cat'", "plan's classes")


def test_image_folder_errors(tmp_path):
    rng = np.random.default_rng(4)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError) as error:
        load_own_data(empty)
    assert_one_line(error, empty, "holds no class subfolders")

    no_images = tmp_path / "no_images"
    (no_images / "a").mkdir(parents=True)
    (no_images / "b").mkdir()
    with pytest.raises(DataError) as error:
        load_own_data(no_images)
    assert_one_line(error, no_images, "holds no images")

    mixed = tmp_path / "mixed"
    write_image_folder(mixed, {"a": 1}, size=(6, 5), rng=rng)
    write_image_folder(mixed, {"b": 1}, size=(7, 5), rng=rng)
    with pytest.raises(DataError) as error:
        load_own_data(mixed)
    assert_one_line(error, mixed, "different sizes", "a/img_00.png is 6x5", "b/img_00.png is 7x5", "image_size")
    assert load_own_data(mixed, image_size=(6, 5)).x.shape == (2, 6, 5, 1)

    broken = tmp_path / "broken"
    write_image_folder(broken, {"a": 1, "b": 1}, rng=rng)
    (broken / "b" / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really a png")
    with pytest.raises(DataError) as error:
        load_own_data(broken)
    assert_one_line(error, broken / "b" / "bad.png", "unreadable image")

    one = tmp_path / "one"
    write_image_folder(one, {"only": 2}, rng=rng)
    with pytest.raises(DataError) as error:
        load_own_data(one)
    assert_one_line(error, one, "one class only", "'only'")

    deep = tmp_path / "deep"
    write_image_folder(deep, {"a": 1, "b": 1}, rng=rng)
    Image.fromarray(np.full((6, 5), 40000, dtype=np.uint16)).save(deep / "b" / "deep.png")
    with pytest.raises(DataError) as error:
        load_own_data(deep)
    assert_one_line(error, deep / "b" / "deep.png", "8 bits")


# ---------------------------------------------------------------------------------------------------
# .npz and HDF5


def test_npz_uint8_images_get_a_channel_and_pixel_scale(tmp_path):
    rng = np.random.default_rng(5)
    x = rng.integers(0, 256, size=(12, 8, 8), dtype=np.uint8)
    y = np.array([3, 1, 10, 3, 1, 10, 3, 1, 10, 3, 1, 10])
    np.savez_compressed(tmp_path / "d.npz", images=x, labels=y)
    data = load_own_data(tmp_path / "d.npz")
    assert data.data_format == NPZ and data.name == "d"
    assert data.x.shape == (12, 8, 8, 1) and data.pixel_scale == pytest.approx(1 / 255)
    assert data.class_names == ("1", "3", "10")  # numeric order, not text order
    assert data.y.tolist() == [1, 0, 2] * 4
    np.testing.assert_array_equal(data.x[..., 0], x)


def test_npz_float_features_kept_and_key_choice(tmp_path):
    rng = np.random.default_rng(6)
    x = rng.random((9, 4)).astype(np.float64)
    y = np.array(["b", "a", "c"] * 3)
    np.savez(tmp_path / "f.npz", x=x, y=y, X=x + 5)
    with pytest.raises(DataError) as error:  # x and X are both there
        load_own_data(tmp_path / "f.npz")
    assert_one_line(error, tmp_path / "f.npz", "'x', 'X'", "pass x_key")
    assert error.value.render(lambda name: "--" + name.replace("_", "-")).endswith("pass --x-key")
    data = load_own_data(tmp_path / "f.npz", x_key="x")
    assert data.x.dtype == np.float32 and data.pixel_scale is None and data.input_shape == (4,)
    np.testing.assert_allclose(data.x, x.astype(np.float32))
    assert data.class_names == ("a", "b", "c") and data.y.tolist() == [1, 0, 2] * 3
    assert data.notes == ()
    shifted = load_own_data(tmp_path / "f.npz", x_key="X")
    assert len(shifted.notes) == 1 and "not [0, 1]" in shifted.notes[0]
    scaled = load_own_data(tmp_path / "f.npz", x_key="X", scale="minmax")
    low, high = (x + 5).min(axis=0), (x + 5).max(axis=0)
    np.testing.assert_allclose(scaled.x, ((x + 5 - low) / (high - low)).astype(np.float32), atol=1e-6)
    with pytest.raises(DataError) as error:
        load_own_data(tmp_path / "f.npz", x_key="inputs")
    assert_one_line(error, tmp_path / "f.npz", "no array 'inputs'", "x_key")


def test_npz_errors(tmp_path):
    bad = tmp_path / "nan.npz"
    x = np.zeros((4, 3), dtype=np.float32)
    x[2, 1] = np.nan
    np.savez(bad, x=x, y=[0, 1, 0, 1])
    with pytest.raises(DataError) as error:
        load_own_data(bad)
    assert_one_line(error, bad, "NaN or infinite", "record 2")

    inf = tmp_path / "inf.npz"
    np.savez(inf, x=np.array([[1.0], [np.inf]]), y=[0, 1])
    with pytest.raises(DataError) as error:
        load_own_data(inf)
    assert_one_line(error, inf, "NaN or infinite")

    lengths = tmp_path / "lengths.npz"
    np.savez(lengths, x=np.zeros((5, 2)), y=[0, 1, 0])
    with pytest.raises(DataError) as error:
        load_own_data(lengths)
    assert_one_line(error, lengths, "5 inputs but 3 labels")

    one = tmp_path / "one.npz"
    np.savez(one, x=np.zeros((3, 2)), y=[7, 7, 7])
    with pytest.raises(DataError) as error:
        load_own_data(one)
    assert_one_line(error, one, "one class only", "'7'")

    empty = tmp_path / "empty.npz"
    np.savez(empty, x=np.zeros((0, 2)), y=np.zeros(0, dtype=int))
    with pytest.raises(DataError) as error:
        load_own_data(empty)
    assert_one_line(error, empty, "no records")

    pickled = tmp_path / "obj.npz"
    np.savez(pickled, x=np.zeros((2, 2)), y=np.array([object(), object()], dtype=object))
    with pytest.raises(DataError) as error:
        load_own_data(pickled)
    assert_one_line(error, pickled, "not numeric arrays")

    fractional = tmp_path / "frac.npz"
    np.savez(fractional, x=np.zeros((2, 2)), y=[0.5, 1.0])
    with pytest.raises(DataError) as error:
        load_own_data(fractional)
    assert_one_line(error, fractional, "integers or text")

    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"this is not a zip file")
    with pytest.raises(DataError) as error:
        load_own_data(garbage)
    assert_one_line(error, garbage, "not a readable .npz")


def test_hdf5_named_datasets_and_byte_labels(tmp_path):
    rng = np.random.default_rng(7)
    x = rng.integers(0, 256, size=(6, 9, 9, 3), dtype=np.uint8)
    with h5py.File(tmp_path / "s.h5", "w") as handle:
        group = handle.create_group("data")
        group["pixels"] = x
        group["diagnosis"] = np.array([b"sick", b"well"] * 3)
    data = load_own_data(tmp_path / "s.h5", x_key="data/pixels", y_key="data/diagnosis")
    assert data.data_format == HDF5 and data.x.shape == (6, 9, 9, 3)
    assert data.class_names == ("sick", "well") and data.y.tolist() == [0, 1] * 3
    with pytest.raises(DataError) as error:
        load_own_data(tmp_path / "s.h5")
    assert_one_line(error, tmp_path / "s.h5", "x_key", "'data/pixels'")

    with h5py.File(tmp_path / "v.hdf5", "w") as handle:
        handle["x"] = rng.random((4, 2))
        handle.create_dataset("y", data=["u", "v", "u", "v"], dtype=h5py.string_dtype())
    assert load_own_data(tmp_path / "v.hdf5").class_names == ("u", "v")

    with h5py.File(tmp_path / "features.h5", "w") as handle:
        handle.attrs["schema"] = "ldpfl-features"
    with pytest.raises(DataError) as error:
        load_own_data(tmp_path / "features.h5")
    assert_one_line(error, tmp_path / "features.h5", "ldpfl feature file")


# ---------------------------------------------------------------------------------------------------
# Tables


def table_frame(rng) -> pd.DataFrame:
    return pd.DataFrame({"age": rng.integers(20, 90, 10), "dose": rng.random(10) * 40 - 5,
                         "flag": rng.random(10) < 0.5, "outcome": ["yes", "no"] * 5})


def test_csv_and_parquet_min_max_per_column(tmp_path):
    frame = table_frame(np.random.default_rng(8))
    frame.to_csv(tmp_path / "t.csv", index=False)
    frame.to_parquet(tmp_path / "t.parquet", index=False)
    for path, fmt in ((tmp_path / "t.csv", CSV), (tmp_path / "t.parquet", PARQUET)):
        data = load_own_data(path, label_column="outcome")
        assert data.data_format == fmt and data.name == "t"
        assert data.x.dtype == np.float32 and data.input_shape == (3,) and data.pixel_scale is None
        raw = frame[["age", "dose", "flag"]].to_numpy(dtype=np.float64)
        expected = (raw - raw.min(axis=0)) / (raw.max(axis=0) - raw.min(axis=0))
        np.testing.assert_allclose(data.x, expected, atol=1e-6)
        assert data.x.min() == 0.0 and data.x.max() == 1.0
        assert data.class_names == ("no", "yes") and data.y.tolist() == [1, 0] * 5


def test_table_default_label_column_and_integer_labels(tmp_path):
    frame = pd.DataFrame({"a": np.arange(6.0), "label": [2, 0, 1, 2, 0, 1]})
    frame.to_csv(tmp_path / "x.csv.gz", index=False)
    assert detect_format(tmp_path / "x.csv.gz") == CSV
    data = load_own_data(tmp_path / "x.csv.gz")
    assert data.name == "x" and data.class_names == ("0", "1", "2") and data.y.tolist() == [2, 0, 1, 2, 0, 1]


def test_table_errors(tmp_path):
    frame = table_frame(np.random.default_rng(9))
    path = tmp_path / "t.csv"
    frame.to_csv(path, index=False)
    with pytest.raises(DataError) as error:
        load_own_data(path, label_column="diagnosis")
    assert_one_line(error, path, "no label column 'diagnosis'", "'outcome'")
    with pytest.raises(DataError) as error:
        load_own_data(path)  # no label/labels/y/target/class column
    assert_one_line(error, path, "label_column")

    text = tmp_path / "text.csv"
    frame.assign(ward=["north", "south"] * 5).to_csv(text, index=False)
    with pytest.raises(DataError) as error:
        load_own_data(text, label_column="outcome")
    assert_one_line(error, text, "'ward'", "not numeric")

    missing = tmp_path / "missing.csv"
    frame.assign(dose=[np.nan] + list(frame["dose"][1:])).to_csv(missing, index=False)
    with pytest.raises(DataError) as error:
        load_own_data(missing, label_column="outcome")
    assert_one_line(error, missing, "missing values", "dose (1)")

    inf = tmp_path / "inf.parquet"
    frame.assign(dose=[np.inf] + list(frame["dose"][1:])).to_parquet(inf, index=False)
    with pytest.raises(DataError) as error:
        load_own_data(inf, label_column="outcome")
    assert_one_line(error, inf, "NaN or infinite")

    one = tmp_path / "one.csv"
    frame.assign(outcome="yes").to_csv(one, index=False)
    with pytest.raises(DataError) as error:
        load_own_data(one, label_column="outcome")
    assert_one_line(error, one, "one class only")

    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(DataError) as error:
        load_own_data(empty, label_column="outcome")
    assert_one_line(error, empty, "not a readable CSV")


# ---------------------------------------------------------------------------------------------------
# Formats, options, labels


def test_unknown_format_and_missing_path(tmp_path):
    odd = tmp_path / "data.xlsx"
    odd.write_bytes(b"")
    with pytest.raises(DataError) as error:
        load_own_data(odd)
    assert_one_line(error, odd, "unknown data format", ".npz")
    with pytest.raises(DataError) as error:
        load_own_data(tmp_path / "nowhere.npz")
    assert_one_line(error, tmp_path / "nowhere.npz", "no such file")


def test_options_that_do_not_apply_are_refused(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.zeros((2, 2)), y=[0, 1])
    with pytest.raises(ValueError, match="image_size and color_mode apply to image folders only"):
        load_own_data(tmp_path / "a.npz", image_size=(4, 4))
    with pytest.raises(ValueError, match="label_column applies to tables"):
        load_own_data(tmp_path / "a.npz", label_column="y")
    with pytest.raises(ValueError, match="scale must be one of"):
        load_own_data(tmp_path / "a.npz", scale="zscore")
    with pytest.raises(ValueError, match="classes must not repeat"):
        load_own_data(tmp_path / "a.npz", classes=["0", "0"])


def test_encode_labels_order_and_plan_classes(tmp_path):
    y, names = encode_labels(np.array([10, 9, 10, 2]), tmp_path)
    assert names == ("2", "9", "10") and y.tolist() == [2, 1, 2, 0]
    y, names = encode_labels(np.array(["b", "B", "a"]), tmp_path)
    assert names == ("B", "a", "b") and y.tolist() == [2, 0, 1]  # code-point order
    y, names = encode_labels(np.array([1.0, 0.0]), tmp_path, classes=("1", "0", "2"))
    assert names == ("1", "0", "2") and y.tolist() == [0, 1]
    with pytest.raises(DataError, match="label.s. '3' not among the plan's classes"):
        encode_labels(np.array([3, 0]), tmp_path, classes=("0", "1"))
    with pytest.raises(DataError, match="one value per record"):
        encode_labels(np.zeros((3, 2)), tmp_path)


def test_default_extractor(tmp_path):
    rng = np.random.default_rng(10)
    write_image_folder(tmp_path / "big", {"a": 1, "b": 1}, size=(8, 9), rng=rng)
    write_image_folder(tmp_path / "small", {"a": 1, "b": 1}, size=(7, 9), rng=rng)
    np.savez(tmp_path / "flat.npz", x=np.zeros((2, 64)), y=[0, 1])
    assert default_extractor(load_own_data(tmp_path / "big")) == "cifar-cnn"
    assert default_extractor(load_own_data(tmp_path / "small")) == "none"
    assert default_extractor(load_own_data(tmp_path / "flat.npz")) == "none"
