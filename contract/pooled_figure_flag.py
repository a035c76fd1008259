"""The record of a silo whose own test accuracy lifts the pooled figure (issue 42 item 3), as ``metrics.json`` holds it.

Stage 2 writes it (``stage2_federate.pooled_figure`` decides which silos are flagged) and ``ldpfl inspect`` reads it
back without stage 2: one record type for both, here in the contract between them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PooledFigureFlag:
    """A silo whose test rows lift the pooled test accuracy: its figure, the others' and the pooled one."""

    client: int
    accuracy: float
    rows: int
    others_accuracy: float
    others_rows: int
    pooled: float

    def to_dict(self) -> dict[str, Any]:
        """Return the flag as written (``metrics.json``'s ``pooled_figure_flags``, ``--json``), to 6 decimals."""
        return {"client": self.client, "test_accuracy": round(self.accuracy, 6), "test_rows": self.rows,
                "others_test_accuracy": round(self.others_accuracy, 6), "others_test_rows": self.others_rows,
                "pooled_test_accuracy": round(self.pooled, 6), "pooled_without_it": round(self.others_accuracy, 6)}

    def describe(self) -> str:
        """Return what the flag says, in one line: the silo's figure, the others' and the pooled one without it."""
        return (f"pooled figure: silo {self.client} scores {self.accuracy:.4f} on its own {self.rows} test rows, the "
                f"other silos {self.others_accuracy:.4f} on their {self.others_rows}: without it the final test "
                f"accuracy is {self.others_accuracy:.4f}, not {self.pooled:.4f}")


__all__ = ["PooledFigureFlag"]
