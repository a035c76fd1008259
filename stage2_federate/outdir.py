"""The federation's output directory: one run at a time, and no temporary file left behind.

``run_federation`` holds :func:`locked` on the output directory for the whole run (a ``filelock`` lock
that the system drops when the process dies, like the export's lock on its run directory), so
two runs never mix their outputs. Under the lock, any temporary file of an output (``.NAME.<pid>.<token>.tmp``,
see ``ldpfl.contract.atomic``) belongs to a process that died mid-write: :func:`remove_temporaries` deletes
them when a run starts (fresh or resumed) and when it completes. A half-written ``.checkpoint.pt.*.tmp``
holds generator states, which are seed-equivalent, so it must not outlive the run.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout

from ldpfl.common.errors import ParameterError
from ldpfl.contract.atomic import TMP_MARK

from .outputs import CHECKPOINT_PT, METRICS_JSON, OUTPUT_NAMES

LOCK_FILE = ".federate.lock"


def check_out_dir(out_dir: str | os.PathLike[str], *, resume: bool, overwrite: bool) -> None:
    """Refuse to start a run over one ``out_dir`` already holds, or to resume one it does not hold (every engine).

    Raises
    ------
    ParameterError
        ``out_dir`` holds a checkpoint or ``metrics.json`` and neither ``resume`` nor ``overwrite`` is given, or
        ``resume`` is given and it holds no checkpoint.
    """
    checkpoint = Path(out_dir) / CHECKPOINT_PT
    if not resume and not overwrite and (checkpoint.exists() or (Path(out_dir) / METRICS_JSON).exists()):
        raise ParameterError(f"{out_dir} already holds a federation run; continue it with `resume` or start "
                             "again with `overwrite`")
    if resume and not checkpoint.is_file():
        raise ParameterError(f"cannot resume: {checkpoint} does not exist (start without `resume`)")


def temporary_patterns() -> tuple[str, ...]:
    """Return the glob patterns of the temporary files of every output (``ldpfl.contract.atomic`` naming)."""
    return tuple(f".{name}.*{TMP_MARK}*" for name in OUTPUT_NAMES)


@contextlib.contextmanager
def locked(out_dir: str | os.PathLike[str]) -> Iterator[Path]:
    """Hold ``out_dir`` (created if needed) for one federation at a time; yield it.

    When the block fails and ``out_dir`` was created here and holds nothing but the lock, the directory
    is removed again (a refused run leaves nothing behind).

    Raises
    ------
    ParameterError
        Another process holds the lock (another ``ldpfl federate`` writes into ``out_dir``).
    """
    out_dir = Path(out_dir)
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    lock_path = out_dir / LOCK_FILE
    lock = FileLock(lock_path, blocking=False)
    try:
        lock.acquire()
    except Timeout:
        raise ParameterError(f"another ldpfl federate is writing into {out_dir}; wait for it to finish or "
                             "choose another `out_dir`") from None
    try:
        yield out_dir
    except BaseException:
        if created and {p.name for p in out_dir.iterdir()} == {LOCK_FILE}:
            with contextlib.suppress(OSError):
                lock_path.unlink()  # still held: no other run can take the lock of a file about to vanish
                out_dir.rmdir()
        raise
    finally:
        lock.release()


def remove_temporaries(out_dir: str | os.PathLike[str]) -> list[str]:
    """Delete the outputs' temporary files in ``out_dir`` (call it holding :func:`locked`); return their names."""
    removed = []
    for pattern in temporary_patterns():
        for path in sorted(Path(out_dir).glob(pattern)):
            if path.is_file() or path.is_symlink():
                path.unlink(missing_ok=True)
                removed.append(path.name)
    return removed


def clear_outputs(out_dir: str | os.PathLike[str]) -> list[str]:
    """With ``overwrite``: delete what a federation wrote in ``out_dir`` (its outputs only); return their names."""
    removed = []
    for name in OUTPUT_NAMES:
        path = Path(out_dir) / name
        if path.is_file():
            path.unlink()
            removed.append(name)
    return removed
