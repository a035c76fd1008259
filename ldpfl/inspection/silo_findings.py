"""What a federation's ``metrics.json`` says about its silos' claims (issue 42), as ``ldpfl inspect`` shows it.

* ``config.run.left_out``: the silos refused before round 1 (a file that does not verify, a claim refused), each
  with its client index, its file and why;
* ``config.label_claims``: the cap on DP-FedAW's weights from label histograms the coordinator could not check
  (the manifest listed no label counts): the silos unchecked, the cap and its rule, the silos it lowered;
* ``pooled_figure_flags``: the silos whose own test accuracy stands far above the others' and lifts the pooled
  figure, each with the figure without it.

The file is untrusted: a section that is malformed is left out (never an error), and its strings are cut short.
These are read here without stage 2 (``ldpfl inspect`` imports no torch): the records mirror the writers'
(``stage2_federate.left_out``, ``label_claims``, ``pooled_figure``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ldpfl.contract.pooled_figure_flag import PooledFigureFlag

MAX_TEXT = 400
"""A string read from metrics.json is cut to this many characters."""


@dataclass(frozen=True)
class LeftOutSilo:
    """A silo the coordinator refused before round 1 (``run.left_out``)."""

    client: int
    file: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """Return the silo as ``inspect --json`` shows it."""
        return {"client": self.client, "file": self.file, "reason": self.reason}

    def line(self) -> str:
        """Return the inspect line of the silo."""
        return f"  ! federation  silo {self.client} ({self.file}) left out before round 1: {self.reason}"


@dataclass(frozen=True)
class LabelClaimCap:
    """The cap on unchecked label histograms' DP-FedAW similarity (``label_claims``)."""

    unchecked: tuple[int, ...]
    cap: float
    cap_rule: str
    capped: tuple[tuple[int, float, float], ...]  # (silo, similarity as claimed, as used)

    def to_dict(self) -> dict[str, Any]:
        """Return the cap as ``inspect --json`` shows it (the keys of ``metrics.json``)."""
        return {"unchecked": list(self.unchecked), "cap_rule": self.cap_rule, "cap": self.cap,
                "capped": [{"client": c, "claimed_similarity": g, "capped_to": to} for c, g, to in self.capped]}

    def line(self) -> str:
        """Return the inspect line of the cap: ``!`` when it lowered a silo's weight."""
        capped = ", ".join(f"silo {c} (claimed {g:.3f})" for c, g, _ in self.capped)
        return (f"  {'!' if self.capped else ' '} federation  label histograms: {len(self.unchecked)} unchecked (the "
                f"manifest listed no label counts); DP-FedAW similarity capped at {self.cap:.3f}, {self.cap_rule}: "
                + (f"capped {capped}" if capped else "none above it"))


@dataclass(frozen=True)
class SiloFindings:
    """What ``metrics.json`` says about the silos' claims (see the module docstring); empty when it says nothing."""

    left_out: tuple[LeftOutSilo, ...] = ()
    label_claims: LabelClaimCap | None = None
    pooled_figure_flags: tuple[PooledFigureFlag, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Return the findings as ``inspect --json`` shows them (``federation``'s keys)."""
        return {"left_out": [x.to_dict() for x in self.left_out],
                "label_claims": None if self.label_claims is None else self.label_claims.to_dict(),
                "pooled_figure_flags": [f.to_dict() for f in self.pooled_figure_flags]}

    def lines(self) -> list[str]:
        """Return the inspect lines: the silos left out, the label-claim cap, the pooled-figure flags."""
        return ([x.line() for x in self.left_out] + ([] if self.label_claims is None else [self.label_claims.line()])
                + [f"  ! federation  {f.describe()}" for f in self.pooled_figure_flags])


def read_silo_findings(data: Mapping[str, Any]) -> SiloFindings:
    """Return what ``metrics.json`` (parsed, ``data``) says about the silos; a malformed section is left out."""
    config = data.get("config")
    config = config if isinstance(config, Mapping) else {}
    run = config.get("run")
    return SiloFindings(_left_out(run.get("left_out") if isinstance(run, Mapping) else None),
                        _label_claims(config.get("label_claims")), _pooled_flags(data.get("pooled_figure_flags")))


def _left_out(section: object) -> tuple[LeftOutSilo, ...]:
    try:
        return tuple(LeftOutSilo(_integer(x["client"]), _text(x["file"]), _text(x["reason"]))
                     for x in section) if isinstance(section, list) else ()
    except (TypeError, ValueError, KeyError):
        return ()


def _label_claims(section: object) -> LabelClaimCap | None:
    if not isinstance(section, Mapping):
        return None
    try:
        capped = tuple((_integer(c["client"]), _number(c["claimed_similarity"]), _number(c["capped_to"]))
                       for c in section["capped"])
        return LabelClaimCap(tuple(_integer(c) for c in section["unchecked"]), _number(section["cap"]),
                             _text(section["cap_rule"]), capped)
    except (TypeError, ValueError, KeyError):
        return None


def _pooled_flags(section: object) -> tuple[PooledFigureFlag, ...]:
    try:
        return tuple(PooledFigureFlag(_integer(f["client"]), _number(f["test_accuracy"]), _integer(f["test_rows"]),
                                      _number(f["others_test_accuracy"]), _integer(f["others_test_rows"]),
                                      _number(f["pooled_test_accuracy"]))
                     for f in section) if isinstance(section, list) else ()
    except (TypeError, ValueError, KeyError):
        return ()


def _integer(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{value!r} is not an integer")
    return value


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{value!r} is not a number")
    return float(value)


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a string")
    return " ".join(value.split())[:MAX_TEXT]  # one line, however it was written
