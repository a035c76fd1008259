"""The floor below every layer: what all of ldpfl shares and nothing of ldpfl's own is imported by.

* ``errors``   - :class:`LdpflError`, the root of the project's exceptions, and :class:`ParameterError`, a
  ``ValueError`` whose message names parameters (front ends spell them their own way: the CLI as flags);
* ``registry`` - :class:`Registry`, the one generic registry of a plug-in family (mechanisms, datasets, release
  points, aggregation strategies, ...).

This package imports the standard library only; import from the modules, this package imports nothing.
"""
