"""The ClientApp as Flower loads it (the app's ``clientapp`` component): a time stamp, torch's settings, ``client_app``.

``flwr-clientapp`` starts, imports Flower's runtime, pulls its task, installs the app, then imports this
module. :data:`IMPORTS_STARTED` marks that moment, the start of ldpfl's and torch's imports, for the
benchmark's per-message timelines (run config ``timings-file``; ``client_app.guarded``). Then the
process gets the torch settings that ``ldpfl federate`` applies before torch loads
(``runtime.apply_runtime_defaults``: idle OpenMP threads sleep instead of spinning, which matters when
a silo's ClientApp shares its cores), and only then imports ``client_app`` (and torch).
"""

from __future__ import annotations

import time

IMPORTS_STARTED = time.time()

from ldpfl.stage2_federate.runtime import apply_runtime_defaults  # noqa: E402 - after the time stamp, on purpose

apply_runtime_defaults()

from .client_app import app  # noqa: E402 - after torch's settings, on purpose

__all__ = ["IMPORTS_STARTED", "app"]
