"""Every release of a client's records, as ``manifest.json`` records it (issue 15 item 2).

``ldpfl export --from-models`` releases the records of an earlier run again, from the same client CNNs.
Each release of the same record spends its privacy again: under basic sequential composition
(Dwork & Roth 2014, Theorem 3.16) the per-record ε of k releases is at most the sum of theirs. So the
manifest of every export carries ``release_history``: for each client (``"client_000"``), one entry per
release of its records, oldest first, the last one being the run's own file::

    {"run": "/path/of/the/run", "file": "client_000.h5", "sha256": "...", "mechanism": "uer",
     "release": "flatten", "exact_epsilon_per_record": 39245.4, "randomness": "seeded"}

A manifest written before this key existed describes one release per listed file (the run's mechanism,
the flatten features, the run's privacy report): :func:`history_from_manifest` reads both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ldpfl.contract.label_release import LabelRelease
from ldpfl.contract.layout import client_index_from_name, client_stem
from ldpfl.contract.release_point import FLATTEN
from ldpfl.mechanisms.report import json_number, number_from_json

if TYPE_CHECKING:  # the manifest reads client files (schema), which hold guarantees built from this module
    from ldpfl.contract.manifest import FileRecord, RunInfo

RELEASE_HISTORY_KEY = "release_history"


def _epsilon(value: Any) -> float | None:
    return number_from_json(value, name="exact_epsilon_per_record", optional=True)


@dataclass(frozen=True)
class ReleaseEntry:
    """One release of a client's records: where the file is, what it holds, its exact ε per record."""

    run: str
    file: str
    sha256: str | None
    mechanism: str
    release: str
    exact_epsilon_per_record: float | None  # None: not recorded; inf: not private
    randomness: str | None = None
    label_release: LabelRelease | None = None  # the file's label release; None: not recorded (clear labels)

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form (an infinite ε as ``"inf"``)."""
        eps = self.exact_epsilon_per_record
        out: dict[str, Any] = {"run": self.run, "file": self.file, "sha256": self.sha256,
                               "mechanism": self.mechanism, "release": self.release, "randomness": self.randomness,
                               "exact_epsilon_per_record": json_number(eps)}
        if self.label_release is not None:
            out["label_release"] = self.label_release.to_json()
        return out

    @classmethod
    def from_dict(cls, data: Any) -> ReleaseEntry:
        """Read an entry (``ValueError`` naming the key when it is malformed)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a release entry must be a JSON object, got {type(data).__name__}")
        for key in ("file", "mechanism"):
            if not isinstance(data.get(key), str):
                raise ValueError(f"release entry key {key!r} must be a string, got {data.get(key)!r}")
        sha = data.get("sha256")
        label = data.get("label_release")
        if label is not None and not isinstance(label, Mapping):
            raise ValueError(f"release entry key 'label_release' must be a JSON object, got {label!r}")
        return cls(str(data.get("run", "")), data["file"], None if sha is None else str(sha), data["mechanism"],
                   str(data.get("release", FLATTEN)), _epsilon(data.get("exact_epsilon_per_record")),
                   None if data.get("randomness") is None else str(data["randomness"]),
                   None if label is None else LabelRelease.from_json(label))


def total_epsilon(entries: Iterable[ReleaseEntry]) -> float | None:
    """Return the per-record ε of all ``entries`` together (their sum, basic composition); None if one is unknown."""
    total = 0.0
    for entry in entries:
        if entry.exact_epsilon_per_record is None:
            return None
        total += entry.exact_epsilon_per_record
    return total


def history_from_manifest(info: RunInfo, files: Iterable[FileRecord],
                          run: str) -> dict[int, list[ReleaseEntry]]:
    """Return each listed client's releases, oldest first (``ValueError`` when the history is malformed).

    Parameters
    ----------
    info : mapping
        The manifest's run information (``Manifest.info``).
    files : iterable of FileRecord
        The files it lists.
    run : str
        The run directory the manifest belongs to: it replaces the ``run`` "." of its own entries, and
        is recorded in the entries made for a manifest without ``release_history``.
    """
    files = list(files)
    recorded = info.get(RELEASE_HISTORY_KEY)
    if recorded is not None:
        if not isinstance(recorded, Mapping):
            raise ValueError(f"manifest key {RELEASE_HISTORY_KEY!r} must be a JSON object")
        history: dict[int, list[ReleaseEntry]] = {}
        for stem, entries in recorded.items():
            index = client_index_from_name(f"{stem}.h5")
            if index is None or not isinstance(entries, list):
                raise ValueError(f"manifest key {RELEASE_HISTORY_KEY!r}: {stem!r} is not a client with a list")
            history[index] = [_here(ReleaseEntry.from_dict(e), run) for e in entries]
        return {r.client_index: history.get(r.client_index, []) for r in files}
    stated = info.get("privacy_report")
    stated_epsilon = stated.get("exact_epsilon_per_record") if isinstance(stated, Mapping) else None
    randomness = info.get("randomness")
    return {r.client_index: [ReleaseEntry(run, r.path, r.sha256, str(info.get("mechanism", "?")),
                                          str(info.get("release", FLATTEN)), _epsilon(stated_epsilon),
                                          None if randomness is None else str(randomness))]
            for r in files}


def _here(entry: ReleaseEntry, run: str) -> ReleaseEntry:
    """Return ``entry`` with ``run`` "." (the manifest's own run directory) replaced by ``run``."""
    return dataclasses.replace(entry, run=run) if entry.run == "." else entry


def history_json(history: Mapping[int, list[ReleaseEntry]]) -> dict[str, list[dict[str, Any]]]:
    """Return ``release_history`` as written to the manifest: ``{"client_000": [entry, ...], ...}``."""
    return {client_stem(i): [e.to_dict() for e in history[i]] for i in sorted(history)}
