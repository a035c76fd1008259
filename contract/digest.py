"""The sha256 of a file, as the manifest records it."""

from __future__ import annotations

import hashlib
import os

BLOCK_BYTES = 1 << 22


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Return the hex sha256 of the file at ``path``, read in 4 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(BLOCK_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()
