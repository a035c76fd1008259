"""Peak memory of one step, measured in a fresh interpreter (``ru_maxrss``), for the size-hardening tests."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap


def peak_growth(script: str) -> tuple[str, float]:
    """Run ``script`` in a fresh interpreter after its imports; return its stdout and the peak RSS growth in MiB.

    The script's first line ``# --- measure`` splits imports (not counted) from the step measured.
    """
    imports, step = script.split("# --- measure\n")
    code = textwrap.dedent(f"""
        import resource, sys
        {textwrap.indent(textwrap.dedent(imports), '        ').strip()}
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
        {textwrap.indent(textwrap.dedent(step), '            ')}
        except Exception as error:
            print(type(error).__name__, str(error))
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print("GROWTH", (after - before) / 1024)
    """)
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    return "\n".join(lines[:-1]), float(lines[-1].split()[1])
