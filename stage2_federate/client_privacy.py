"""One client's privacy in a federation: ``metrics.json``'s ``privacy`` entries, made once by the plan.

A :class:`ClientPrivacy` holds the upload's mechanism report (labelled with the run's randomness), what the
client's file released (its ``PrivacyReport`` and ``ReleaseGuarantee``) and how the silo trains (``silo_training``).
It stays this frozen record from the plan to the writers of ``metrics.json`` and the run's result; the dict is
made once, by :meth:`ClientPrivacy.to_dict`, and read back once, by :meth:`ClientPrivacy.from_dict` (a Flower
run's result, read from the ServerApp's ``metrics.json``). Torch-free.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ldpfl.contract.release_guarantee import ReleaseGuarantee
from ldpfl.mechanisms.randomness import UNRECORDED
from ldpfl.mechanisms.report import PrivacyReport

from .silo_training import ENTRY_KEYS, PLAIN, SiloTraining, read_training

UPLOAD_RELEASE = ("one upload per round the client is selected; the composition over the rounds is metrics.json's "
                  "privacy_ledger")
"""What one upload is, in words (each entry's ``release``)."""

_OWN_KEYS = ("client", "target", "noise_scale", "release", "file", "feature_privacy", "feature_mechanism",
             "release_guarantee", *ENTRY_KEYS)


@dataclass(frozen=True)
class ClientPrivacy:
    """Client ``client``'s upload mechanism (``upload``, labelled with the run's randomness) and its file's release.

    ``target``: what the mechanism perturbs (parameters or update); ``noise_scale``: its σ_i (None: no noise);
    ``feature_privacy``/``release_guarantee``: the report and guarantee of the client's file (the guarantee None
    from an older Flower client); ``training``: how the silo trains (``silo_training``: its settings and
    accountant); ``local_only``: its files never leave the silo.
    """

    client: int
    upload: PrivacyReport
    target: str
    noise_scale: float | None
    file: str
    feature_mechanism: str
    feature_privacy: PrivacyReport
    release_guarantee: ReleaseGuarantee | None = None
    training: SiloTraining = PLAIN
    local_only: bool = False
    release: str = UPLOAD_RELEASE

    def with_randomness(self, mode: str, generator: str = UNRECORDED) -> ClientPrivacy:
        """Return the same record, its upload's report labelled with ``mode`` and ``generator`` (a resumed run)."""
        return dataclasses.replace(self, upload=self.upload.with_randomness(mode, generator))

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form (``metrics.json``'s ``privacy`` entry, ``ldpfl federate --json``).

        The upload's report's keys, then the client's; ``feature_privacy`` as the client file stores it (keys
        sorted, ``PrivacyReport.to_json``).
        """
        out = self.upload.to_dict()
        out.update(client=self.client, target=self.target, noise_scale=self.noise_scale, release=self.release,
                   file=self.file, feature_privacy=json.loads(self.feature_privacy.to_json()),
                   feature_mechanism=self.feature_mechanism)
        if self.release_guarantee is not None:
            out["release_guarantee"] = self.release_guarantee.to_dict()
        out.update(self.training.entry_json(local_only=self.local_only))
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClientPrivacy:
        """Read :meth:`to_dict`'s form (``ValueError`` when a report or the guarantee is malformed)."""
        upload = PrivacyReport.from_dict({k: v for k, v in data.items() if k not in _OWN_KEYS})
        guarantee = data.get("release_guarantee")
        return cls(int(data["client"]), upload, str(data["target"]), data.get("noise_scale"), str(data["file"]),
                   str(data["feature_mechanism"]),
                   PrivacyReport.from_dict(data["feature_privacy"], ignore_unknown=True),
                   None if guarantee is None else ReleaseGuarantee.from_dict(guarantee),
                   read_training(data), bool(data.get("local_only", False)),
                   str(data.get("release", UPLOAD_RELEASE)))


__all__ = ["UPLOAD_RELEASE", "ClientPrivacy"]
