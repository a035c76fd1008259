"""The error every reader of the user's own data raises, and the way its messages list names.

At the bottom of ``own_data``: the readers (``arrays``, ``images``, ``labels``, ``limits``, ``tables``) and the
loader (``load``) import it, it imports none of them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ldpfl.common.errors import ParameterError
from ldpfl.stage1_features.datasets.errors import DatasetError


class DataError(DatasetError, ParameterError):
    """A user's data file that cannot be used; the one-line message names the file and the problem.

    Options named in the message are marked as ```x_key``` (``ParameterError``), so the CLI shows them
    as its flags.

    Parameters
    ----------
    path : path
        The file or folder.
    problem : str
        What is wrong and, where it helps, what to do.
    """

    def __init__(self, path: str | os.PathLike[str], problem: str):
        self.path = str(path)
        self.problem = " ".join(str(problem).split())  # one line, whatever a library's message held
        super().__init__(f"{path}: {self.problem}")


def listed(names: Sequence[str]) -> str:
    """Return up to ten names, quoted, for an error message (``'a', 'b' and 3 more``; ``nothing`` if none)."""
    if not names:
        return "nothing"
    shown = ", ".join(repr(k) for k in names[:10])
    return shown + (f" and {len(names) - 10} more" if len(names) > 10 else "")
