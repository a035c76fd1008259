"""``ldpfl gather``: the exports of separate silos into one run directory (issue 16; ``ldpfl.contract.gather``).

Light at import time (click); no TensorFlow, no torch.
"""

from __future__ import annotations

from pathlib import Path

import click


@click.command("gather", context_settings={"max_content_width": 100})
@click.argument("sources", nargs=-1, required=True,
                type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="The new run directory (must not exist, or be empty).")
@click.option("--plan", "plan_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="The plan every source must carry  [default: the sources' plan.json, which must agree]")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
def gather_command(sources: tuple[Path, ...], out: Path, plan_path: Path | None, as_json: bool) -> None:
    """Gather the export directories of separate silos (SOURCES) into one run directory for federate.

    Each source is a silo's 'ldpfl export --plan ... --client-index i' directory. Every source is
    validated (manifest, sha256, structure); the silos must carry the same plan, have distinct client
    indices and form one run (same plan fingerprint, classes and widths; an error names the file that
    disagrees). The files are copied with the plan and a new manifest; on any error nothing is left.

    \b
    Example:
      ldpfl gather export_a export_b export_c --out run && ldpfl federate run && ldpfl inspect run
    """
    from ldpfl.contract.gather import gather_runs
    from ldpfl.contract.plan import read_plan

    plan = None if plan_path is None else read_plan(plan_path)
    result = gather_runs(sources, out, plan=plan)
    if as_json:
        from ldpfl.contract.jsonout import echo_json

        echo_json({"run_dir": str(result.run_dir), "plan_fingerprint": result.plan_fingerprint,
                   "files": [{"client_index": i, "source": str(p)} for i, p in result.files]})
        return
    click.echo(f"run directory  {result.run_dir}  ({len(result.files)} client files"
               + (f", plan {result.plan_fingerprint}" if result.plan_fingerprint else "") + ")")
    for index, path in result.files:
        click.echo(f"  client {index:>3}  {path}")
