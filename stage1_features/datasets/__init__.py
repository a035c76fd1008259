"""The registered benchmark datasets of stage 1, each pooled into one in-memory ``Dataset``.

* ``errors``       - ``DatasetError``: a missing or corrupt dataset file (the bottom of this package);
* ``file_readers`` - the IDX and CIFAR-10 batch readers, bounded against corrupt files;
* ``loaders``      - the ``Dataset`` record, where files are looked for, and one loader per registered dataset.
"""
