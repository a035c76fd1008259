"""A silo's own data (issue 16): image folders, ``.npz``, HDF5, CSV and Parquet read into one ``Dataset``.

From the bottom up:

* ``errors``  - ``DataError`` (a ``DatasetError`` naming the file and the problem) and how messages list names;
* ``formats`` - the formats read and the options that go with them;
* ``limits``  - the size, memory and file-kind checks done before anything is read;
* ``images``, ``arrays``, ``tables`` - one reader per family; ``labels`` maps label values to classes;
* ``load``    - ``load_own_data``: picks the reader, checks, scales and returns an ``OwnDataset``.
"""
