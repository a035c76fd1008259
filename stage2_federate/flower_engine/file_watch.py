"""A Flower client's file must stay the file the run started with (issue 24 item 6).

Another export into the same run directory can replace ``client_001.h5`` between two rounds; the
ClientApp reopens its file at every message, so it would go on training on other records while the
run (and ``model.pt``) record the old sha256. :func:`check_unchanged` is called before every open:

* at the first contact the file's sha256 is computed and, when the run knows the one it started with
  (simulation: the manifest's, run config ``client-sha256``), compared with it;
* afterwards its size and mtime are compared with those recorded; only when they differ is the sha256
  computed again (cheap for the usual case), and a different sha256 fails the client with its reason.

The record is a flat mapping of str and int (it lives in the node's ``context.state``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ldpfl.common.errors import LdpflError
from ldpfl.contract.digest import sha256_file


class FileChanged(LdpflError, ValueError):
    """The client file differs from the one the run started with; the message names it and both digests."""


def _short(digest: str) -> str:
    return digest[:12] + "…"


def check_unchanged(path: str | os.PathLike[str], recorded: Mapping[str, Any] | None,
                    expected: str | None = None) -> dict[str, Any]:
    """Return the record of ``path`` (path, size, mtime_ns, sha256), refusing a file that changed.

    Parameters
    ----------
    path : path
        The client file about to be opened.
    recorded : mapping, optional
        What the previous call returned (``None`` at the first contact).
    expected : str, optional
        The hex sha256 the run started with (the manifest's), checked at the first contact.

    Raises
    ------
    FileChanged
        The file's sha256 differs from ``expected`` or from the recorded one.
    """
    path = Path(path)
    info = path.stat()
    if recorded is not None and str(recorded.get("path")) == str(path) and int(recorded.get("size", -1)) == \
            info.st_size and int(recorded.get("mtime_ns", -1)) == info.st_mtime_ns:
        return dict(recorded)  # size and mtime unchanged: no need to read the file again
    digest = sha256_file(path)
    started = str(recorded["sha256"]) if recorded is not None and "sha256" in recorded else expected
    if started is not None and digest != started:
        raise FileChanged(f"{path.name} changed since the run started (sha256 {_short(digest)}, the run's is "
                          f"{_short(started)}): another export replaced it; restart the federation on the "
                          "files as they are now, or restore the file")
    return {"path": str(path), "size": int(info.st_size), "mtime_ns": int(info.st_mtime_ns), "sha256": digest}


__all__ = ["FileChanged", "check_unchanged"]
