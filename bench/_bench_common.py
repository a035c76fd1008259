"""Set-up shared by the one-core benchmarks in bench/.

Import it before numpy: importing sets the thread counts of the BLAS/OpenMP pools to 1. Then
``pin_to_one_core()`` pins the process to one CPU.
"""

from __future__ import annotations

import os

THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)

for _variable in THREAD_VARIABLES:
    os.environ[_variable] = "1"  # before numpy is imported


def pin_to_one_core() -> str:
    """Pin this process to its lowest allowed CPU; return a description for the output."""
    if hasattr(os, "sched_setaffinity"):
        cpu = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
        return f"pinned to CPU {cpu}"
    return "not pinned (os.sched_setaffinity unavailable)"
