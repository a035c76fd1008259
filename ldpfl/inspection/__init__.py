"""``ldpfl inspect``: what a randomized client file (or a run directory of them) holds, and whether it is what it says.

From the bottom up:

* ``bits``    - the density of 1s per class of bit positions of packed-bit files, and the range a mechanism gives;
* ``floats``  - per-feature moments of float32 files (and PDPM's three outputs);
* ``privacy`` - the stored privacy report against the one its parameters resolve to;
* ``released`` - a ``stats:K`` file's released statistics: ε recomputed from its noise, its synthetic rows checked;
* ``file``    - one client file: structure, checksums, labels, statistics (``FileReport``);
* ``report``  - a file or a run directory: every file, the manifest, the release history (``Inspection``);
* ``text``    - the human-readable report; ``plot`` - the bit-density figure (matplotlib, loaded when drawn);
* ``cli``     - the click command over ``ldpfl.api.inspect_job``.

None of these modules imports TensorFlow, torch or jax (a test checks it), and matplotlib loads only when a figure
is drawn. (The package is not named ``ldpfl.inspect``: that name is the API function ``ldpfl.inspect``.)
"""
