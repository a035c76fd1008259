"""ldpfl: federated learning over locally differentially private features.

The Python API mirrors the CLI. Heavy frameworks load only when the function that needs them runs:
``mechanisms`` and ``inspect`` never import TensorFlow or torch.
"""

from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("ldpfl")
except metadata.PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+unknown"
