"""Reader of a user's image folder, one subfolder per class, decoded by Pillow (``ldpfl.stage1_features.own_data``).

The layout Keras' ``image_dataset_from_directory`` reads: PNG/JPEG (also BMP/GIF) files in one subfolder
per class, nested folders searched too, hidden entries and other files ignored. Pillow loads on first use.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ldpfl.stage1_features.own_data.errors import DataError, listed
from ldpfl.stage1_features.own_data.limits import check_image_header, require_memory, require_regular

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif")
"""Image files an image folder may hold (Keras' ``ALLOWLIST_FORMATS``), compared case-insensitively."""

DEEP_MODES = ("I", "F")
"""Pillow modes of more than 8 bits per channel (also ``I;16*``): refused, since 8-bit conversion would clip."""


def _image_files(folder: Path) -> list[Path]:
    """Image files under a class folder, recursively, sorted; hidden entries skipped."""
    found: list[Path] = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found.extend(Path(root) / f for f in sorted(files)
                     if not f.startswith(".") and f.lower().endswith(IMAGE_SUFFIXES))
    return found


def read_image_folder(folder: Path, size: tuple[int, int] | None, color_mode: str | None,
                      classes: tuple[str, ...] | None) -> tuple[np.ndarray, np.ndarray, tuple[str, ...], str]:
    """Decode the images of a folder of class subfolders, as uint8 (N, H, W, C).

    ``size`` is (height, width) to resize to (else every image must have the same size); ``color_mode`` is
    ``grayscale``, ``rgb`` or None (grayscale when every image is single-channel); ``classes`` fixes the
    class names and their order (default: the sorted subfolder names).

    Returns
    -------
    (np.ndarray, np.ndarray, tuple of str, str)
        The pixels, the int64 labels, the class names and a description of the source.

    Raises
    ------
    DataError
        No class subfolders or images, an unreadable or deep (> 8 bits) image, images of different sizes.
    """
    from PIL import Image, UnidentifiedImageError

    subfolders = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not subfolders:
        loose = [p.name for p in folder.iterdir() if p.is_file() and p.name.lower().endswith(IMAGE_SUFFIXES)]
        hint = " (its images must sit in one subfolder per class)" if loose else ""
        raise DataError(folder, f"holds no class subfolders{hint}")
    if classes is not None:
        unknown = [s for s in subfolders if s not in classes]
        if unknown:
            raise DataError(folder, f"class folder(s) {listed(unknown)} not among the plan's classes "
                                    f"({', '.join(classes)})")
    names = classes if classes is not None else tuple(subfolders)
    files: list[Path] = []
    labels: list[np.ndarray] = []
    for name in subfolders:
        found = _image_files(folder / name)
        files.extend(found)
        labels.append(np.full(len(found), names.index(name), dtype=np.int64))
    if not files:
        raise DataError(folder, f"holds no images ({', '.join(IMAGE_SUFFIXES)}) in its class folders "
                                f"{listed(subfolders)}")
    resample = Image.Resampling.BILINEAR
    arrays: list[np.ndarray] = []
    first_size: tuple[tuple[int, int], Path] | None = None
    decoded_values = 0
    for file in files:
        require_regular(file)  # a FIFO named x.png would block Image.open (issue 24)
        try:
            with Image.open(file) as image:
                check_image_header(file, image)  # the declared size, before the pixels are decoded
                width, height = image.size if size is None else (size[1], size[0])
                decoded_values += width * height * 3
                require_memory(folder, f"image folder (up to {file.name})", decoded_values, 1)
                image.load()
                if image.mode in DEEP_MODES or image.mode.startswith("I;16"):
                    raise DataError(file, f"is a {image.mode} image (more than 8 bits per channel); convert "
                                          "it to 8-bit PNG/JPEG")
                mode = _pixel_mode(image, color_mode)
                decoded = image.convert(mode) if image.mode != mode else image
                if size is not None:
                    if decoded.size != (size[1], size[0]):
                        decoded = decoded.resize((size[1], size[0]), resample)
                elif first_size is None:
                    first_size = (decoded.size, file)
                elif decoded.size != first_size[0]:
                    (w0, h0), file0 = first_size
                    w1, h1 = decoded.size
                    raise DataError(folder, f"images have different sizes ({file0.relative_to(folder)} is "
                                            f"{h0}x{w0}, {file.relative_to(folder)} is {h1}x{w1}); pass "
                                            "`image_size`")
                arrays.append(np.asarray(decoded, dtype=np.uint8))
        except DataError:
            raise
        except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError, SyntaxError) as error:
            raise DataError(file, f"unreadable image ({type(error).__name__}: {error})") from None
    channels = {a.ndim for a in arrays}
    if color_mode is None and channels == {2, 3}:  # mixed: grey images join the colour ones as R = G = B
        arrays = [np.repeat(a[..., np.newaxis], 3, axis=-1) if a.ndim == 2 else a for a in arrays]
    x = np.stack(arrays)
    if x.ndim == 3:
        x = x[..., np.newaxis]
    y = np.concatenate(labels)
    h, w, c = x.shape[1:]
    resized = f", resized to {h}x{w}" if size is not None else ""
    source = (f"image folder {folder} ({len(files)} images in {len(subfolders)} class folders, "
              f"{'grayscale' if c == 1 else 'rgb'}{resized})")
    return x, y, names, source


def _pixel_mode(image: Any, color_mode: str | None) -> str:
    """Return the Pillow mode an image is converted to: ``L`` (grayscale) or ``RGB``."""
    if color_mode == "grayscale":
        return "L"
    if color_mode == "rgb":
        return "RGB"
    return "L" if image.getbands() in (("L",), ("1",), ("L", "A")) else "RGB"
