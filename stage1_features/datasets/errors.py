"""The error of the registered datasets' loaders and file readers, at the bottom of ``datasets``."""

from __future__ import annotations

from ldpfl.common.errors import LdpflError


class DatasetError(LdpflError, ValueError):
    """A dataset file that is missing or corrupt; the one-line message names it and where to get it."""
