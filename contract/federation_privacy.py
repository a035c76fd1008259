"""A federation's run-level privacy records: ``metrics.json``'s ``privacy_ledger`` and ``release_guarantee``.

Stage 2 makes them (``ldpfl.stage2_federate.ledger`` composes each client's uploads, ``.guarantee`` the weakest
silo's figure); ``ldpfl inspect`` and the Flower engine read them back from ``metrics.json``. Each is a frozen
record with one JSON writer (``to_dict``) and one reader (``from_dict``), as dp-accounting describes a
mechanism by a frozen ``DpEvent``: nothing between the maker and the file handles them as dicts. An ε is a
float (``math.inf`` when not private) and becomes the string ``"inf"`` in JSON only.

* :class:`LedgerSection`: each client's total over the rounds in which its upload reached the server
  (:class:`LedgerRow`), or each DP-SGD silo's accountant over its steps (:class:`DpSgdLedgerRow`).
* :class:`FederationGuarantee`: the per-record (ε, δ) of the weakest silo, each silo's (:class:`SiloGuarantee`),
  and the weakest's parts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ldpfl.mechanisms.report import json_number, number_from_json

from .release_guarantee import RELEASED_FILES_NOTE, GuaranteePart

DP_SGD_MECHANISM = "dp-sgd"
"""The ``mechanism`` of a DP-SGD silo's ledger row."""

LEDGER_ROW_KEYS = ("client", "rounds", "epsilon", "delta", "method")
"""The keys every ledger row has (a reader refuses a row without them)."""


def _epsilon(value: object, name: str) -> float | None:
    """Read an ε that may be null (``ValueError`` naming ``name`` when it is not a number, ``"inf"`` or null)."""
    return number_from_json(value, name=name, optional=True)


def _optional_float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def _figure(value: float | None) -> str:
    """Return an ε as the ledger's text shows it: 4 significant digits, ``inf``, ``-`` where there is none."""
    if value is None or math.isnan(value):
        return "-"
    return "inf" if math.isinf(value) else f"{value:.4g}"


@dataclass(frozen=True)
class LedgerRow:
    """One client's total over the rounds in which it uploaded (made by ``stage2_federate.ledger.ledger_entry``).

    ``epsilon``/``delta`` are None where stage 2 adds nothing (or the upload could not be accounted);
    ``epsilon`` is ``math.inf`` where a release was not private. ``mechanism`` is the upload's mechanism.
    """

    client: int
    rounds: int
    epsilon: float | None
    delta: float | None
    method: str
    notes: tuple[str, ...] = ()
    mechanism: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form (an infinite ε as ``"inf"``)."""
        out: dict[str, Any] = {"client": self.client, "rounds": self.rounds, "epsilon": json_number(self.epsilon),
                               "delta": self.delta, "method": self.method, "notes": list(self.notes)}
        if self.mechanism is not None:
            out["mechanism"] = self.mechanism
        return out

    def line(self) -> str:
        """Return the row as the ledger's text shows it (:meth:`LedgerSection.lines`)."""
        eps = self.epsilon
        shown = "n/a" if eps is None else ("inf (not private)" if math.isinf(eps) else f"{eps:.4g}")
        delta = f" at delta {self.delta:g}" if self.delta else ""
        return f"client {self.client}: eps {shown}{delta} over {self.rounds} uploads ({self.method})"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LedgerRow:
        """Read :meth:`to_dict`'s form (the caller checked :data:`LEDGER_ROW_KEYS`)."""
        return cls(data["client"], data["rounds"], _epsilon(data["epsilon"], "epsilon"),
                   _optional_float(data["delta"]), str(data["method"]), _notes(data.get("notes", ())),
                   None if data.get("mechanism") is None else str(data["mechanism"]))


@dataclass(frozen=True)
class DpSgdLedgerRow:
    """One DP-SGD silo's accountant over the steps it took: ε at δ under both neighbouring relations.

    ``epsilon`` is the run's relation's (``neighbours``); ``target_epsilon`` is None when σ was given. The
    ``evaluation_*`` fields account for its noised evaluation replies on its test records (disjoint from the
    training records): ``evaluation_epsilon`` at the same δ (the same under both relations; ∞ when they left in
    clear; None in a run written before they were accounted), over ``evaluation_releases`` replies of noise σ
    ``evaluation_sigma`` (counts).
    """

    client: int
    rounds: int
    steps: int
    epsilon: float
    delta: float
    epsilon_replace_one: float
    epsilon_add_remove: float
    neighbours: str | None
    target_epsilon: float | None
    noise_multiplier: float | None
    sampling_probability: float | None
    clip: float | None
    method: str
    notes: tuple[str, ...] = ()
    mechanism: str = DP_SGD_MECHANISM
    evaluation_releases: int = 0
    evaluation_epsilon: float | None = None
    evaluation_sigma: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form (an infinite ε as ``"inf"``)."""
        evaluation = {} if self.evaluation_epsilon is None else {
            "evaluation_releases": self.evaluation_releases, "evaluation_epsilon": json_number(self.evaluation_epsilon),
            "evaluation_sigma": self.evaluation_sigma}
        return {"client": self.client, "rounds": self.rounds, "steps": self.steps,
                "epsilon": json_number(self.epsilon), "delta": self.delta,
                "epsilon_replace_one": json_number(self.epsilon_replace_one),
                "epsilon_add_remove": json_number(self.epsilon_add_remove), "neighbours": self.neighbours,
                "target_epsilon": self.target_epsilon, "noise_multiplier": self.noise_multiplier,
                "sampling_probability": self.sampling_probability, "clip": self.clip, "method": self.method,
                "mechanism": self.mechanism, "notes": list(self.notes), **evaluation}

    def line(self) -> str:
        """Return the row as the ledger's text shows it (:meth:`LedgerSection.lines`)."""
        tested = "" if self.evaluation_epsilon is None else (
            f"; its test records eps {_figure(self.evaluation_epsilon)} over {self.evaluation_releases} noised "
            "evaluations")
        return (f"client {self.client}: eps {_figure(self.epsilon_replace_one)} replace-one, "
                f"{_figure(self.epsilon_add_remove)} add-remove at delta {self.delta} over {self.steps} DP-SGD steps "
                f"in {self.rounds} rounds{tested}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DpSgdLedgerRow:
        """Read :meth:`to_dict`'s form (``ValueError`` naming a malformed ε)."""
        epsilon = number_from_json(data["epsilon"], name="epsilon", optional=False)
        replace_one = number_from_json(data.get("epsilon_replace_one", data["epsilon"]), name="epsilon_replace_one",
                                       optional=False)
        add_remove = number_from_json(data.get("epsilon_add_remove"), name="epsilon_add_remove", optional=False)
        assert epsilon is not None and replace_one is not None and add_remove is not None
        return cls(data["client"], data["rounds"], data.get("steps", 0), epsilon, float(data["delta"] or 0.0),
                   replace_one, add_remove, data.get("neighbours"), _optional_float(data.get("target_epsilon")),
                   _optional_float(data.get("noise_multiplier")), _optional_float(data.get("sampling_probability")),
                   _optional_float(data.get("clip")), str(data["method"]), _notes(data.get("notes", ())),
                   evaluation_releases=int(data.get("evaluation_releases") or 0),
                   evaluation_epsilon=number_from_json(data.get("evaluation_epsilon"), name="evaluation_epsilon",
                                                       optional=True),
                   evaluation_sigma=_optional_float(data.get("evaluation_sigma")))


AnyLedgerRow = LedgerRow | DpSgdLedgerRow


def _notes(value: object) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        return ()
    return tuple(str(n) for n in value if isinstance(n, str))


@dataclass(frozen=True)
class LedgerSection:
    """``metrics.json``'s ``privacy_ledger``: each client's total over the run so far.

    ``counted`` says which rounds count; ``adds_privacy_loss`` is False for ``perturbation none``; a DP-SGD run's
    section (``dp_sgd``) covers the rounds up to ``as_of_round``.
    """

    rounds: int
    counted: str | None
    accountant: str | None
    adds_privacy_loss: bool
    clients: tuple[AnyLedgerRow, ...]
    notes: tuple[str, ...] = ()
    dp_sgd: bool = False
    as_of_round: int | None = None

    def row(self, client: int) -> AnyLedgerRow | None:
        """Return ``client``'s row (None when the ledger has none)."""
        return next((r for r in self.clients if r.client == client), None)

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form written to ``metrics.json`` (and ``ldpfl federate --json``)."""
        out: dict[str, Any] = {"rounds": self.rounds, "counted": self.counted, "accountant": self.accountant,
                               "adds_privacy_loss": self.adds_privacy_loss}
        if self.dp_sgd:
            out.update(dp_sgd=True, as_of_round=self.as_of_round)
        return out | {"clients": [r.to_dict() for r in self.clients], "notes": list(self.notes)}

    def lines(self, *, max_clients: int | None = None) -> list[str]:
        """Return the ledger's text, the one display of it (``ldpfl inspect`` and ``ldpfl federate``'s summary).

        One line per client, or, beyond ``max_clients`` clients (None: no limit), the range of their figures.
        """
        if not self.adds_privacy_loss and RELEASED_FILES_NOTE in self.notes:  # e.g. over stats:K files
            return [f"  privacy ledger  {RELEASED_FILES_NOTE}"]
        if not self.adds_privacy_loss:
            return ["  privacy ledger  stage 2 adds no perturbation; its updates are covered by the release "
                    "guarantee above only where they are functions of released values (k-RR labels), not of clear "
                    "labels"]
        lines = [f"  privacy ledger  stage 2, each client over its uploads ({self.accountant}):"]
        rows = self.clients
        if max_clients is None or len(rows) <= max_clients:
            return lines + [f"    {row.line()}" for row in rows]
        finite = [float(r.epsilon) for r in rows if r.epsilon is not None and math.isfinite(r.epsilon)]
        if finite:
            lines.append(f"    {len(rows)} clients: eps from {min(finite):.4g} to {max(finite):.4g} over "
                         f"{min(r.rounds for r in rows)} to {max(r.rounds for r in rows)} uploads")
        infinite = sum(1 for r in rows if r.epsilon is not None and math.isinf(r.epsilon))
        if infinite:
            lines.append(f"    {infinite} clients: eps inf (not private)")
        return lines

    @classmethod
    def from_dict(cls, data: object) -> LedgerSection:
        """Read ``metrics.json``'s ``privacy_ledger`` (untrusted).

        Raises
        ------
        ValueError
            Not an object with a ``clients`` list, a row without :data:`LEDGER_ROW_KEYS`, an ε that is not a
            number (the message says which; ``ldpfl inspect`` shows it).
        """
        if not isinstance(data, Mapping) or not isinstance(data.get("clients"), list):
            raise ValueError("privacy_ledger is not an object with a 'clients' list")
        rows: list[AnyLedgerRow] = []
        for row in data["clients"]:
            if not isinstance(row, Mapping) or not all(k in row for k in LEDGER_ROW_KEYS):
                raise ValueError(f"privacy_ledger rows need the keys {', '.join(LEDGER_ROW_KEYS)}")
            epsilon = row["epsilon"]
            if epsilon is not None and epsilon != "inf" and (isinstance(epsilon, bool)
                                                             or not isinstance(epsilon, int | float)):
                raise ValueError(f"privacy_ledger: epsilon of client {row['client']!r} is not a number")
            try:
                rows.append(DpSgdLedgerRow.from_dict(row) if row.get("mechanism") == DP_SGD_MECHANISM
                            else LedgerRow.from_dict(row))
            except (ValueError, TypeError, KeyError) as error:
                raise ValueError(f"privacy_ledger: the row of client {row['client']!r} is malformed "
                                 f"({error})") from None
        as_of = data.get("as_of_round")
        return cls(data.get("rounds"), data.get("counted"), data.get("accountant"),  # type: ignore[arg-type]
                   bool(data.get("adds_privacy_loss", True)), tuple(rows), _notes(data.get("notes", ())),
                   bool(data.get("dp_sgd", False)), None if as_of is None else int(as_of))


@dataclass(frozen=True)
class UpdatesOnly:
    """A silo's smaller bound where only its updates leave: the ledger's (ε, δ), or its DP-SGD accountant's.

    ``epsilon_add_remove`` is the DP-SGD figure under add-remove (None: not a DP-SGD silo).
    """

    epsilon: float
    delta: float
    method: str
    epsilon_add_remove: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form."""
        if self.epsilon_add_remove is None:
            return {"epsilon": json_number(self.epsilon), "delta": self.delta, "method": self.method}
        return {"epsilon": json_number(self.epsilon), "epsilon_add_remove": json_number(self.epsilon_add_remove),
                "delta": self.delta, "method": self.method}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UpdatesOnly:
        """Read :meth:`to_dict`'s form."""
        epsilon = number_from_json(data.get("epsilon"), name="updates_only epsilon", optional=False)
        assert epsilon is not None
        return cls(epsilon, float(data.get("delta") or 0.0), str(data.get("method", "")),
                   _epsilon(data.get("epsilon_add_remove"), "updates_only epsilon_add_remove"))


@dataclass(frozen=True)
class SiloGuarantee:
    """One silo's per-record (ε, δ) over everything it released.

    A DP-SGD silo (``local_only_files`` not None) also states ε under both relations (``epsilon_add_remove`` is
    None where its shareable file's figure holds and has no add-remove form); so does a silo whose file's release
    states both (a ``stats:K`` file). ``updates_only``: the smaller
    bound where only its updates leave; ``note``: why its file's figure is given although that bound is smaller.
    ``evaluation_epsilon``: a DP-SGD silo's test records' figure (its noised evaluation replies), part of ``epsilon``.
    """

    client: int
    epsilon: float
    delta: float
    epsilon_replace_one: float | None = None
    epsilon_add_remove: float | None = None
    local_only_files: bool | None = None
    updates_only: UpdatesOnly | None = None
    note: str | None = None
    evaluation_epsilon: float | None = None

    @property
    def dp_sgd(self) -> bool:
        """Whether the silo trained with DP-SGD (its row states both relations)."""
        return self.local_only_files is not None

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form."""
        out: dict[str, Any] = {"client": self.client, "epsilon": json_number(self.epsilon), "delta": self.delta}
        if self.dp_sgd:
            out.update(epsilon_replace_one=json_number(self.epsilon_replace_one),
                       epsilon_add_remove=json_number(self.epsilon_add_remove),
                       local_only_files=self.local_only_files)
        elif self.epsilon_add_remove is not None:  # a file whose release states both relations (stats:K)
            out.update(epsilon_replace_one=json_number(self.epsilon_replace_one),
                       epsilon_add_remove=json_number(self.epsilon_add_remove))
        if self.evaluation_epsilon is not None:
            out["evaluation_epsilon"] = json_number(self.evaluation_epsilon)
        if self.updates_only is not None:
            out["updates_only"] = self.updates_only.to_dict()
        if self.note is not None:
            out["note"] = self.note
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SiloGuarantee:
        """Read :meth:`to_dict`'s form (``ValueError`` naming a malformed ε)."""
        epsilon = number_from_json(data.get("epsilon"), name="epsilon", optional=False)
        assert epsilon is not None
        updates = data.get("updates_only")
        local = data.get("local_only_files")
        return cls(data["client"], epsilon, float(data.get("delta") or 0.0),
                   _epsilon(data.get("epsilon_replace_one"), "epsilon_replace_one"),
                   _epsilon(data.get("epsilon_add_remove"), "epsilon_add_remove"),
                   None if local is None else bool(local),
                   UpdatesOnly.from_dict(updates) if isinstance(updates, Mapping) else None,
                   None if data.get("note") is None else str(data["note"]),
                   _epsilon(data.get("evaluation_epsilon"), "evaluation_epsilon"))


@dataclass(frozen=True)
class FederationGuarantee:
    """``metrics.json``'s ``release_guarantee``: the weakest silo's per-record (ε, δ), each silo's, the parts.

    Under DP-SGD, or over files whose releases state both relations (``neighbours`` set), the figure is stated under
    replace-one (``epsilon``) and add-remove (``epsilon_add_remove``, None where a silo's figure has no add-remove
    form).
    """

    epsilon: float
    delta: float
    scope: str
    notes: tuple[str, ...]
    clients: tuple[SiloGuarantee, ...]
    parts: tuple[GuaranteePart, ...]
    neighbours: str | None = None
    epsilon_add_remove: float | None = None

    @property
    def private(self) -> bool:
        """True where the figure is finite."""
        return math.isfinite(self.epsilon)

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form written to ``metrics.json``."""
        out: dict[str, Any] = {"epsilon": json_number(self.epsilon), "delta": self.delta, "private": self.private,
                               "scope": self.scope, "notes": list(self.notes),
                               "clients": [c.to_dict() for c in self.clients],
                               "parts": [p.to_dict() for p in self.parts]}
        if self.neighbours is not None:
            out.update(neighbours=self.neighbours, epsilon_replace_one=json_number(self.epsilon),
                       epsilon_add_remove=json_number(self.epsilon_add_remove))
        return out

    @classmethod
    def from_dict(cls, data: object) -> FederationGuarantee:
        """Read ``metrics.json``'s ``release_guarantee`` (untrusted; ``ValueError`` when it is malformed)."""
        if not isinstance(data, Mapping):
            raise ValueError("release_guarantee is not a JSON object")
        epsilon = number_from_json(data.get("epsilon"), name="epsilon", optional=False)
        assert epsilon is not None
        clients, parts = data.get("clients", []), data.get("parts", [])
        if not isinstance(clients, list) or not isinstance(parts, list):
            raise ValueError("release_guarantee's 'clients' and 'parts' must be lists")
        try:
            return cls(epsilon, float(data.get("delta") or 0.0), str(data.get("scope", "")),
                       _notes(data.get("notes", ())),
                       tuple(SiloGuarantee.from_dict(c) for c in clients if isinstance(c, Mapping)),
                       tuple(GuaranteePart.from_dict(p) for p in parts),
                       None if data.get("neighbours") is None else str(data["neighbours"]),
                       _epsilon(data.get("epsilon_add_remove"), "epsilon_add_remove"))
        except (KeyError, TypeError) as error:
            raise ValueError(f"release_guarantee is malformed ({error})") from None


__all__ = ["DP_SGD_MECHANISM", "LEDGER_ROW_KEYS", "AnyLedgerRow", "DpSgdLedgerRow", "FederationGuarantee",
           "LedgerRow", "LedgerSection", "SiloGuarantee", "UpdatesOnly"]
