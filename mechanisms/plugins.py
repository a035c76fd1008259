"""The generic registry's former home, kept while ``stage2_federate`` (being restructured) still imports it here.

The registry lives in :mod:`ldpfl.common.registry`; import it from there.
"""

from ldpfl.common.registry import Registry

__all__ = ["Registry"]
