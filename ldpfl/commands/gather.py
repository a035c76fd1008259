"""``ldpfl gather``: the exports of separate silos into one run directory (issue 16; ``ldpfl.contract.gather``).

A thin command over the API's ``ldpfl.gather`` (``ldpfl.api.gather_job``).

Light at import time (click); no TensorFlow, no torch.
"""

from __future__ import annotations

from pathlib import Path

import click

from ldpfl.api.gather_job import gather
from ldpfl.api.text import gather_text
from ldpfl.contract.jsonout import echo_json


@click.command("gather", context_settings={"max_content_width": 100})
@click.argument("sources", nargs=-1, required=True,
                type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="The new run directory (must not exist, or be empty).")
@click.option("--plan", "plan_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="The plan every source must carry  [default: the sources' plan.json, which must agree]")
@click.option("--dedupe", is_flag=True,
              help="Drop each silo's duplicated records (repeated training rows, repeated test rows, test rows that "
                   "repeat a training row) from the gathered copy; without it they are counted and reported.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
def gather_command(sources: tuple[Path, ...], out: Path, plan_path: Path | None, dedupe: bool, as_json: bool) -> None:
    """Gather the export directories of separate silos (SOURCES) into one run directory for federate.

    Each source is a silo's 'ldpfl export --plan ... --client-index i' directory. Every source is
    validated (manifest, sha256, structure); the silos must carry the same plan, have distinct client
    indices and form one run (same plan fingerprint, classes and widths; an error names the file that
    disagrees). The files are copied with the plan and a new manifest; on any error nothing is left.
    Each file's duplicated records are counted and reported; --dedupe drops them from the copy.

    \b
    Example:
      ldpfl gather export_a export_b export_c --out run && ldpfl federate run && ldpfl inspect run
    """
    result = gather(sources, out=out, plan=plan_path, dedupe=dedupe)
    if as_json:
        echo_json(result.to_dict())
    else:
        click.echo("\n".join([gather_text(result), *result.duplicate_lines()]))
