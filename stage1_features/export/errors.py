"""The error of an export that cannot start or resume as asked, at the bottom of ``export``."""

from __future__ import annotations

from ldpfl.common.errors import ParameterError


class ExportError(ParameterError):
    """A run that cannot start or resume as asked; the one-line message says what to do.

    Parameters are marked in the message as ```overwrite``` (see ``ldpfl.common.errors.ParameterError``).
    """
