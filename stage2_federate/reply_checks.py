"""What the coordinator accepts from a silo: every reply is checked before the round loop uses it (issue 31).

The server trusts no silo. Both engines' replies pass here: the round loop (``loop.run_rounds``) calls
:func:`check_training` on each round's training replies and :func:`check_evaluations` on each evaluation's
sums, so a strategy only ever sees well-formed, finite arrays of the model's shape, and a reported figure only
ever sums what is in range. A reply is refused when:

* its upload is not a 1-D floating-point array (float32, or float64) of exactly the model's parameter count,
  holds a value that is not finite, or one beyond float32's range (the model is float32);
* its update has an L2 norm above the round's bound. The update is ``upload - global`` for a parameters target
  and the upload itself for an update target. The bound is ``max_update_norm`` when given; by default it is
  :data:`DEFAULT_NORM_FACTOR` × the *lower median* of the update norms of the round's well-formed uploads (the
  ⌈n/2⌉-th smallest: with two silos the smaller one, so one silo alone never sets the scale), times
  max(1, σ_i / the median σ) for a silo whose perturbation adds more noise than the others' (σ_i of its
  mechanism, known to the server: an honest silo with a smaller ε is not refused for its noise; where the silo's
  training adds noise of its own, the scale its training component states, ``SiloTraining.reply_noise``, e.g.
  σ·C / (q·n) for noisy clipped gradients: a small silo's update is noisier), and, where its local steps grow
  with its rows, times max(1, n_i / the median n) for a silo with more training rows than the others' (more local
  steps move its parameters further). With one upload the default refuses nothing;
* its training metrics are out of range: the accuracy outside [0, 1], or the loss negative; with an upload,
  neither may be infinite (a silo that sent no upload, its training diverged, may report ∞). NaN means
  "not measured" (a silo whose training reports none, e.g. Poisson batches that were all empty) and is left out
  of the round's mean;
* its evaluation sums are out of range: the rows other than the silo's test rows as the coordinator knows
  them (its file, or its manifest-checked summary), the correct predictions not an integer in [0, rows], the
  summed loss not finite or negative. A clean-test evaluation (``eval_clean``) covers the test split's rows too,
  except for a silo whose file is a ``stats:K`` release: its file shares no test row, and the rows of its clean
  test file (kept on the silo) are not known to the server, which then checks the sums but not their count.

A refused silo is **named** with the server's reason (the round's ``rejected``, a note), left out of the round
(its upload is not aggregated, its metrics and sums are not counted) and, where a failure policy is set
(``min-clients-per-round``), does not count as having trained. Every note is the server's (:func:`server_note`):
nothing a silo writes is printed or stored.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ldpfl.mechanisms.base import UPDATE

from .round_record import ClientEvaluation, Rejection, SplitSums
from .rounds import EXCLUDED_REASONS, ClientResult

DEFAULT_NORM_FACTOR = 10.0
"""The default update-norm bound is this many times the lower median update norm of the round's uploads."""

FLOAT32_MAX = float(np.finfo(np.float32).max)
UPLOAD_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


@dataclass(frozen=True)
class ReplyLimits:
    """What the server knows before any reply: the model's size, the upload target, the silos' σ_i and test rows.

    ``max_update_norm``: the update-norm bound (None: :data:`DEFAULT_NORM_FACTOR` × the round's lower median).
    """

    dim: int
    target: str
    max_update_norm: float | None = None
    noise_scales: Mapping[int, float | None] = field(default_factory=dict)
    test_rows: Mapping[int, int] = field(default_factory=dict)
    train_rows: Mapping[int, int] = field(default_factory=dict)  # scales the default bound (empty: not scaled)
    # The rows of a silo's clean test file (``eval_clean``) where they are not its test split's: None, not known to
    # the server (a stats:K release shares no test row; its clean test records stay on the silo).
    clean_rows: Mapping[int, int | None] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckedTraining:
    """A round's training replies after the checks: those accepted, and the silos refused with the reason."""

    results: tuple[ClientResult, ...]
    rejected: tuple[Rejection, ...]

    @property
    def notes(self) -> tuple[str, ...]:
        """The server's note of each refused silo."""
        return tuple(rejection_note(r) for r in self.rejected)


def rejection_note(rejection: Rejection) -> str:
    """Return the server's one-line note on a refused silo (``client i: rejected, reason``)."""
    client, reason = rejection
    return f"client {client}: rejected, {reason}"


def server_note(result: ClientResult) -> str | None:
    """Return the server's note on an accepted result: None with an upload, else why it has none.

    A result's own note is kept only when it is one of :func:`rounds.client_step`'s (``EXCLUDED_REASONS``) for
    that very client; any other text (a silo's, which might frame another silo) is replaced by the server's.
    """
    if result.upload is not None:
        return None
    if result.note in {f"client {result.client}: {reason}" for reason in EXCLUDED_REASONS}:
        return result.note
    return f"client {result.client}: excluded, it sent no upload"


def upload_problem(upload: object, dim: int) -> str | None:
    """Return why ``upload`` is not a well-formed upload of a ``dim``-parameter model, or None when it is."""
    if not isinstance(upload, np.ndarray):
        return f"its upload is not an array (got {type(upload).__name__})"
    if upload.dtype not in UPLOAD_DTYPES:
        return f"its upload has dtype {upload.dtype}, not float32"
    if upload.shape != (dim,):
        return f"its upload has shape {upload.shape}, the model has ({dim},) parameters"
    bad = int(np.count_nonzero(~np.isfinite(upload)))
    if bad:
        return f"its upload holds {bad} value(s) that are not finite (NaN or inf)"
    if dim and float(np.max(np.abs(upload))) > FLOAT32_MAX:
        return "its upload holds values beyond float32's range"
    return None


def metrics_problem(loss: object, accuracy: object, *, uploaded: bool) -> str | None:
    """Return why a silo's training metrics are out of range, or None (see the module docstring)."""
    try:
        loss, accuracy = float(loss), float(accuracy)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "its training metrics are not numbers"
    if uploaded and (math.isinf(loss) or math.isinf(accuracy)):
        return f"its training metrics are not finite (loss {loss!r}, accuracy {accuracy!r})"
    if loss < 0:
        return f"its training loss {loss!r} is negative"
    if not math.isnan(accuracy) and not 0.0 <= accuracy <= 1.0:
        return f"its training accuracy {accuracy!r} lies outside [0, 1]"
    return None


def update_norm(upload: np.ndarray, global_vector: np.ndarray, target: str) -> float:
    """Return the L2 norm of a well-formed upload's update (the upload for an update target, else upload − global)."""
    update = upload.astype(np.float64) if target == UPDATE else upload.astype(np.float64) - global_vector
    return float(np.linalg.norm(update))


def lower_median(values: Sequence[float]) -> float:
    """Return the ⌈n/2⌉-th smallest of ``values`` (the median for odd n, the lower middle value for even n)."""
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


def norm_bounds(norms: Mapping[int, float], limits: ReplyLimits) -> dict[int, float]:
    """Return each silo's update-norm bound this round (``max_update_norm``, or the default of the module docstring)."""
    if limits.max_update_norm is not None:
        return {cid: float(limits.max_update_norm) for cid in norms}
    if not norms:
        return {}
    base = DEFAULT_NORM_FACTOR * lower_median(list(norms.values()))
    return {cid: base * _above_median(limits.noise_scales, cid, norms) * _above_median(limits.train_rows, cid, norms)
            for cid in norms}


def _above_median(values: Mapping[int, float | int | None], cid: int, round_clients: Mapping[int, float]) -> float:
    """Return max(1, v_cid / the lower median of the round's known positive v), 1 when unknown."""
    known = [float(v) for c in round_clients if (v := values.get(c)) is not None and v > 0]
    mine = values.get(cid)
    if not known or mine is None or mine <= 0:
        return 1.0
    return max(1.0, float(mine) / lower_median(known))


def check_training(results: Sequence[ClientResult], global_vector: np.ndarray, limits: ReplyLimits
                   ) -> CheckedTraining:
    """Check every training reply of a round (shape, dtype, finiteness, metrics, then the update-norm bound).

    Returns the accepted results (in their order) and the refused silos with the server's reason.
    """
    accepted: list[ClientResult] = []
    rejected: list[Rejection] = []
    for result in results:
        problem = metrics_problem(result.loss, result.accuracy, uploaded=result.upload is not None)
        if problem is None and result.upload is not None:
            problem = upload_problem(result.upload, limits.dim)
        if problem is None:
            accepted.append(dataclasses.replace(result, note=server_note(result)))
        else:
            rejected.append((result.client, problem))
    norms = {r.client: update_norm(r.upload, global_vector, limits.target) for r in accepted if r.upload is not None}
    bounds = norm_bounds(norms, limits)
    over = {cid: norm for cid, norm in norms.items() if not norm <= bounds[cid]}
    for cid, norm in over.items():
        how = "--max-update-norm" if limits.max_update_norm is not None else \
            f"{DEFAULT_NORM_FACTOR:g} x the round's median"
        rejected.append((cid, f"its update norm {norm:.4g} exceeds the bound {bounds[cid]:.4g} ({how})"))
    kept = tuple(r for r in accepted if r.client not in over)
    order = {r.client: k for k, r in enumerate(results)}
    return CheckedTraining(kept, tuple(sorted(rejected, key=lambda r: order.get(r[0], 0))))


def sums_problem(sums: SplitSums, rows: int | None, what: str) -> str | None:
    """Return why one split's evaluation sums are out of range (``rows``: the coordinator's count), or None."""
    loss_sum, correct, count = sums.loss_sum, sums.correct, sums.rows
    if not all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in (correct, count)):
        return f"its {what} evaluation counts are not integers (correct {correct!r}, rows {count!r})"
    if rows is not None and count != rows:
        return f"its {what} evaluation covers {count} rows, its test split holds {rows}"
    if count < 0 or not 0 <= correct <= count:
        return f"its {what} evaluation claims {correct} correct of {count} rows"
    if not (isinstance(loss_sum, float | int | np.floating) and math.isfinite(loss_sum) and loss_sum >= 0):
        return f"its {what} evaluation loss sum {loss_sum!r} is not finite and >= 0"
    return None


def check_evaluations(reports: Sequence[ClientEvaluation], limits: ReplyLimits, *, clean: bool
                      ) -> tuple[tuple[ClientEvaluation, ...], tuple[Rejection, ...]]:
    """Check every silo's evaluation sums; return those accepted and the refused silos with the reason.

    ``clean``: the run evaluates the clean test files too (``eval_clean``), which hold the test split's rows (or,
    for a silo in ``limits.clean_rows``, those rows; None: not checked).
    """
    accepted, rejected = [], []
    for report in reports:
        rows = limits.test_rows.get(report.client)
        problem = sums_problem(report.test, rows, "test")
        if problem is None and clean:
            clean_rows = limits.clean_rows.get(report.client, rows)
            problem = ("it sent no clean-test evaluation" if report.clean is None
                       else sums_problem(report.clean, clean_rows, "clean-test"))
        if problem is None:
            accepted.append(report)
        else:
            rejected.append((report.client, problem))
    return tuple(accepted), tuple(rejected)
