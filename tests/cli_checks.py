"""Checks of the `ldpfl` command line shared by the tests: in-process runs and the one-line `Error: ...`."""

from __future__ import annotations

import functools
from collections.abc import Callable

from click.testing import CliRunner, Result

from ldpfl.cli import cli


def run(*args: object) -> Result:
    """Invoke `ldpfl` in-process with ``args`` (each passed as its string)."""
    return CliRunner().invoke(cli, [str(a) for a in args])


def command(*words: str) -> Callable[..., Result]:
    """Return a runner of `ldpfl WORDS... ARGS...` (``command("federate")("--help")``)."""
    return functools.partial(run, *words)


def ok(result: Result) -> Result:
    """Assert that the command succeeded; return its result."""
    assert result.exit_code == 0, result.output
    return result


def assert_usage_error(result: Result, *fragments: str) -> None:
    """Assert a usage error (exit 2): one non-blank line of output, `Error: ...` holding every fragment."""
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def one_error_line(result: Result) -> str:
    """Assert a usage error (exit 2) whose whole output is one `Error:` line, no traceback; return it."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), result.output
    return lines[0]


def stderr_error_line(result: Result, code: int = 2) -> str:
    """Assert exit ``code`` and one `Error: ...` line on stderr, no traceback; return that line."""
    assert result.exit_code == code, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]
