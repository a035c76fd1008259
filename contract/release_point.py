"""Release points: which summary of a record a client file holds (issue 17 item 1).

A client file's ``release`` attribute names what stage 1 randomized and stored for each record:

* ``flatten``: the CNN's flatten-layer output (LDPFL; r values, fixed-point bits or float32). Files of
  schema versions 1 and 2 have no ``release`` attribute and hold this.
* ``bottleneck:K``: the output of a K-unit tanh layer trained after the flatten layer, in [-1, 1]^K.
* ``scores``: the CNN's class probabilities p, mapped to [-1, 1]^k by 2p - 1.
* ``label``: the CNN's predicted class, stored as k float32 values (a one-hot row, or the k values a
  categorical mechanism outputs).
* ``stats:K`` (issue 40): no record is released; the silo releases once the noisy per-class sums, counts and
  second moments of its records projected to K values (``gaussian-stats``), and the file's rows are synthetic
  records drawn from them (K values each).

Each release point is registered once here (:data:`RELEASES`): its name, whether it takes a size, the mechanism
domains it takes, the help text and the note its privacy report carries. The CLI's help, the error messages and
stage 1's checks are built from the registry.

This module is pure (no numpy): the schema checks the attribute with it and stage 1 builds on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ldpfl.common.registry import Registry

FLATTEN = "flatten"
BOTTLENECK = "bottleneck"
SCORES = "scores"
LABEL = "label"
STATS = "stats"
MIN_BOTTLENECK = 4
MAX_BOTTLENECK = 128
MAX_STATS_WIDTH = 4096
"""The largest projection of a ``stats:K`` release: its second moments are K² float64 values (128 MiB)."""


@dataclass(frozen=True)
class ReleaseKind:
    """One registered release point.

    Attributes
    ----------
    name : str
        The ``release`` attribute's kind (``flatten``, ``bottleneck`` ...).
    sized : bool
        Whether it takes a size K (``bottleneck:K``).
    domains : tuple of str
        The mechanism ``DOMAIN`` values it takes (``any`` is ``none``, which goes with every release).
    summary : str
        What a record releases, for ``--release``'s help (after its usage: `` (...): ...`` or ``: ...``).
    note : str or None
        The note of its privacy report (``{units}`` and ``{classes}`` filled in); None for LDPFL's flatten features.
    sizes : tuple of int
        The smallest and largest K of a sized kind.
    """

    name: str
    sized: bool
    domains: tuple[str, ...]
    summary: str
    note: str | None = None
    sizes: tuple[int, int] = (MIN_BOTTLENECK, MAX_BOTTLENECK)

    @property
    def usage(self) -> str:
        """Return how ``--release`` spells it: ``bottleneck:K`` for a sized kind, else its name."""
        return f"{self.name}:K" if self.sized else self.name


RELEASES: Registry[ReleaseKind] = Registry("release", describe=lambda kind: kind.name)

for _kind in (
    ReleaseKind(FLATTEN, False, ("bits", "real", "any"),
                " (default, LDPFL): the CNN's flatten-layer output, r values"),
    ReleaseKind(BOTTLENECK, True, ("bounded", "real", "any"),
                f" ({MIN_BOTTLENECK} <= K <= {MAX_BOTTLENECK}, K <= r): a K-unit tanh layer trained in the CNN right "
                "after the flatten layer; its output in [-1,1]^K",
                "release bottleneck:{units}: each record is the output of the client CNN's {units}-unit tanh layer "
                "after the flatten layer, in [-1, 1]^{units}"),
    ReleaseKind(SCORES, False, ("bounded", "real", "any"),
                ": the CNN's class probabilities p, mapped to [-1,1]^k by 2p-1",
                "release scores: each record is the client CNN's softmax p over the {classes} classes, mapped to "
                "[-1, 1]^{classes} by 2p - 1"),
    ReleaseKind(LABEL, False, ("category", "any"), ": the CNN's predicted class (one-hot, width k)",
                "release label: each record is the client CNN's predicted class, as a one-hot row of {classes} "
                "values"),
    ReleaseKind(STATS, True, ("statistics",),
                f" (1 <= K <= {MAX_STATS_WIDTH}, K <= r; an extractor no record trained: scatter or none): no "
                "record; the noisy per-class sums, counts and second moments of the records projected to K values, "
                "released once, and synthetic records drawn from them",
                "release stats:{units}: no record is released; one release of the noisy per-class sums, class "
                "counts and second moments of the records projected to {units} values and clipped; the rows are "
                "synthetic records drawn from them (post-processing)",
                (1, MAX_STATS_WIDTH)),
):
    RELEASES.add(_kind.name, _kind)

RELEASE_KINDS = tuple(RELEASES.names())
"""The registered kinds, in registration order."""


def release_kind(name: str) -> ReleaseKind:
    """Return the registered release point ``name`` (``ValueError`` listing the valid ones)."""
    return RELEASES.get(name)


def _choices() -> str:
    return ", ".join(kind.usage for _, kind in RELEASES.items())


@dataclass(frozen=True)
class ReleasePoint:
    """A parsed release point: its kind and, for ``bottleneck``, the number of units K."""

    kind: str
    units: int | None = None

    def __post_init__(self) -> None:
        """Check the kind and K (``ValueError`` quoting the value and the range)."""
        if self.kind not in RELEASES:
            raise ValueError(f"release must be one of {_choices()}; got {self.kind!r}")
        kind = release_kind(self.kind)
        if kind.sized:
            low, high = kind.sizes
            if isinstance(self.units, bool) or not isinstance(self.units, int) or not low <= self.units <= high:
                raise ValueError(f"{self.kind}:K needs an integer K in [{low}, {high}], got {self.units!r}")
        elif self.units is not None:
            raise ValueError(f"release {self.kind!r} takes no size, got {self.kind}:{self.units}")

    def __str__(self) -> str:
        """Return the attribute text: ``flatten``, ``bottleneck:16``, ``scores``, ``label`` or ``stats:256``."""
        return f"{self.kind}:{self.units}" if self.units is not None else self.kind

    @property
    def is_flatten(self) -> bool:
        """Return whether this is LDPFL's flatten-feature release."""
        return self.kind == FLATTEN

    def width(self, flatten_width: int, num_classes: int) -> int:
        """Return the values per record: r (flatten), K (bottleneck, stats) or k (scores, label)."""
        if self.kind == FLATTEN:
            return int(flatten_width)
        if self.units is not None:
            return self.units
        return int(num_classes)


def parse_release(text: str) -> ReleasePoint:
    """Parse ``flatten``, ``bottleneck:K``, ``scores``, ``label`` or ``stats:K`` (``ValueError`` otherwise)."""
    if not isinstance(text, str):
        raise ValueError(f"release must be a string, got {text!r}")
    kind, sep, size = text.strip().partition(":")
    kind = kind.strip().lower()
    if kind in RELEASES and release_kind(kind).sized:
        low, high = release_kind(kind).sizes
        if not sep:
            raise ValueError(f"release {kind} needs its size: {kind}:K, e.g. {kind}:{max(low, 16)}")
        try:
            units = int(size.strip())
        except ValueError:
            raise ValueError(f"{kind}:K needs an integer K in [{low}, {high}], got {size.strip()!r}") from None
        return ReleasePoint(kind, units)
    if sep:
        if kind in RELEASES:
            raise ValueError(f"release {kind!r} takes no size, got {text!r}")
        raise ValueError(f"release must be one of {_choices()}; got {text!r}")
    return ReleasePoint(kind)
