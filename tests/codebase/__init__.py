"""Tests of the code base itself: import layering and cycles, style, type checks, packaging."""
