"""``ldpfl personalize``: a silo's own model after a federation, made on the silo (issue 41).

A thin command: it maps the flags to ``ldpfl.api.personalize_job.personalize`` and prints the result. Light at
import time (torch loads inside the job).
"""

from __future__ import annotations

from pathlib import Path

import click

from ldpfl.api.fields import function_defaults
from ldpfl.api.personalize_job import personalize
from ldpfl.contract.jsonout import echo_json
from ldpfl.stage2_federate.personalize.run import summary_lines
from ldpfl.stage2_federate.personalize.settings import CLEAR_LR, METHODS

from .options import options

_DEFAULTS = function_defaults(personalize)
_EPILOG = """\b
Examples:
  ldpfl personalize runs/silos --client-index 0 --method clear
  ldpfl personalize runs/silos --client-index 0 --method dp --steps 30 --max-epsilon 3.5 --json
  ldpfl personalize runs/silos --client-index 0 --method dp --proximal 0.03
  ldpfl personalize runs/silos --client-index 0 --method interpolate --seed 1
"""

_with_options = options(
    click.option("--client-index", type=click.IntRange(min=0), required=True,
                 help="The silo: client_NNN.h5 of RUN_DIR."),
    click.option("--method", type=click.Choice(METHODS), required=True,
                 help="clear: fine-tune on the silo's clean training records without DP (a LOCAL-ONLY model: "
                      "epsilon = inf if shipped). dp: DP-SGD fine-tuning that continues the silo's own accountant "
                      "(the federation's sigma, q and clip; the silo's epsilon covers both; the model may be "
                      "released). interpolate: w * global + (1 - w) * the silo's alone model (a linear head trained "
                      "in house), w chosen on the silo's training records by cross-fitting (LOCAL-ONLY)."),
    click.option("--model", "model_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
                 help="The global model  [default: RUN_DIR/federation/model.pt; --method dp reads metrics.json "
                      "beside it]"),
    click.option("--resume", type=click.Path(file_okay=False, path_type=Path), default=None,
                 help="--method dp: continue an earlier DP personalization of this silo (its folder): its model "
                      "and its accountant. Another silo's accountant is refused."),
    click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                 help="Output folder (model.pt, personalization.json)  [default: "
                      "RUN_DIR/personalized/client_NNN.METHOD]"),
    click.option("--overwrite", is_flag=True, help="Replace a personalization already in the output folder."),
    click.option("--epochs", type=click.IntRange(min=1), default=_DEFAULTS["epochs"], show_default=True,
                 help="clear, interpolate: epochs of in-house training (Adam over shuffled batches)."),
    click.option("--batch-size", type=click.IntRange(min=1), default=_DEFAULTS["batch_size"], show_default=True,
                 help="clear, interpolate: records per batch."),
    click.option("--lr", type=float, default=None,
                 help=f"Learning rate  [default: Adam {CLEAR_LR:g} in house; SGD 4 (the federation's DP-SGD "
                      "rate) for dp]"),
    click.option("--steps", type=click.IntRange(min=1), default=_DEFAULTS["steps"], show_default=True,
                 help="dp: DP-SGD steps (Poisson batches at the federation's rate q)."),
    click.option("--momentum", type=float, default=_DEFAULTS["momentum"], show_default=True,
                 help="dp: SGD momentum over the fine-tuning's steps, in [0, 1)."),
    click.option("--proximal", type=float, default=_DEFAULTS["proximal"], show_default=True,
                 help="dp: Ditto's lambda >= 0, a tie lambda/2 * |theta - global|^2 to the global model (a proximal "
                      "step after each noisy step; no record involved, so the same epsilon): larger keeps more of "
                      "what the other silos taught. Not with --resume."),
    click.option("--max-epsilon", type=float, default=None,
                 help="dp: refuse, before training, a fine-tuning that takes the silo's epsilon (federation plus "
                      "fine-tuning, at the federation's delta and neighbouring relation) past this."),
    click.option("--folds", type=click.IntRange(min=2), default=_DEFAULTS["folds"], show_default=True,
                 help="interpolate: the weight is chosen over the training records by cross-fitting, each record "
                      "scored by an alone model trained on the other folds; the test records never choose."),
    click.option("--weights", type=click.IntRange(min=2), default=_DEFAULTS["weights"], show_default=True,
                 help="interpolate: weights tried, evenly from 0 (alone) to 1 (global)."),
    click.option("--seed", type=click.IntRange(min=0), default=None,
                 help="Reproducible randomness (testing only: no privacy against anyone who knows the seed); "
                      "default: the OS CSPRNG."),
    click.option("--threads", type=click.IntRange(min=1), default=None, help="CPU threads (torch)."),
    click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON."),
    click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary."))


@click.command("personalize", epilog=_EPILOG, context_settings={"max_content_width": 100})
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@_with_options
def personalize_command(run_dir: Path, client_index: int, method: str, model_path: Path | None, resume: Path | None,
                        out_dir: Path | None, overwrite: bool, epochs: int, batch_size: int, lr: float | None,
                        steps: int, momentum: float, proximal: float, max_epsilon: float | None, folds: int,
                        weights: int, seed: int | None, threads: int | None, as_json: bool, quiet: bool) -> None:
    """Personalize the federated model on one silo, on its own machine, from its own records.

    RUN_DIR is the silo's export directory; the global model is RUN_DIR/federation/model.pt unless --model.
    The silo trains on its clean records: a local-only client file (ldpfl export --local-only) itself, or, for a
    randomized or released-statistics (stats:K) file, the silo's local-only clean file client_NNN.local.h5 with
    training records, else its own data rerun through its export's pipeline (the run's data and stored split;
    a stats:K release projected and clipped as released). dp is refused for a stats:K file (no DP-SGD
    accountant covers the silo's records).

    The output reports the silo's own held-out accuracy, overall and per class, of the global and the
    personalized model. Those figures are computed from its clear test records and are NOT released: keep them
    on the silo. A clear or interpolated model is LOCAL ONLY (epsilon = inf if shipped; ldpfl predict says so).

    Refused in one line, with nothing written: a model whose shape or feature space is not the file's, a file
    from another run, a local-only or personalized model as the global model, a dp fine-tuning past
    --max-epsilon or without the silo's DP-SGD accountant, --resume of another silo's accountant.
    """
    result = personalize(run_dir, client_index=client_index, method=method, model=model_path, resume=resume,
                         out=out_dir, overwrite=overwrite, epochs=epochs, batch_size=batch_size, lr=lr, steps=steps,
                         momentum=momentum, proximal=proximal, max_epsilon=max_epsilon, folds=folds, weights=weights,
                         seed=seed, threads=threads, progress_bars=not quiet and not as_json)
    if as_json:
        echo_json(result.to_dict())
    elif not quiet:
        for line in summary_lines(result.summary):
            click.echo(line)
