"""Personalized privacy parameters: per-client ε and PDPM safe-range lengths L_i, their presets and parsing.

Presets come from the papers' experiments:

* Wu et al. 5.2.1 and 5.3.1 name their personalized budget sets {L, H} and {L, M, H}; the
  three-client IID sets are named here by their three letters (e.g. {1, 1, 10} is ``LLH``). These sets
  have a fixed number of clients, and a run with a different N is refused.
* PLDP-FL 6.2 defines modes that repeat over any number of clients: ε1 = {0.1, 0.2, 0.1, 0.2, …},
  ε2 = {0.1, 0.2, …, 1.0, 0.1, …} (ascending, cycling), ε3 = {0.9, 1.0, 0.9, 1.0, …}, and for the safe
  range lengths τ1 = {0.2, 0.4, …}, τ2 = {0.2, 0.4, …, 2.0, 0.2, …}, τ3 = {1.8, 2.0, …}.

This module imports the standard library and the generic registry (``ldpfl.common.registry``) only.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ldpfl.common.errors import ParameterError
from ldpfl.common.registry import Registry
from ldpfl.contract.small_files import SmallFileError, read_small_file

EPSILON = "epsilon"
RANGE = "range"


@dataclass(frozen=True)
class BudgetPreset:
    """A named list of per-client values (ε or safe-range lengths L_i)."""

    name: str
    kind: str  # EPSILON or RANGE
    values: tuple[float, ...]
    cycle: bool  # True: repeat ``values`` over any number of clients; False: exactly len(values) clients
    source: str

    def for_clients(self, count: int) -> tuple[float, ...]:
        """Return the values for ``count`` clients; a fixed-length preset refuses another count."""
        if count < 1:
            raise ValueError(f"the number of clients must be >= 1, got {count}")
        if self.cycle:
            return tuple(self.values[i % len(self.values)] for i in range(count))
        if count != len(self.values):
            raise ValueError(f"budget preset {self.name!r} is defined for {len(self.values)} clients "
                             f"({self.source}); this run has {count}")
        return self.values

    def describe(self) -> str:
        """Show the values in one line."""
        shown = ", ".join(f"{v:g}" for v in self.values)
        return f"{shown}{', … (cycling)' if self.cycle else ''}"


def _steps(start: float, stop: float, step: float) -> tuple[float, ...]:
    count = int(round((stop - start) / step)) + 1
    return tuple(round(start + i * step, 10) for i in range(count))


PRESETS: Registry[BudgetPreset] = Registry("budget preset", describe=lambda p: p.source)


def _add(name: str, kind: str, values: Sequence[float], cycle: bool, source: str) -> None:
    PRESETS.add(name, BudgetPreset(name, kind, tuple(float(v) for v in values), cycle, source))


# Wu et al. 5.2.1, IID, N = 3 (logistic regression).
_add("wu-mnist-iid-LLH", EPSILON, (1, 1, 10), False, "Wu et al. 5.2.1 MNIST IID")
_add("wu-mnist-iid-LMH", EPSILON, (1, 5, 10), False, "Wu et al. 5.2.1 MNIST IID")
_add("wu-mnist-iid-LHH", EPSILON, (1, 10, 10), False, "Wu et al. 5.2.1 MNIST IID")
_add("wu-fmnist-iid-LLH", EPSILON, (0.05, 0.05, 1), False, "Wu et al. 5.2.1 Fashion-MNIST IID")
_add("wu-fmnist-iid-LMH", EPSILON, (0.05, 0.5, 1), False, "Wu et al. 5.2.1 Fashion-MNIST IID")
_add("wu-fmnist-iid-LHH", EPSILON, (0.05, 1, 1), False, "Wu et al. 5.2.1 Fashion-MNIST IID")
# Wu et al. 5.2.1, IID, N = 10 (forest cover types); Figure 4 names them {L, H} and {L, M, H}.
_add("wu-forest-LH", EPSILON, (1,) * 5 + (10,) * 5, False, "Wu et al. 5.2.1 forest cover types IID")
_add("wu-forest-LMH", EPSILON, (1,) * 3 + (5,) * 4 + (10,) * 3, False, "Wu et al. 5.2.1 forest cover types IID")
# Wu et al. 5.3.1, non-IID, N = 10.
_add("wu-mnist-LH", EPSILON, (5,) * 5 + (15,) * 5, False, "Wu et al. 5.3.1 MNIST non-IID")
_add("wu-mnist-LMH", EPSILON, (5,) * 3 + (10,) * 4 + (15,) * 3, False, "Wu et al. 5.3.1 MNIST non-IID")
_add("wu-fmnist-LH", EPSILON, (5,) * 5 + (15,) * 5, False, "Wu et al. 5.3.1 Fashion-MNIST non-IID")
_add("wu-fmnist-LMH", EPSILON, (5,) * 3 + (10,) * 4 + (15,) * 3, False, "Wu et al. 5.3.1 Fashion-MNIST non-IID")
# PLDP-FL 6.2 modes (any N).
_add("pldp-eps1", EPSILON, (0.1, 0.2), True, "PLDP-FL 6.2 mode ε1")
_add("pldp-eps2", EPSILON, _steps(0.1, 1.0, 0.1), True, "PLDP-FL 6.2 mode ε2")
_add("pldp-eps3", EPSILON, (0.9, 1.0), True, "PLDP-FL 6.2 mode ε3")
_add("pldp-tau1", RANGE, (0.2, 0.4), True, "PLDP-FL 6.2 mode τ1")
_add("pldp-tau2", RANGE, _steps(0.2, 2.0, 0.2), True, "PLDP-FL 6.2 mode τ2")
_add("pldp-tau3", RANGE, (1.8, 2.0), True, "PLDP-FL 6.2 mode τ3")


def preset_names(kind: str | None = None) -> list[str]:
    """Return the registered preset names, optionally only those of ``kind`` ('epsilon' or 'range')."""
    return [name for name, p in PRESETS.items() if kind is None or p.kind == kind]


def get_preset(name: str) -> BudgetPreset:
    """Return the preset called ``name``; an unknown name lists the valid ones."""
    return PRESETS.get(name)


def apply_presets(presets: Sequence[str], client_epsilons: tuple[float, ...] | str | None,
                  client_ranges: tuple[float, ...] | str | None
                  ) -> tuple[tuple[float, ...] | str | None, tuple[float, ...] | str | None]:
    """Return (``client_epsilons``, ``client_ranges``) with each preset of ``presets`` set by its kind.

    Raises
    ------
    ParameterError
        A preset whose kind is already set (by the list given, or by an earlier preset); an unknown name.
    """
    values: dict[str, tuple[float, ...] | str | None] = {EPSILON: client_epsilons, RANGE: client_ranges}
    for name in presets:
        preset = get_preset(name)
        if values[preset.kind] is not None:
            key = "client_epsilons" if preset.kind == EPSILON else "client_ranges"
            raise ParameterError(f"`budget_presets` {name} and `{key}` (or a second preset) both set {preset.kind} "
                                 "values; give one")
        values[preset.kind] = name
    return values[EPSILON], values[RANGE]


def presets_help() -> str:
    """One line per preset, for --help."""
    return "\n".join(f"{p.name:<19} {p.kind:<8} {p.describe()}  [{p.source}]" for _, p in PRESETS.items())


def _check_values(values: Sequence[float], what: str, origin: str, positive: bool = True) -> tuple[float, ...]:
    out = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or (
                positive and value <= 0):
            raise ValueError(f"{what} from {origin} must be finite numbers{' > 0' if positive else ''}, "
                             f"got {value!r}")
        out.append(float(value))
    if not out:
        raise ValueError(f"{what} from {origin} is empty")
    return tuple(out)


def _numbers_from_text(text: str, origin: str, what: str) -> list[float]:
    values = []
    for token in text.replace(";", ",").split(","):
        token = token.strip()
        if not token:
            continue
        try:
            values.append(float(token))
        except ValueError:
            raise ValueError(f"{what} from {origin}: {token!r} is not a number") from None
    return values


def _numbers_from_file(path: Path, what: str) -> list[float]:
    """Read a JSON list (or an object with one list value) or a CSV of numbers (a header row is skipped)."""
    try:  # a regular file of at most 1 MiB: @/dev/zero or a FIFO fails at once (issue 24)
        text = read_small_file(path, "file").decode("utf-8")
    except SmallFileError as error:
        raise ValueError(f"cannot read {what} file {path}: {str(error).removeprefix(f'{path}: ')}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{what} file {path} is not UTF-8 text") from None
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{what} file {path} is not valid JSON ({error.msg}, line {error.lineno})") from None
        except RecursionError:
            raise ValueError(f"{what} file {path}: JSON nested too deeply") from None
        if isinstance(data, dict):
            lists = [v for v in data.values() if isinstance(v, list)]
            if len(lists) != 1:
                raise ValueError(f"{what} file {path}: expected a JSON list of numbers, or an object holding "
                                 f"exactly one list; found {len(lists)} lists")
            data = lists[0]
        if not isinstance(data, list):
            raise ValueError(f"{what} file {path}: expected a JSON list of numbers, got {type(data).__name__}")
        return list(data)
    if path.suffix.lower() != ".csv":
        raise ValueError(f"{what} file {path}: use a .json or .csv file, got {path.suffix or 'no suffix'!r}")
    rows = [r for r in csv.reader(io.StringIO(text)) if any(c.strip() for c in r)]
    values: list[float] = []
    for number, row in enumerate(rows):
        cells = [c.strip() for c in row if c.strip()]
        try:
            values.extend(float(c) for c in cells)
        except ValueError:
            if number == 0 and not values:
                continue  # a header row
            raise ValueError(f"{what} file {path}: row {number + 1} holds a non-number ({', '.join(cells)})") from None
    return values


def parse_value_list(text: str, *, what: str = "client epsilons", kind: str = EPSILON) -> tuple[float, ...] | str:
    """Parse a CLI list: ``1,1,10``, ``@file.json``, ``@file.csv`` — or a preset name of ``kind``.

    Returns the numbers, or the preset name (resolved later, once the number of clients is known).
    """
    text = text.strip()
    if text in PRESETS:
        preset = PRESETS.get(text)
        if preset.kind != kind:
            raise ValueError(f"budget preset {text!r} sets {preset.kind} values, not {what}")
        return text
    return parse_numbers(text, what=what)


def parse_numbers(text: str, *, what: str, positive: bool = True) -> tuple[float, ...]:
    """Parse ``1,1,10``, ``@file.json`` or ``@file.csv`` into numbers (> 0 unless ``positive`` is False)."""
    text = text.strip()
    if text.startswith("@"):
        path = Path(text[1:]).expanduser()
        return _check_values(_numbers_from_file(path, what), what, str(path), positive)
    return _check_values(_numbers_from_text(text, repr(text), what), what, repr(text), positive)


def resolve_values(spec: Sequence[float] | str | None, default: float, count: int, *, what: str) -> tuple[float, ...]:
    """Per-client values for ``count`` clients from an explicit list, a preset name, or one default."""
    if spec is None:
        return (float(default),) * count
    if isinstance(spec, str):
        return get_preset(spec).for_clients(count)
    values = _check_values(spec, what, "the configuration")
    if len(values) != count:
        raise ValueError(f"{what} list has {len(values)} values but the run has {count} clients; "
                         "give one value per client")
    return values
