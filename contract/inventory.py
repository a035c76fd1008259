"""What a shareable client file holds, each value classified by how the release guarantee covers it (issue 22 item 1).

Every dataset and root attribute of a client file that may leave the silo is one of:

* ``randomized``: derived from the records and covered by a part of ``release_guarantee`` (the features by the
  file's mechanism; the labels by ``label_release``: k-RR, or in clear with ε = ∞ stated as such);
* ``released-derived``: computed from randomized values only (post-processing adds no privacy loss), or from
  the guarantee's own inputs;
* ``public``: fixed before any record is read (the plan, the mechanism's parameters, the software), or public
  under the guarantee's neighbouring relation (replace one record: the row counts, and so the shapes).

Values derived from the clear records that the guarantee does not cover are ``local-only``: they are written only
to ``client_NNN.local.h5`` (``local_only`` = 1, never shared) or nowhere. ``/stats/input_bit_density`` (an
aggregate of the unrandomized encoding, written only on request) is the one exception a shareable file may
carry: its guarantee then has a part ``diagnostic`` with ε = ∞ for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

RANDOMIZED = "randomized"
RELEASED_DERIVED = "released-derived"
PUBLIC = "public"
LOCAL_ONLY = "local-only"

DATASETS: Mapping[str, str] = {
    "train/features": RANDOMIZED, "test/features": RANDOMIZED,  # the file's mechanism: part "features"
    "train/labels": RANDOMIZED, "test/labels": RANDOMIZED,  # label_release: part "labels" (krr, or clear: ε = ∞)
    "stats/input_bit_density": RANDOMIZED,  # only with store_input_density: part "diagnostic", ε = ∞
    # a stats:K release (issue 40): the noisy statistics (part "features": gaussian-stats) and a public key
    "released_statistics/sums": RANDOMIZED, "released_statistics/counts": RANDOMIZED,
    "released_statistics/moments": RANDOMIZED, "released_statistics/synthetic_key": PUBLIC,
}
"""Datasets of a shareable client file (groups ``train``, ``test`` and ``stats`` hold nothing else)."""

ATTRIBUTES: Mapping[str, str] = {
    # the plan and the software
    "schema": PUBLIC, "schema_version": PUBLIC, "package_version": PUBLIC, "created_utc": PUBLIC,
    "dataset": PUBLIC, "num_classes": PUBLIC, "class_names": PUBLIC, "client_index": PUBLIC,
    "client_count": PUBLIC, "partition": PUBLIC, "plan_fingerprint": PUBLIC, "extractor": PUBLIC,
    "input_shape": PUBLIC, "release": PUBLIC, "local_only": PUBLIC, "randomness": PUBLIC,
    "generator": PUBLIC,
    # the mechanism and its report (parameters fixed by the plan)
    "integer_bits": PUBLIC, "fraction_bits": PUBLIC, "bits_per_value": PUBLIC, "features": PUBLIC,
    "feature_width": PUBLIC, "feature_format": PUBLIC, "mechanism": PUBLIC, "mechanism_parameters": PUBLIC,
    "privacy_report": PUBLIC, "nominal_epsilon": PUBLIC, "exact_epsilon_per_record": PUBLIC, "private": PUBLIC,
    # how the labels and the extractor were released and trained (the plan's settings and the row count)
    "label_release": PUBLIC, "extractor_training": PUBLIC, "release_guarantee": RELEASED_DERIVED,
    # statistics
    "label_histograms": RELEASED_DERIVED,  # counts of the released (randomized) labels
    "local_accuracy": LOCAL_ONLY,  # accuracy on the clear test split: NaN in a shareable file
    # values the encoding clamped (issue 42): written only where the values are not randomized (mechanism none,
    # features part ε = ∞) or local-only; inspect flags it in a private shareable file (ldpfl.contract.clamped)
    "clamped_values": RANDOMIZED,
}
"""Root attributes of a client file; ``local_accuracy`` holds a value only in ``client_NNN.local.h5``."""



def classify(kind: str, name: str) -> str | None:
    """Return the class of dataset or attribute ``name`` (``kind``: ``dataset`` or ``attribute``); None if unknown."""
    table = DATASETS if kind == "dataset" else ATTRIBUTES
    return table.get(name)


def unclassified(handle: Any) -> list[str]:
    """Return the datasets and attributes of an open client file that the inventory does not classify."""
    found: list[str] = [f"attribute {name!r}" for name in handle.attrs if classify("attribute", name) is None]

    def visit(name: str, obj: Any) -> None:
        if hasattr(obj, "shape") and classify("dataset", name) is None:
            found.append(f"dataset {name!r}")
        for attr in getattr(obj, "attrs", {}):
            found.append(f"attribute {attr!r} of {name!r}")

    handle.visititems(visit)
    return found
