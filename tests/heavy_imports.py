"""Run ``ldpfl`` commands in a fresh interpreter and report which heavy frameworks they imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("tensorflow", "torch", "keras", "jax", "matplotlib")


def heavy_modules_after(*argvs: list[str], timeout: float = 120) -> tuple[str, list[str]]:
    """Run each ``ldpfl`` argv (in one process, in order); return (stdout, heavy modules imported).

    Every command must exit 0.
    """
    code = (
        "import json, sys\n"
        "from ldpfl.cli import cli\n"
        f"for argv in {list(argvs)!r}:\n"
        "    try:\n"
        "        code = cli.main(argv, prog_name='ldpfl')\n"
        "    except SystemExit as done:\n"
        "        code = done.code\n"
        "    assert code in (0, None), (argv, code)\n"
        f"heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)\n"
        "print(json.dumps(heavy), file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return done.stdout, json.loads(done.stderr.strip().splitlines()[-1])
