"""What the server knows of a client before round 1: one :class:`ClientDescription`, whichever engine runs.

A client is described from its file (:meth:`ClientDescription.of`): the local engine describes each file it
loaded; a Flower silo describes its own and sends the description to the server, which never opens a client file
(``flower_engine.protocol``: ``description_to_json`` and ``description_from_json``, which validates every field).
The plan (``plan.build_plan``: the model's shape, each client's budget, the records), the aggregation strategies
(``strategies``: rows for sample weights, the label histogram for DP-FedAW) and the Flower server's checks
(``flower_engine.server_side``: the manifest's files, rows and label counts) read the same description.

Imports neither torch nor flwr: its fields are typed for pydantic (``message_fields``), which validates a
description that arrives over the network.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ldpfl.contract.release_guarantee import stored_or_computed
from ldpfl.mechanisms.identity import NoRandomization

from .message_fields import STRICT, AtLeastOne, Count, WireGuarantee, WireLabelRelease, WireReport

if TYPE_CHECKING:
    from .data import ClientDataset


@dataclass(frozen=True)
class ClientDescription:
    """What the server knows of client ``index``: its file's sizes, labels and feature metadata, never a record.

    The rows weigh its upload (``sample_weighted``) and plan its training (``silo_training``: a noisy method's
    sampling rate and reply bound); the training label histogram sets its DP-FedAW weight; the file's feature
    metadata fixes the model's shape and its privacy records.
    """

    __pydantic_config__ = STRICT  # a description read from a message: exactly these fields, exact JSON types

    index: Count
    file: str  # the file's name (not its path on the silo)
    train_rows: Count
    test_rows: Count
    label_histogram: tuple[Count, ...]
    dataset: str
    num_classes: AtLeastOne
    feature_format: str
    feature_width: AtLeastOne
    feature_mechanism: str
    feature_privacy: WireReport
    sha256: str  # of the file: the checkpoint records it, and resume refuses other files
    release_guarantee: WireGuarantee | None = None  # the file's (issue 22); None from an older client
    label_release: WireLabelRelease | None = None  # the file's label_release (issue 22: T of k-RR labels)
    plan_fingerprint: str | None = None  # the shared plan the file was exported with (issue 16), if any
    local_only: bool = False  # the file never leaves its silo (export --local-only): only updates do

    @classmethod
    def of(cls, client: ClientDataset, sha256: str) -> ClientDescription:
        """Describe ``client`` from its file's metadata and splits; ``sha256``: the file's digest."""
        meta = client.metadata
        train_rows, test_rows = len(client.train), len(client.test)
        return cls(
            index=client.index, file=client.path.name, train_rows=train_rows, test_rows=test_rows,
            label_histogram=client.label_histogram, dataset=meta.dataset, num_classes=meta.num_classes,
            feature_format=meta.feature_format, feature_width=meta.feature_width, feature_mechanism=meta.mechanism,
            feature_privacy=meta.privacy(), sha256=sha256,
            release_guarantee=stored_or_computed(meta, records=train_rows + test_rows),
            label_release=meta.label_release, plan_fingerprint=meta.plan_fingerprint, local_only=bool(meta.local_only))

    @classmethod
    def in_memory(cls, index: int, train_rows: int, label_histogram: Sequence[int]) -> ClientDescription:
        """Describe a silo that no file holds (an experiment's or a test's split in memory): its rows and labels.

        What a file would tell is left blank: no file, no test split, raw features (mechanism ``none``) of
        width 1. Only a strategy (rows, label histogram) reads such a description; the plan needs a file's.
        """
        histogram = tuple(int(c) for c in label_histogram)
        return cls(index=index, file="", train_rows=train_rows, test_rows=0, label_histogram=histogram,
                   dataset="", num_classes=max(len(histogram), 1), feature_format="float32", feature_width=1,
                   feature_mechanism=NoRandomization.NAME, feature_privacy=NoRandomization().report(), sha256="")

    def json_form(self) -> dict[str, Any]:
        """Return the fields as JSON values: the report as the file stores it, the guarantee's ``to_dict``."""
        form = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        guarantee = None if self.release_guarantee is None else self.release_guarantee.to_dict()
        labels = None if self.label_release is None else self.label_release.to_json()
        return form | {"feature_privacy": json.loads(self.feature_privacy.to_json()), "release_guarantee": guarantee,
                       "label_release": labels}
