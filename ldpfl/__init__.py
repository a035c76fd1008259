"""ldpfl: federated learning over locally differentially private features.

The Python API mirrors the CLI. Heavy frameworks load only when the function that needs them runs:
``ldpfl.mechanisms`` and ``inspect`` never import TensorFlow or torch.
"""

from __future__ import annotations

from ldpfl.contract.version import package_version

__version__ = package_version()
