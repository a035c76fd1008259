"""A silo's label histogram, the claim behind DP-FedAW's weights: checked where it can be, bounded where not.

DP-FedAW weighs silo k by g_k = cos(G_k, S) (eqs. 7-8), G_k its training label histogram, S the uniform one, so a
silo that claims a uniform histogram gets the largest weight whatever its labels (issue 42 item 3: a near-constant
silo claiming uniform labels raised its weight from 0.138 to 0.335).

* **Checked.** The local engine holds the files: a file whose recorded ``label_histograms`` differs from the counts
  of its own labels is refused (:func:`screen_files`), and the silo is left out and named (``left_out``). The Flower
  coordinator holds the manifest only: a SuperNode's claimed histogram is compared with the manifest's per-file
  label counts where the manifest lists them (``flower_engine.server_side.manifest_refusal``).
* **Bounded.** A histogram the coordinator cannot check (a manifest without label counts) gives a silo a similarity
  of at most 1.1 times the median of the run's silos (:func:`cap_unchecked`, :data:`CAP_RULE`): a minority of
  forging silos cannot rise more than 10 % above the middle silo's weight, while honest silos of like label mixes
  (IID: every g within a few per cent of 1) keep theirs. The cap is named in ``config.json`` and ``metrics.json``
  (``label_claims``) and in the run's summary. It cannot tell a forger from an honest balanced silo when the
  middle silo is balanced too: only the checked histogram does.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .data import ClientDataset
from .left_out import LeftOut
from .streaming import StreamedSplit

CAP_SLACK = 0.1
"""An unchecked histogram's similarity g_k is at most (1 + CAP_SLACK) times the median of the run's g."""

CAP_RULE = f"{1 + CAP_SLACK:g} times the median similarity g of the run's silos"
"""The weight cap of an unchecked histogram, as the record and the summary name it (``label_claims``)."""


def histogram_refusal(index: int, file: str, claimed: Sequence[int], actual: Sequence[int], source: str) -> str | None:
    """Why silo ``index``'s ``claimed`` training label histogram is refused (``actual`` from ``source``), or None."""
    if tuple(int(c) for c in claimed) == tuple(int(c) for c in actual):
        return None
    return (f"client {index}: {file} claims the training label histogram {list(claimed)}, {source} "
            f"{list(actual)}: the silo's claim is refused (it sets its DP-FedAW weight)")


def counted_histogram(client: ClientDataset) -> tuple[int, ...]:
    """Count each class over ``client``'s training labels (never the recorded attribute)."""
    classes = client.metadata.num_classes
    if isinstance(client.train, StreamedSplit):
        return client.train.label_histogram()  # a pass over its labels, block by block
    counts = torch.bincount(client.train.labels.cpu(), minlength=classes)
    return tuple(int(v) for v in counts[:classes])


def screen_files(clients: Sequence[ClientDataset]) -> tuple[list[ClientDataset], list[LeftOut]]:
    """Leave out each client whose file's recorded training histogram its labels do not bear out; return both lists.

    A file with no recorded histogram claims nothing (its labels are counted, ``ClientDataset.label_histogram``).
    """
    kept: list[ClientDataset] = []
    left: list[LeftOut] = []
    for client in clients:
        recorded = client.metadata.label_histograms.get("train")
        reason = None if recorded is None else histogram_refusal(
            client.index, client.path.name, recorded, counted_histogram(client), "its labels count")
        if reason is None:
            kept.append(client)
        else:
            left.append(LeftOut(client.index, client.path.name, reason))
    return kept, left


@dataclass(frozen=True)
class CappedClaim:
    """An unchecked silo whose claimed histogram gave more than the cap: its g_k as claimed and as used."""

    client: int
    claimed: float
    capped_to: float


@dataclass(frozen=True)
class LabelClaimCap:
    """The cap on DP-FedAW's weights from histograms the coordinator could not check (:func:`cap_unchecked`)."""

    unchecked: tuple[int, ...]
    cap: float
    capped: tuple[CappedClaim, ...]

    def to_dict(self) -> dict[str, Any]:
        """Return the cap as ``config.json`` and ``metrics.json`` write it (``label_claims``)."""
        return {"unchecked": list(self.unchecked), "cap_rule": CAP_RULE, "cap": round(self.cap, 6),
                "capped": [{"client": c.client, "claimed_similarity": round(c.claimed, 6),
                            "capped_to": round(c.capped_to, 6)} for c in self.capped]}

    @staticmethod
    def line(record: Mapping[str, Any]) -> str:
        """Return the summary's line on a cap written by :meth:`to_dict`."""
        capped = ", ".join(f"silo {c['client']} (claimed {c['claimed_similarity']:.3f})" for c in record["capped"])
        return (f"label histograms: {len(record['unchecked'])} unchecked (the manifest lists no label counts); "
                f"their DP-FedAW similarity is capped at {record['cap']:.3f}, {CAP_RULE}: "
                + (f"capped {capped}" if capped else "none above it"))


def cap_unchecked(similarities: Mapping[int, float], unchecked: Collection[int]) -> tuple[dict[int, float],
                                                                                           LabelClaimCap]:
    """Cap the similarity g_k of each ``unchecked`` silo at (1 + :data:`CAP_SLACK`) times the median of all silos' g.

    Return the similarities and the cap. The median is over every silo of the run (checked or not): silos forging
    a uniform histogram, fewer than half of the run's, stay within 10 % of the middle silo's g (DP-FedAW eq. 10
    divides by Σ g_k).
    """
    cap = (1.0 + CAP_SLACK) * float(np.median(list(similarities.values())))
    capped = tuple(CappedClaim(c, g, cap) for c, g in sorted(similarities.items()) if c in unchecked and g > cap)
    lowered = {c.client for c in capped}
    return ({c: (cap if c in lowered else g) for c, g in similarities.items()},
            LabelClaimCap(tuple(sorted(c for c in unchecked if c in similarities)), cap, capped))
