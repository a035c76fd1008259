"""The project's exceptions share one root; a parameter error names its parameters, never a front end's flags.

``LdpflError`` lets a caller catch every error ldpfl raises on purpose (``except ldpfl.common.errors.LdpflError``);
each concrete error also derives from the builtin it refines (``ValueError`` for bad input, ``OSError`` for files),
so code that catches builtins keeps working.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_MARKED = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)`")


class LdpflError(Exception):
    """The root of every exception ldpfl raises on purpose."""


class ParameterError(LdpflError, ValueError):
    """A ``ValueError`` whose message names parameters (``clip``, ``client_ranges``), never CLI flags.

    The message marks each parameter name with backquotes (```clip```); ``str(error)`` shows the plain
    names, ``parameters`` lists them, and a front end shows them its own way with :meth:`render` (the
    CLI: ``--clip``). Text around the marks is left alone, even where it holds the same word.
    """

    def __init__(self, template: str) -> None:
        self.template = template
        self.parameters = tuple(dict.fromkeys(_MARKED.findall(template)))
        super().__init__(self.render(lambda name: name))

    def render(self, spell: Callable[[str], str]) -> str:
        """Return the message with each marked parameter name replaced by ``spell(name)``."""
        return _MARKED.sub(lambda match: spell(match.group(1)), self.template)
