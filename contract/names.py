"""Names that become file names: a name taken from a plan, a manifest, ``--name`` or a dataset attribute.

A plan comes from a coordinator and a manifest from another silo; neither may make this machine write or
read outside the directory it was given (issue 24). So a name that a file name is derived from is checked
by :func:`check_name` before it is joined to a directory: one path component, never a path.

A safe name is a non-empty string of printable characters (``str.isprintable``: no control characters,
no NUL, no line breaks), without ``/`` or ``\\``, not ``.`` or ``..`` and holding no ``..``, with no
leading or trailing blank, and at most ``MAX_NAME_CHARS`` characters and ``MAX_NAME_BYTES`` bytes of UTF-8
(file systems cap a component at 255 bytes). An unsafe name is refused, never repaired: repairing would
make two different names collide.
"""

from __future__ import annotations

import os
from pathlib import Path

from ldpfl.common.errors import ParameterError

MAX_NAME_CHARS = 128
MAX_NAME_BYTES = 200
"""Leaves room for a suffix and a temporary file's marks under the usual 255-byte component limit."""
_SEPARATORS = frozenset({"/", "\\", os.sep, *([os.altsep] if os.altsep else [])})


class UnsafeName(ParameterError):
    """A name that would not be a single, plain file name; the message names its origin and quotes it."""


def name_problem(value: object) -> str | None:
    """Return why ``value`` is not a safe name (module docstring), or ``None`` when it is one."""
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    if not value:
        return "is empty"
    if len(value) > MAX_NAME_CHARS:
        return f"is {len(value)} characters long (at most {MAX_NAME_CHARS})"
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return "is not valid Unicode text (it holds a lone surrogate, as an undecodable file name gives)"
    if size > MAX_NAME_BYTES:
        return f"is {size} bytes long in UTF-8 (at most {MAX_NAME_BYTES})"
    if not value.isprintable():
        return "holds a control or non-printable character"
    if any(sep in value for sep in _SEPARATORS):
        return "holds a path separator; it must be a name, not a path"
    if ".." in value or value == ".":
        return "holds '..' or is '.'; it must be a name, not a path"
    if value != value.strip():
        return "starts or ends with a blank"
    return None


def check_name(value: object, what: str) -> str:
    """Return ``value`` when it is a safe name; else raise :class:`UnsafeName`.

    Parameters
    ----------
    value : object
        The candidate name.
    what : str
        The parameter it came from, marked in the message as ```what```
        (``ParameterError``: the command line shows its flag), or a plain description with spaces
        (``"key 'dataset' of plan.json"``), shown as given.

    Raises
    ------
    UnsafeName
        The value is not a single plain file name (module docstring); nothing has been created.
    """
    problem = name_problem(value)
    if problem is None:
        assert isinstance(value, str)
        return value
    shown = repr(value) if not isinstance(value, str) or len(value) <= 80 else repr(value[:77]) + "..."
    label = what if " " in what else f"`{what}`"
    raise UnsafeName(f"{label} {shown} {problem}")


def child_path(directory: str | os.PathLike[str], name: object, what: str) -> Path:
    """Return ``directory / name`` after :func:`check_name`; the result always lies directly in ``directory``."""
    return Path(directory) / check_name(name, what)


__all__ = ["MAX_NAME_BYTES", "MAX_NAME_CHARS", "UnsafeName", "check_name", "child_path", "name_problem"]
