"""Where the checkout is: the repository root the tests run from, whatever folder a test lives in."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
