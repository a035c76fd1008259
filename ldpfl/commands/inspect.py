"""``ldpfl inspect``: a thin command over the API's ``ldpfl.inspect`` (``ldpfl.api.inspect_job``).

Imports neither TensorFlow nor torch; matplotlib loads only with ``--plot``, torch only to read a model
(``ldpfl.api.model_inspection``).
"""

from __future__ import annotations

from pathlib import Path

import click

from ldpfl.api.inspect_job import inspect
from ldpfl.api.model_inspection import inspect_model, is_model_path
from ldpfl.contract.jsonout import echo_json


@click.command("inspect")
@click.argument("path", type=click.Path(path_type=Path))  # the API refuses a missing path (exit 2)
@click.option("--json", "as_json", is_flag=True, help="Print the same content as JSON (with every file's details).")
@click.option("--details", is_flag=True, help="For a run directory, print each file's full section after the table.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, writable=True, path_type=Path),
              help="Also write a PNG: bit density over feature x bit position (for stats:K files: the released "
                   "class counts and the covariance's eigenvalues against the noise edge), label histograms per "
                   "client, and accuracy per round when federation/metrics.json exists.")
@click.option("--recompute", is_flag=True,
              help="Recompute a DP-SGD extractor's guarantee exactly (dp-accounting's PLD, seconds per file) instead "
                   "of checking the stored figure against a valid numpy bracket of it.")
def inspect_command(path: Path, as_json: bool, details: bool, plot_path: Path | None, recompute: bool) -> int:
    """Show what a randomized client file (or every file of a run directory) holds, and verify it.

    PATH is a client file (client_000.h5) or a run directory (manifest.json plus client files), or a model
    (model.pt, or its folder): a federation's global model, or a silo's personalized one with its method,
    whether it is LOCAL ONLY (epsilon = inf if shipped) or may be released, and its epsilon.

    \b
    Checks: the HDF5 schema and structure (before any data is read), the sha256 of each file
    against manifest.json, every data chunk through HDF5's Fletcher-32 checksum, the stored
    privacy report against the mechanism's parameters, the labels against the stored histograms,
    and, for packed bits, the density of 1s per class of bit positions (all, even, odd, each digit
    sign, 2^3 ... 2^-5) against the range the mechanism can produce and, when the file stores
    /stats/input_bit_density, the density it predicts (flagged beyond 5 binomial standard errors).
    A stats:K file (released statistics): epsilon under both relations recomputed from its noise
    scales against the recorded epsilon, and its synthetic rows regenerated from the recorded
    statistics and public key.

    \b
    Prints: metadata; nominal and exact epsilon side by side (per record and per bit/coordinate);
    rows and label histogram per split; bit or float statistics. A run directory gives one table
    across clients that shows errors and mismatches.

    \b
    Exit status: 0 when everything checks out; 1 when a file fails or anything is flagged;
    2 for a usage error (no such path, a directory without client files).

    \b
    Examples:
      ldpfl inspect runs/mnist/client_000.h5
      ldpfl inspect runs/mnist --details --plot mnist.png
      ldpfl inspect runs/mnist --json > report.json
    """
    if is_model_path(path):  # a model.pt (a federation's or a silo's personalized one), or its folder
        if plot_path is not None or recompute or details:
            raise click.UsageError("--plot, --recompute and --details apply to client files, not to a model")
        model = inspect_model(path)
        if as_json:
            echo_json(model.to_dict())
        else:
            click.echo(model.format_text())
        return model.exit_code
    found = inspect(path, plot=plot_path, recompute=recompute)
    result = found.report
    single_error = result.kind == "file" and result.files[0].error is not None
    if as_json:
        echo_json(found.to_dict())
    elif not single_error:
        click.echo(found.format_text(details=details))
    if found.plot is not None:
        click.echo(f"wrote {found.plot}", err=as_json)
    elif plot_path is not None:
        click.echo(f"no plot written to {plot_path}: no file could be read", err=True)
    for line in result.error_lines():
        click.echo(f"Error: {' '.join(line.split())}", err=True)
    return found.exit_code
