"""The stage-1 batch job behind ``ldpfl export``: LDPFL Algorithm 1 lines 1-10, client by client.

For each client i (Sections III-A/B, IV-A/B/C/D):

1. its share of the pooled dataset (``partition.make_partition``; IV-B: N_h equal groups), drawn once
   for the whole run from the root stream and stored in ``partition.npz``;
2. a 10 % hold-out test split (IV-C) from the client's own stream;
3. the client CNN (Fig. 3 or 4) trained on the training split (IV-C), its accuracy on the hold-out;
4. the flatten-layer output of every train and test sample (Algorithm 1 line 6);
5. fixed-point encoding (eq. 14, m integer and n fraction bits), randomization by the chosen mechanism
   (UER: Theorem 2, eq. 17), bit packing, streamed into ``client_XXX.h5`` row batch by row batch
   (Algorithm 1 lines 7-10), written to a temporary name and renamed when complete;
6. ``manifest.json`` rewritten by this (parent) process after every finished client.

Randomness: one root ``SeedSequence`` (the user's ``--seed`` or the OS CSPRNG). Client i uses
``randomness.child_sequences(N)[i]`` (the stream of ``randomness.child_generators(N)[i]``) and splits it
with ``Generator.spawn`` into three independent streams: hold-out split, CNN training, randomization.
So a client's output does not depend on which process runs it or in which order (``--clients-parallel``
gives the same files as a sequential run), and the randomization draws do not depend on how much
randomness the training consumed. Without a seed every stream is the secure generator (AES-CTR, or ChaCha20
without AES-NI), with one PCG64 (``mechanisms.randomness``). The seed itself is never written anywhere; only
the mode and the generator's name are.

Decisions (documented here because the paper is silent):

* **Resuming never randomizes a finished client again**: releasing a second randomization of the same
  records spends their privacy budget a second time. Listed files must verify (sha256, structure);
  a client file present under its final name but missing from the manifest (a crash between the rename
  and the manifest write) is validated and adopted; one that fails validation is an error that asks for
  ``--overwrite``. See ``ldpfl.stage1_features.export.run_dir``.
* **On a Ray cluster** (``--ray-address``) each client is a Ray task whose files come back to this process,
  which writes them as it writes the manifest (``ldpfl.stage1_features.export.ray_executor``).
* **Parallel workers die with the export** (``--clients-parallel``): a killed export leaves no worker
  writing behind it, a rerun waits for any that linger, and no rename replaces a client file
  (``ldpfl.stage1_features.export.worker_guard``).
* **The partition is stored** (``partition.npz``: each client's row indices in the pooled dataset, no
  seed), because a resumed run without ``--seed`` could not redraw it: redoing client 2 on a fresh
  partition would give it records that client 0 already released.
* **--limit** draws that many records uniformly from the pool (root stream) before partitioning.
* **Float mechanisms** (pdpm, gaussian, ...) randomize the float32 flatten features; their files record
  m = n = 0 (no fixed-point encoding) and r float columns.
* Mechanism parameters default to IV-D (ε = 0.5, α = 10, m = 4, n = 5). A default that a mechanism does
  not take is dropped; a non-default value it does not take is an error.
* **CNN reproducibility**: Keras' global seed is set from the client's training stream in the process
  that trains it, and training then is bit-reproducible for a given ``--seed``, machine, TensorFlow build
  and TensorFlow thread count (checked across processes). Another thread count rounds differently (a
  sequential export on 2 cores, 2 threads, differed from ``--clients-parallel 2``, 1 thread each, in
  0.05-1.7 % of the feature values), so **a seed fixes the threads too** (issue 40): a seeded export
  trains and runs every client's CNN with ``keras_backend.SEEDED_THREADS`` (1) intra-op and inter-op
  threads, sequentially, in ``--clients-parallel`` workers and in Ray tasks alike, and writes the same files
  on each (tested). A sequential one sets them in this process where TensorFlow has not started yet (they
  stay for the life of the process); where it already runs with other threads, the clients train in one
  spawned worker instead. Without a seed each worker keeps cpu_count // K threads (Ray:
  ``ray_cpus_per_client``) and a sequential export the backend's default. A seed cannot fix the rounding
  of a GPU, of another Keras backend, TensorFlow build or CPU instruction set (a Ray node of another kind).
"""


from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ldpfl.contract.digest import sha256_file
from ldpfl.contract.layout import MANIFEST_NAME, PARTITION_FILE
from ldpfl.contract.manifest import FileRecord, write_manifest
from ldpfl.contract.plan import PLAN_FILE, write_plan
from ldpfl.contract.version import package_version
from ldpfl.stage1_features.export import from_models
from ldpfl.stage1_features.export.config import (
    DENSITY_WARNING,
    DP_SAVED_MODEL_WARNING,
    LOCAL_ONLY_WARNING,
    NOT_PRIVATE_WARNING,
    SAVED_MODEL_WARNING,
    ExportConfig,
)
from ldpfl.stage1_features.export.errors import ExportError
from ldpfl.stage1_features.export.manifest import (
    client_guarantees,
    kept_local_records,
    manifest_info,
    with_file_histograms,
)
from ldpfl.stage1_features.export.plan import ExportPlan, make_client_partition, make_plan
from ldpfl.stage1_features.export.ray_executor import run_on_ray
from ldpfl.stage1_features.export.release import noise_variance
from ldpfl.stage1_features.export.results import ClientSummary, ExportResult
from ldpfl.stage1_features.export.run_dir import (
    TOOL,
    clear_outputs,
    existing_clients,
    locked,
    prepare_run_dir,
    remove_stale,
)
from ldpfl.stage1_features.export.statistics_release import check_clients, is_statistics_release
from ldpfl.stage1_features.export.stored import load_holdouts, save_partition
from ldpfl.stage1_features.export.worker import (
    ClientOutcome,
    ClientTask,
    client_holdout,
    export_client,
    init_worker,
    progress_bar,
)
from ldpfl.stage1_features.models import cnn, dp_training
from ldpfl.stage1_features.models.keras_backend import (
    SEEDED_THREADS,
    keras_backend,
    pin_threads,
    select_device,
    select_keras_backend,
)


def run_export(config: ExportConfig, out_dir: str | os.PathLike[str], *, progress: bool = True,
               on_progress: Callable[[int, int], None] | None = None) -> ExportResult:
    """Run (or resume) the export of ``config`` into ``out_dir`` (LDPFL Algorithm 1 lines 1-10).

    Parameters
    ----------
    config : ExportConfig
        What to export; ``config.seed`` is used for the randomness and never written.
    out_dir : path
        The run directory (created if needed). An existing export there is resumed: verified clients
        are kept, missing ones are done; ``config.overwrite`` starts over.
    progress : bool
        tqdm bars on stderr (per client, per epoch, per release).
    on_progress : callable, optional
        Called with (clients finished, clients to export) once the run directory is ready (the verified
        clients count as finished) and after each client's file is listed in the manifest.

    Returns
    -------
    ExportResult
        Run directory, manifest path, privacy report, one ``ClientSummary`` per client and each client
        file's ``release_guarantee``.

    Raises
    ------
    ValueError
        ``ExportError`` / ``DatasetError`` / parameter errors: bad input, or a run directory that cannot
        be resumed (the message says what to do). Raised before anything is written where possible.
    OSError
        I/O failures while writing. On any failure no half-written client file carries a final name,
        and the manifest lists finished clients only.
    """
    started = time.perf_counter()
    if (cnn.is_cnn(cnn.resolve_extractor(config.extractor, config.dataset)) or config.from_models is not None
            or config.dp_budget() is not None):
        assert config.keras_backend is not None  # filled in by ExportConfig
        select_keras_backend(config.keras_backend)  # before Keras is imported here or in spawned workers
        select_device(keras_backend(), config.device)
        if config.seed is not None and config.dp_budget() is not None and config.ray_address is None:
            pin_threads(SEEDED_THREADS)  # make_plan builds the DP CNN, and XLA takes its threads as jax loads
    plan = make_plan(config)
    config = plan.config  # from_models: with the source run's data settings
    source = plan.source
    run_dir = Path(out_dir)
    if source is not None and run_dir.resolve() == source.run_dir.resolve():
        raise ExportError("`from_models` releases into a new run directory: `out` is the source run itself")
    if source is not None:  # drawn and checked before anything is written, so a bad split writes nothing
        fresh_clients, fresh_desc, fresh_holdouts = from_models.source_partition(source, plan)
    else:
        fresh_clients, fresh_desc = make_client_partition(plan)
        fresh_holdouts = fresh_holdouts_of(plan, fresh_clients)
    statistics_notes = []
    if is_statistics_release(plan.release):  # issue 40: δ < 1/n of every client, before anything is written
        statistics_notes = check_clients(plan.spec, plan.dataset.y, {i: fresh_holdouts[i][0]
                                                                     for i in config.exported_clients()},
                                         int(plan.dataset.num_classes))
    run_dir = prepare_run_dir(out_dir)
    notes = []
    if source is not None:
        notes.append(from_models.rerelease_warning(source, plan))
    if not plan.privacy.private:
        notes.append(NOT_PRIVATE_WARNING.format(mechanism=config.mechanism))
    if config.save_models:
        notes.append(SAVED_MODEL_WARNING if config.dp_budget() is None else DP_SAVED_MODEL_WARNING)
    if config.store_input_density:
        notes.append(DENSITY_WARNING)
    if config.local_only:
        notes.append(LOCAL_ONLY_WARNING)
    notes += statistics_notes
    with locked(run_dir):
        remove_stale(run_dir)
        if config.overwrite:
            clear_outputs(run_dir)
        kept, clients, partition_desc = existing_clients(run_dir, plan)
        holdouts = fresh_holdouts if clients is None else load_holdouts(run_dir, config.clients)
        if config.plan is not None:  # each silo's run directory carries the shared plan (issue 16)
            write_plan(config.plan, run_dir / PLAN_FILE)
        if clients is None:
            clients, partition_desc = fresh_clients, fresh_desc
            partition_sha = save_partition(run_dir, clients, holdouts)
        else:
            partition_sha = sha256_file(run_dir / PARTITION_FILE)
        run_info = {
            "tool": TOOL, "dataset": plan.dataset.name, "client_count": config.clients,
            "randomness": plan.randomness.mode, "generator": plan.randomness.generator_name,
            "package_version": package_version(),
            "config": config.public_dict(), "fingerprint": plan.fingerprint(), "extractor": plan.extractor,
            "features": plan.features, "feature_format": plan.feature_format, "release": str(plan.release),
            "from_models": None if source is None else str(source.run_dir.resolve()),
            "feature_width": plan.feature_width, "mechanism": config.mechanism,
            "privacy_report": plan.privacy.to_dict(), "training": _training_info(config),
            "partition": partition_desc, "partition_file": {"path": PARTITION_FILE, "sha256": partition_sha},
            "plan_fingerprint": None if config.plan is None else config.plan.fingerprint,
        }
        if plan.extractor_options:  # scatter's J and L
            run_info["extractor_options"] = dict(plan.extractor_options)
        if config.local_only:  # files that must never leave the silo
            run_info.update(local_only=True, local_only_note=LOCAL_ONLY_WARNING)
        # each entry lists its file's label counts (the file's released attribute: nothing new leaves the silo)
        records: dict[int, FileRecord] = {i: with_file_histograms(run_dir, rec) for i, (rec, _) in kept.items()}
        summaries = {i: summary for i, (_, summary) in kept.items()}
        local_records = kept_local_records(run_dir, kept) if config.keep_clean_test else {}

        def manifest() -> None:
            info = manifest_info(run_info, plan, records, local_records, run_dir)
            write_manifest(run_dir, list(records.values()), info)

        manifest()  # lists adopted files at once
        total = len(config.exported_clients())
        if on_progress is not None:
            on_progress(len(records), total)
        pending = [i for i in config.exported_clients() if i not in kept]
        tasks = [_task(plan, run_dir, i, clients[i], partition_desc or {}, progress,
                       None if holdouts is None else holdouts[i]) for i in pending]

        def finished(outcome: ClientOutcome) -> None:
            records[outcome.index] = outcome.record
            if outcome.local_record is not None:
                local_records[outcome.index] = outcome.local_record
            summaries[outcome.index] = ClientSummary(
                outcome.index, dict(outcome.record.rows), outcome.local_accuracy, outcome.record.path,
                outcome.record.sha256,
                "new", outcome.model_file, round(outcome.seconds, 3),
                None if outcome.train_samples_per_s is None else round(outcome.train_samples_per_s, 1))
            manifest()  # the parent alone writes it
            if on_progress is not None:
                on_progress(len(records), total)

        bar = progress_bar(total=total, initial=len(kept), desc="clients", unit="client",
                           position=0, disable=not progress)
        with bar:
            if config.ray_address is not None and tasks:  # each client a Ray task; files come back here
                run_on_ray(tasks, config, plan, finished, bar)
            elif config.clients_parallel > 1 and len(tasks) > 1:
                _run_parallel(tasks, plan, finished, bar, min(config.clients_parallel, len(tasks)))
            elif tasks and plan.seeded_threads is not None and not pin_threads(plan.seeded_threads):
                # this process's TensorFlow already runs with other threads: a fresh worker has the seed's (issue 40)
                _run_parallel(tasks, plan, finished, bar, 1)
            else:
                for task in tasks:
                    bar.set_postfix_str(f"client {task.index}")
                    finished(export_client(task, plan.dataset))
                    bar.update(1)
        guarantees = client_guarantees(run_dir, records)
    return ExportResult(run_dir, run_dir / MANIFEST_NAME, plan.dataset.name, plan.extractor, config.mechanism,
                        plan.feature_format, plan.features, plan.feature_width, plan.privacy,
                        plan.randomness.mode, [summaries[i] for i in sorted(summaries)],
                        time.perf_counter() - started, tuple(notes), str(plan.release), plan.label_release,
                        guarantees)


def _task(plan: ExportPlan, run_dir: Path, index: int, indices: np.ndarray, partition: Mapping[str, Any],
          progress: bool, holdout: tuple[np.ndarray, np.ndarray] | None) -> ClientTask:
    config = plan.config
    streams = plan.randomness.child_sequences(config.clients)  # client i: child stream i, in any process
    position = 1 + (index % config.clients_parallel if config.clients_parallel > 1 else 0)
    return ClientTask(
        index=index, client_count=config.clients, dataset=config.dataset, data_dir=config.data_dir,
        indices=np.asarray(indices, dtype=np.int64), stream=streams[index], test_fraction=config.test_fraction,
        extractor=plan.extractor, training=config.training(), mechanism=plan.spec.to_dict(),
        partition=dict(partition), privacy=plan.privacy, randomness=plan.randomness.mode, run_dir=str(run_dir),
        save_model=config.save_models, store_input_density=config.store_input_density, progress=progress,
        position=position, data=config.data, data_options=dict(config.data_options),
        classes=None if config.plan is None else config.plan.classes,
        plan_fingerprint=None if config.plan is None else config.plan.fingerprint,
        release=str(plan.release), holdout=holdout, keep_clean_test=config.keep_clean_test,
        label_release=plan.label_release,
        noise_variance=noise_variance(plan.spec) if config.noise_aware else None,
        dp=config.dp_budget(), extractor_training=None if plan.source is None else plan.source.training_record(index),
        model_path=None if plan.source is None else str(plan.source.model_path(index)),
        release_number=1 if plan.source is None else len(plan.source.history.get(index, ())) + 1,
        prior_releases=() if plan.source is None else tuple(plan.source.history.get(index, ())),
        extractor_options=dict(plan.extractor_options), local_only=config.local_only)


def _training_info(config: ExportConfig) -> dict[str, Any]:
    """Return the manifest's ``training``: the IV-C settings, or under DP-SGD the settings that train instead."""
    info = config.training().to_dict()
    if config.dp_budget() is not None:
        info.update(optimizer="adam", learning_rate=dp_training.DP_LEARNING_RATE, lr_drops=[], decay=0.0,
                    dp_sgd={"target_epsilon": config.cnn_epsilon, "delta": config.cnn_delta,
                            "clipping_norm": dp_training.DEFAULT_CLIPPING_NORM, "sampling": "poisson",
                            "library": dp_training.LIBRARY})
    return info


def fresh_holdouts_of(plan: ExportPlan, clients: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each client's hold-out split (IV-C), drawn from its own stream as its worker would, to be stored."""
    streams = plan.randomness.child_sequences(plan.config.clients)
    return [client_holdout(clients[i], plan.config.test_fraction, streams[i], plan.randomness.mode)
            for i in range(len(clients))]


POLL_SECONDS = 0.25  # how often the parent of a parallel export looks for a Ctrl-C between finished clients


def _run_parallel(tasks: list[ClientTask], plan: ExportPlan, finished: Callable[[ClientOutcome], None], bar: Any,
                  workers: int) -> None:
    """Clients in ``workers`` spawned processes (TensorFlow does not survive fork).

    Each has cpu_count // workers threads, or those a seed fixes (``plan.seeded_threads``, issue 40).
    """
    import multiprocessing
    from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait

    # The resource tracker (a process of its own) warns about the queues' semaphores of workers killed on
    # Ctrl-C, and cleans them up itself; its -W options come from ours.
    quiet_tracker = "ignore::UserWarning:multiprocessing.resource_tracker"
    if quiet_tracker not in sys.warnoptions:
        sys.warnoptions.append(quiet_tracker)
    threads = plan.seeded_threads or max(1, (os.cpu_count() or 1) // workers)
    # Ctrl-C reaches the whole process group. SIGINT is ignored while the workers are spawned (the first
    # ``workers`` submissions spawn them all): they inherit SIG_IGN through exec (Python keeps an ignored SIGINT
    # ignored), so none can get a KeyboardInterrupt before its initializer ignores SIGINT (worker_guard); the
    # parent alone reports it. Then SIGINT only sets a flag, read between short waits: a KeyboardInterrupt
    # raised inside concurrent.futures.wait can leave a future's lock held, and the pool's shutdown then hangs.
    main = threading.current_thread() is threading.main_thread()
    interrupted = threading.Event()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        executor = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                       initializer=init_worker,
                                       initargs=(threads, plan.uses_keras, os.getpid(), tasks[0].run_dir))
        pending = {executor.submit(export_client, task) for task in tasks[:workers]}
    except BaseException:
        if main:
            signal.signal(signal.SIGINT, previous)
        raise
    if main:
        signal.signal(signal.SIGINT, lambda _signum, _frame: interrupted.set())
    try:
        pending |= {executor.submit(export_client, task) for task in tasks[workers:]}
        while pending:
            if interrupted.is_set():
                raise KeyboardInterrupt
            done, pending = wait(pending, timeout=POLL_SECONDS, return_when=FIRST_EXCEPTION)
            for future in done:
                finished(future.result())  # re-raises a worker's error here
                bar.update(1)
    except KeyboardInterrupt:  # Ctrl-C: the workers ignore it (worker_guard); stop them, then one line (issue 24)
        for process in list(getattr(executor, "_processes", {}).values()):
            process.kill()
        executor.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)
        executor.shutdown(wait=True, cancel_futures=True)
