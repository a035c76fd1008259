"""The formats of the user's own data that ``load_own_data`` reads, and the options that go with them."""

from __future__ import annotations

IMAGE_FOLDER = "image-folder"
NPZ = "npz"
HDF5 = "hdf5"
CSV = "csv"
PARQUET = "parquet"
DATA_FORMATS = (IMAGE_FOLDER, NPZ, HDF5, CSV, PARQUET)
"""Formats ``load_own_data`` reads (``data_format``)."""

SUFFIXES = {".npz": NPZ, ".h5": HDF5, ".hdf5": HDF5, ".hdf": HDF5, ".csv": CSV, ".tsv": CSV, ".csv.gz": CSV,
            ".tsv.gz": CSV, ".parquet": PARQUET, ".pq": PARQUET}
"""File name endings and the format they stand for (a directory is an image folder)."""

COLOR_MODES = ("grayscale", "rgb")
SCALES = ("auto", "minmax", "none")
