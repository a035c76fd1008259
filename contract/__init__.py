"""The file contract between the stages: what stage 1 writes and what stage 2 and inspect read.

One home, below both stages (mechanisms -> contract -> stage 1 / stage 2 -> ldpfl). Each module holds
one idea; import from the module, this package imports nothing:

* ``version``      - the installed package version;
* ``layout``       - the names inside a run directory (client files, manifest, partition, federation);
* ``atomic``       - temporary file, fsync, rename, fsync of the directory;
* ``digest``       - the sha256 of a file;
* ``jsonout``      - JSON-safe values, the refusal of seed keys, the CLI's ``--json`` printer;
* ``schema``       - the client file's schema: constants, ``FormatError``, ``ClientMetadata``;
* ``client_writer`` - writing a client file;
* ``client_reader`` - validating and reading one;
* ``manifest``     - ``manifest.json``: the list of finished files with their sha256;
* ``run_dir``      - the one run-directory validator (export, federate and inspect use it);
* ``torch_archive`` - the declared sizes of a torch archive (``model.pt``, ``checkpoint.pt``), checked before
  torch loads it.

Nothing here imports TensorFlow or torch.
"""
