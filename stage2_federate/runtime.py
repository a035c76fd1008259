"""Process settings for torch on CPU, applied by ``ldpfl federate`` before torch loads.

Both are read once, when torch (its allocator, its OpenMP runtime) starts, so they must be in the
environment before ``import torch``; a value the user already set is kept.

* ``THP_MEM_ALLOC_ENABLE=1``: transparent huge pages for torch's large CPU allocations. The default
  model's 94 MB first-layer gradient is allocated afresh at every step; first-touching 94 MB took
  ~48 ms in 4 KiB pages against ~10 ms with huge pages on the project's 2-core VM.
* ``OMP_WAIT_POLICY=PASSIVE``: idle OpenMP threads sleep instead of spinning. Each parallel region
  here is a large GEMM (tens of ms), so waking costs nothing measurable, while spinning threads on a
  machine shared with other processes halved local-training throughput (bench/RESULTS.md,
  "Federation throughput").

This module imports only the standard library.
"""

from __future__ import annotations

import os
import sys

RUNTIME_DEFAULTS = {"THP_MEM_ALLOC_ENABLE": "1", "OMP_WAIT_POLICY": "PASSIVE"}


def apply_runtime_defaults() -> dict[str, str]:
    """Set the variables of ``RUNTIME_DEFAULTS`` that the user has not set; return those now in effect.

    Returns an empty dict when torch is already loaded (the settings would have no effect).
    """
    if "torch" in sys.modules:
        return {}
    for key, value in RUNTIME_DEFAULTS.items():
        os.environ.setdefault(key, value)
    return {key: os.environ[key] for key in RUNTIME_DEFAULTS}
