"""What a federation prints on the terminal for its user: one warning line above the progress bar.

Both engines' ``on_warning`` default and the ``ldpfl federate`` command print with :func:`print_warning`; the
library itself only ever passes the lines to the ``on_warning`` it was given.
"""

from __future__ import annotations

import sys


def print_warning(message: str) -> None:
    """Print ``Warning: message`` (its whitespace collapsed to one line) on stderr, above any progress bar."""
    from tqdm.auto import tqdm

    tqdm.write(f"Warning: {' '.join(message.split())}", file=sys.stderr)
