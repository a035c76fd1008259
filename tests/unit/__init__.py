"""Unit tests: one function or class against hand-computed values, golden numbers or its own contract."""
