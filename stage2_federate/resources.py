"""Resource limits decided before any allocation: what a run needs against the memory the machine has.

A model is sized from its architecture alone (:func:`parameter_count_of`), so an impossible one
(``hidden`` 10^8, or 10^7 input features under the default 2048-unit layer) is refused with the figures
before torch allocates a byte of it. The memory available is ``ldpfl.contract.memory.available_memory``
(``MemAvailable``, capped by a cgroup limit). Imports no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from ldpfl.common.errors import ParameterError
from ldpfl.contract.memory import available_memory, format_bytes, memory_shortfall

__all__ = ["FLOAT32_BYTES", "MODEL_BUFFERS", "available_memory", "batch_memory", "check_model", "format_bytes",
           "model_memory", "parameter_count_of", "require_memory"]

FLOAT32_BYTES = 4
MODEL_BUFFERS = 8
"""Parameter-sized float32 buffers a round holds besides the uploads: the model, its gradients, Adam's two
moments, the broadcast vector, the local vector, the perturbed upload being made, the aggregate."""

def parameter_count_of(input_width: int, hidden: Sequence[int], num_classes: int) -> int:
    """Return the parameters of ``input width -> hidden layers -> classes`` (weights and biases), exactly."""
    widths = [int(input_width), *(int(h) for h in hidden), int(num_classes)]
    return sum(a * b + b for a, b in zip(widths[:-1], widths[1:], strict=True))


def model_memory(parameters: int, clients_per_round: int) -> int:
    """Return a lower bound on the bytes a round needs: ``MODEL_BUFFERS`` + one upload per selected client."""
    return FLOAT32_BYTES * parameters * (MODEL_BUFFERS + max(int(clients_per_round), 1))


def require_memory(needed: int, what: str, advice: str, *, available: int | None = None,
                   source: str = "") -> None:
    """Refuse ``needed`` bytes beyond the memory available (``ParameterError`` with both figures).

    Parameters
    ----------
    needed : int
        Bytes the step would allocate.
    what : str
        What needs them (the start of the message).
    advice : str
        What to change (may mark parameters with backquotes).
    available : int, optional
        The figure to compare with; by default :func:`available_memory`. Unknown: no check.
    source : str
        Where ``available`` comes from, when given.
    """
    shortfall = memory_shortfall(needed, available, source)
    if shortfall is not None:
        raise ParameterError(f"{what} {shortfall}; {advice}")


def batch_memory(input_width: int, hidden: Sequence[int], num_classes: int, rows: int) -> int:
    """Return the bytes of one batch of ``rows``: float32 inputs, activations and their gradients."""
    return FLOAT32_BYTES * int(rows) * (int(input_width) + 2 * (sum(int(h) for h in hidden) + int(num_classes)))


def check_model(input_width: int, hidden: Sequence[int], num_classes: int, clients_per_round: int, *,
                batch_rows: int = 0, available: int | None = None, source: str = "") -> int:
    """Refuse a model whose training would not fit in memory, before it is built; return its parameter count.

    Parameters
    ----------
    input_width, hidden, num_classes : int, sequence of int, int
        The architecture.
    clients_per_round : int
        Uploads held at once.
    batch_rows : int
        Rows of the largest training plus evaluation batch (their inputs and activations count too).
    available, source : int, str, optional
        The memory figure to compare with (default: ``available_memory()``).

    Raises
    ------
    ParameterError
        Naming the parameter count, the memory needed and the memory available.
    """
    parameters = parameter_count_of(input_width, hidden, num_classes)
    layers = " -> ".join(str(w) for w in (input_width, *hidden, num_classes))
    needed = model_memory(parameters, clients_per_round) + batch_memory(input_width, hidden, num_classes, batch_rows)
    require_memory(needed,
                   f"the model ({layers}: {parameters:,} parameters, {format_bytes(FLOAT32_BYTES * parameters)} "
                   f"as float32) with {clients_per_round} client upload(s) per round",
                   "choose smaller `hidden` layers (or 'none'), a smaller `batch_size`, or fewer features",
                   available=available, source=source)
    return parameters
