"""ldpfl: federated learning over locally differentially private features.

The Python API mirrors the CLI, one function per job, each returning a frozen result:
:func:`export` (stage 1), :func:`plan` and :func:`gather` (separate silos), :func:`federate` (stage 2, on the
local or the Flower engine), :func:`predict`, :func:`inspect` and :func:`demo` (``ldpfl.api``). Each is imported
on first use, so ``import ldpfl`` stays light; heavy frameworks load only when the function that needs them runs:
``ldpfl.mechanisms`` and ``inspect`` never import TensorFlow or torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ldpfl.contract.version import package_version

if TYPE_CHECKING:
    from ldpfl.api.demo_job import DemoResult, demo
    from ldpfl.api.export_job import export
    from ldpfl.api.federate_job import FederateResult, FederationOutputs, federate
    from ldpfl.api.gather_job import gather
    from ldpfl.api.inspect_job import InspectResult, inspect
    from ldpfl.api.personalize_job import PersonalizeResult, personalize
    from ldpfl.api.plan_job import PlanResult, plan
    from ldpfl.api.predict_job import PredictResult, predict
    from ldpfl.api.progress import Progress, ProgressCallback
    from ldpfl.common.errors import ParameterError
    from ldpfl.contract.gather import GatherResult
    from ldpfl.contract.plan import SharedPlan
    from ldpfl.contract.release_guarantee import ReleaseGuarantee
    from ldpfl.stage1_features.export.config import ExportConfig
    from ldpfl.stage1_features.export.results import ExportResult
    from ldpfl.stage2_federate.config import FederationConfig

__version__ = package_version()

_LAZY = {
    "export": "ldpfl.api.export_job", "ExportConfig": "ldpfl.stage1_features.export.config",
    "ExportResult": "ldpfl.stage1_features.export.results",
    "plan": "ldpfl.api.plan_job", "PlanResult": "ldpfl.api.plan_job", "SharedPlan": "ldpfl.contract.plan",
    "gather": "ldpfl.api.gather_job", "GatherResult": "ldpfl.contract.gather",
    "federate": "ldpfl.api.federate_job", "FederationConfig": "ldpfl.stage2_federate.config",
    "FederateResult": "ldpfl.api.federate_job", "FederationOutputs": "ldpfl.api.federate_job",
    "predict": "ldpfl.api.predict_job", "PredictResult": "ldpfl.api.predict_job",
    "personalize": "ldpfl.api.personalize_job", "PersonalizeResult": "ldpfl.api.personalize_job",
    "inspect": "ldpfl.api.inspect_job", "InspectResult": "ldpfl.api.inspect_job",
    "demo": "ldpfl.api.demo_job", "DemoResult": "ldpfl.api.demo_job",
    "Progress": "ldpfl.api.progress", "ProgressCallback": "ldpfl.api.progress",
    "ReleaseGuarantee": "ldpfl.contract.release_guarantee", "ParameterError": "ldpfl.common.errors",
}
"""Each public name of the API and the module that defines it (imported on first use, PEP 562)."""

__all__ = [
    "DemoResult", "ExportConfig", "ExportResult", "FederateResult", "FederationConfig", "FederationOutputs",
    "GatherResult", "InspectResult", "ParameterError", "PersonalizeResult", "PlanResult", "PredictResult", "Progress",
    "ProgressCallback", "ReleaseGuarantee", "SharedPlan", "__version__", "demo", "export", "federate", "gather",
    "inspect", "personalize", "plan", "predict",
]


def __getattr__(name: str) -> object:
    """Import the module of API name ``name`` on first use and return the name."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ldpfl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """List the module's names with the API's."""
    return sorted({*globals(), *_LAZY})
