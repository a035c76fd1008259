"""Hardening tests, by component: hostile or odd inputs, crashes, leftovers and races give one clear error and
nothing half-written."""
