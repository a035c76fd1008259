"""A silo's own data in three formats (image folder, .npz, CSV), small and learnable, for the cross-silo tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

SIDE = 8
CLASSES = ("0", "1", "2")


def shapes(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` uint8 8×8 images of 3 learnable classes and their labels 0..2."""
    labels = np.arange(n) % 3
    images = rng.integers(0, 60, size=(n, SIDE, SIDE)).astype(np.uint8)
    for k in range(3):
        rows = labels == k
        images[rows, 2 * k:2 * k + 3, 1:7] = rng.integers(200, 256, size=(int(rows.sum()), 3, 6))
    return images, labels


def write_silos(root: Path, rng: np.random.Generator, n: int = 60) -> dict[str, Path]:
    """Three silos' own data of ``n`` records each: an image folder (a), an .npz (b) and a CSV table (c)."""
    images, labels = shapes(rng, 3 * n)
    a, b, c = (slice(0, n), slice(n, 2 * n), slice(2 * n, 3 * n))
    folder = root / "silo_a_images"
    for i, (image, label) in enumerate(zip(images[a], labels[a], strict=True)):
        (folder / str(label)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / str(label) / f"scan_{i:03d}.png")
    npz = root / "silo_b.npz"
    np.savez_compressed(npz, x=images[b], y=labels[b])
    table = pd.DataFrame(images[c].reshape(n, -1) / 255.0, columns=[f"p{i}" for i in range(SIDE * SIDE)])
    table["diagnosis"] = labels[c]
    csv = root / "silo_c.csv"
    table.to_csv(csv, index=False)
    return {"a": folder, "b": npz, "c": csv}
