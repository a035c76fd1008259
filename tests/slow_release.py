"""A ``sitecustomize`` that slows every client's file write by ``LDPFL_TEST_SLOW_RELEASE`` seconds.

Tests that interrupt an export mid-run (a killed worker, a dead Ray task) write it into a folder on the
children's ``PYTHONPATH``, so the kill lands while clients are still being written.
"""

import textwrap

SLOW_SITE = textwrap.dedent("""
    import os, time
    if os.environ.get("LDPFL_TEST_SLOW_RELEASE"):
        import ldpfl.stage1_features.export.worker as worker
        _write_split = worker.write_split

        def slow_write_split(*args, **kwargs):
            time.sleep(float(os.environ["LDPFL_TEST_SLOW_RELEASE"]))
            return _write_split(*args, **kwargs)

        worker.write_split = slow_write_split
""")
