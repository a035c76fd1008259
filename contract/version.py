"""The version of the installed ``ldpfl`` distribution, as files and manifests record it."""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "ldpfl"
UNKNOWN_VERSION = "0.0.0+unknown"


def package_version() -> str:
    """Return the installed version of ``ldpfl``.

    Returns
    -------
    str
        The distribution's version, or ``"0.0.0+unknown"`` when running from a source tree that is
        not installed.
    """
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return UNKNOWN_VERSION
