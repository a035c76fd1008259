"""A small generic registry: one per plug-in family (mechanisms, aggregation strategies, datasets, ...).

As Opacus's ``accountants/registry.py``: names come from one place, a second registration of a name is
refused, and an unknown name fails with the list of the valid ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Named plug-ins of one family, in registration order.

    Parameters
    ----------
    kind : str
        What the plug-ins are, for messages (``"mechanism"``, ``"aggregation"``, ...).
    describe : callable, optional
        How to name a registered item in the duplicate message (default: its ``__name__`` or ``repr``).

    Examples
    --------
    >>> shapes: Registry[int] = Registry("shape")
    >>> shapes.add("square", 4)
    4
    >>> shapes.get("square")
    4
    """

    def __init__(self, kind: str, describe: Callable[[T], str] | None = None) -> None:
        self.kind = kind
        self._describe = describe or (lambda item: getattr(item, "__name__", repr(item)))
        self._items: dict[str, T] = {}

    def add(self, name: str, item: T) -> T:
        """Register ``item`` as ``name`` and return it; an empty or taken name raises ``ValueError``."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} {self._describe(item)} has no name")
        if name in self._items:
            raise ValueError(f"{self.kind} name {name!r} is already registered by "
                             f"{self._describe(self._items[name])}")
        self._items[name] = item
        return item

    def remove(self, name: str) -> T:
        """Unregister ``name`` and return what it held (for tests that register a plug-in of their own)."""
        item = self.get(name)
        del self._items[name]
        return item

    def names(self) -> list[str]:
        """Return the registered names, in registration order."""
        return list(self._items)

    def get(self, name: str) -> T:
        """Return the item registered as ``name``; an unknown name raises ``ValueError`` listing the valid ones."""
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise ValueError(f"unknown {self.kind} {name!r}; valid names: "
                             f"{', '.join(self._items) or 'none registered'}") from None

    def items(self) -> list[tuple[str, T]]:
        """Return the (name, item) pairs in registration order."""
        return list(self._items.items())

    def __contains__(self, name: object) -> bool:
        """Tell whether ``name`` is registered."""
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        """Iterate over the names, in registration order."""
        return iter(list(self._items))

    def __len__(self) -> int:
        """Count the registered items."""
        return len(self._items)
