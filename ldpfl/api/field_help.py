"""What each keyword argument of ``ldpfl.export`` and ``ldpfl.federate`` means: one line per config field.

The fields are those of :class:`~ldpfl.api.fields.ExportFields` and :class:`~ldpfl.api.fields.FederationFields`
(their defaults: :func:`~ldpfl.api.fields.config_defaults`). A text names other fields in backquotes
(```cnn_epsilon```), which :func:`describe` spells as a front end wants: plain names for Python, ``--cnn-epsilon``
in ``ldpfl export --help`` and ``ldpfl federate --help``, which show these texts. The texts of the fields whose
choices come from a registry (``extractor``, ``mechanism``, ``aggregation``, ``perturbation``, the options of
``ldpfl.stage2_federate.options``) are made from it: :func:`export_help` and :func:`federation_help` add them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from types import MappingProxyType

from ldpfl.contract.datasets import paper_extractors
from ldpfl.contract.release_point import FLATTEN, RELEASES
from ldpfl.mechanisms.statistics_model import SHRINKAGE
from ldpfl.stage1_features.export.release import takes_text
from ldpfl.stage1_features.models import cnn
from ldpfl.stage2_federate.options import FEDERATION_OPTIONS
from ldpfl.stage2_federate.perturbation import option_help, perturbation_names, perturbation_wiring
from ldpfl.stage2_federate.server_optimizers import server_optimizer_class, server_optimizer_names
from ldpfl.stage2_federate.strategies import strategy_class, strategy_names

_MARKED = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)`")

EXPORT_HELP: Mapping[str, str] = MappingProxyType({
    "dataset": "Dataset (train and test splits pooled). mnist5k is embedded and needs no download.",
    "data_dir": "Directory holding the dataset files (default: data/<dataset>/).",
    "clients": "Number of clients N to export.",
    "max_clients": "N_h: cut the pool into this many equal groups (LDPFL IV-B); default `clients`.",
    "partition": "How records are split among clients.",
    "beta": "Dirichlet concentration (dirichlet).",
    "unb": "Fraction of non-IID clients (shards).",
    "shards_per_client": "Blocks per client (shards).",
    "test_fraction": "Each client's hold-out share (IV-C: 10 %).",
    "scatter_j": "`extractor` scatter: J, the scales; image sides must be divisible by 2^J (Tramèr and Boneh: 2).",
    "scatter_l": "`extractor` scatter: L, the wavelet orientations (Tramèr and Boneh: 8).",
    "epochs": "CNN training epochs (IV-C: 50). CPU runs often use a few.",
    "batch_size": "CNN batch size (IV-C: 64).",
    "label_epsilon": ("Release each record's label (train and test) by k-ary randomized response at this ε instead "
                      "of in clear; stage 2 corrects for the known noise. Its ε adds to the features' per record  "
                      "[default: clear labels, label ε = inf]"),
    "limit": "Use only this many pooled records (random), for quick runs.",
    "save_models": ("Also save each client's CNN as client_XXX.keras. WARNING: trained on raw data, NOT covered by "
                    "the LDP guarantee."),
    "store_input_density": ("Store the density of 1s of the UNRANDOMIZED encoding per bit (train split) in "
                            "/stats/input_bit_density, for 'ldpfl inspect'. WARNING: this aggregate is NOT covered "
                            "by the LDP guarantee; do not release such files."),
    "clients_parallel": ("Export this many clients at once, in separate processes. Same partition and randomness as "
                         "sequential; with `seed` the same files (each CNN trains with one thread), without it CNN "
                         "features may differ in float rounding (fewer threads each). One per core "
                         "is fastest for the paper's CNNs (2 cores: 16 % more samples/s than 1 process with 2 "
                         "threads, bench/cnn_training.py)."),
    "ray_address": ("Run each client as a task on a Ray cluster: auto (the cluster started here with ray start), "
                    "local (a Ray on this machine for this run) or host:port. The same files as a local run; this "
                    "process writes them (docs/cluster.md)."),
    "ray_cpus_per_client": ("`ray_address`: CPUs each client's task declares (and its TensorFlow threads; one with "
                            "`seed`)."),
    "ray_gpus_per_client": "`ray_address`: GPUs each client's task declares.",
    "keras_backend": ("Keras 3 backend that trains and runs the CNNs  [default: tensorflow; jax under `cnn_epsilon`, "
                      "which needs it]. TensorFlow is the fastest on CPU here (torch 16-23 % and jax 52-57 % slower "
                      "on the Fig. 4 CNN, bench/RESULTS.md); same model, same files."),
    "device": ("Where the CNNs train and run: auto (a GPU the backend sees, else the CPU), cpu, or cuda (needs a "
               "CUDA build of the backend, e.g. `keras_backend` torch with CUDA torch; refused where none is seen). "
               "Seeded GPU runs use deterministic kernels. Not recorded: it changes speed, not files."),
    "cnn_epsilon": ("Train each client's CNN with record-level DP-SGD (jax-privacy, Poisson sampling, noise "
                    "calibrated to this ε over the planned epochs), in (0, 100]. Without it the CNN is trained "
                    "without DP and its outputs carry no finite per-record guarantee."),
    "cnn_delta": "δ of `cnn_epsilon`, in (0, 1)  [default: 1e-5]",
    "local_only": ("Files that never leave the silo (a Flower deployment where only DP-SGD updates leave): clean "
                   "float32 features (`mechanism` none) and true labels, every file marked local_only. NOT private "
                   "(epsilon = inf if shipped)."),
    "overwrite": "Redo every client (removes this run's client files, models, manifest and partition first).",
    "seed": ("Reproducible run, for tests and research only: output seeded this way has NO privacy against anyone "
             "who can guess the seed. Never stored. Default: the OS CSPRNG. It also trains each client's CNN with "
             "one CPU thread, so sequential, `clients_parallel` and Ray runs write the same files; not across GPUs, "
             "Keras backends or CPU types."),
    "from_models": ("Release the records of an earlier export RUN_DIR again, from its saved client CNNs (exported "
                    "with `save_models`), its partition and hold-out splits, instead of training. Its data settings "
                    "apply (leave `dataset`, `clients`, `epochs`, ... out). A second release spends the records' "
                    "privacy again: the manifest records every release and 'ldpfl inspect' shows the total epsilon "
                    "per record. A run exported before hold-out splits were stored needs the `seed` it was made "
                    "with. Needs `out`."),
    "keep_clean_test": ("Also write client_NNN.local.h5 per client: its UNRANDOMIZED test split of the release "
                        "(mechanism none, marked local_only), for 'ldpfl federate `eval_clean`'. A silo predicting "
                        "on its own records releases nothing; these files must never leave the client."),
    "noise_aware": ("bottleneck:K only: train the CNN with Gaussian noise of the mechanism's per-coordinate variance "
                    "after the bottleneck layer (training only, never released), so the layer learns codes that "
                    "survive the noise. Uses only the client's own data: costs no privacy."),
    "data": ("Your own data instead of `dataset`: an image folder (one subfolder per class), .npz, .h5/.hdf5, "
             ".csv/.tsv or .parquet (see data/README.md)."),
    "client_index": ("One silo, one file: the whole `data` is client i of `clients` N (no partitioning); writes "
                     "client_{i:03d}.h5."),
})

FEDERATION_HELP: Mapping[str, str] = MappingProxyType({
    "rounds": "Global rounds E (LDPFL: 80 for FMNIST, 100 for MNIST).",
    "clients_per_round": "Clients k selected per round out of N (default: all N; LDPFL Table I: 9 of 10).",
    "local_epochs": "Local epochs el per round (LDPFL IV-E uses 20; the default is smaller to keep CPU runs short).",
    "batch_size": "Local batch size.",
    "optimizer": ("auto: Adam(0.9, 0.999, eps 1e-8) for MNIST datasets, SGD otherwise (LDPFL IV-E), read from the "
                  "files' dataset name."),
    "lr": "Local learning rate (default 0.001, LDPFL IV-E).",
    "dropout": "Dropout after each hidden layer.",
    "head": ("The model: mlp, the FC model (`hidden`) trained over `rounds` on the files' rows; lda, a closed-form "
             "head over stats:K files (ldpfl export --release stats:K): Fisher's linear discriminant on every "
             "client file's released statistics, pooled, written as the same model.pt as `hidden` none, with no "
             "round, no upload and no randomness (post-processing of the files: it spends nothing). lda runs on "
             "`engine` local only and takes no `dp_sgd` nor `perturbation`; the training options do not apply."),
    "shrinkage": (f"`head` lda: the ridge added to the pooled covariance, in units of its noise's spectral edge "
                  f"(default {SHRINKAGE:g}). Tuning it costs nothing: every value is post-processing of the same "
                  "released statistics."),
    "sample_weighted": "fedavg: weight clients by n_k/n (DP-FedAW eq. 2).",
    "fraction": "fraction: select floor(gamma*N) clients per round (PLDP-FL Algorithm 1).",
    "perturb_target": "Override what the mechanism perturbs: the parameters or the update (local - global).",
    "epsilon": "epsilon of every client when `client_epsilons` is not given.",
    "client_epsilons": "Per-client epsilon: 1,1,10,…, @file.json, @file.csv or a preset name; one value per client.",
    "client_ranges": "pdpm: per-client safe-range lengths L_i (list, @file or preset pldp-tau1/2/3).",
    "client_centres": "pdpm: per-client safe-range centres c_i (list or @file; default `range_centre`).",
    "range_length": "pdpm: L of every client when `client_ranges` is not given (tau = [-1, 1]).",
    "range_centre": "pdpm: centre c of every client.",
    "sign_mode": ("ldpsign: 'update' perturbs local-global and steps W += server_lr*sign(mean) (signSGD, Wu ref. "
                  "[19]); 'literal' perturbs the parameters and sets W = sign(mean) (Wu eq. 10)."),
    "server_lr": "ldpsign update mode: server step size.",
    "drop_per_round": "Selected clients dropped at random after training each round (LDPFL IV-E drops 1).",
    "device": "auto: CUDA when available, else CPU.",
    "threads": "torch CPU threads.",
    "seed": ("Seed for reproducible runs, for tests and research only: output seeded this way has NO privacy against "
             "anyone who can guess the seed. Default: the OS CSPRNG. Never written to outputs."),
    "eval_clean": ("Also evaluate the global model each round on each client's UNRANDOMIZED local test file "
                   "(client_NNN.local.h5 of 'ldpfl export `keep_clean_test`'): clean_test_accuracy in the metrics. A "
                   "silo predicting on its own records releases nothing; see docs/privacy.md."),
    "label_noise_correction": ("Loss correction for labels released by k-RR (ldpfl export `label_epsilon`), with T "
                               "read from the files (Patrini et al. 2017): forward CE(T^T softmax(z), y~) "
                               "(consistent), backward T^-1 applied to the per-class losses (unbiased, higher "
                               "variance), none. auto: forward when the files' labels are randomized, none when "
                               "clear."),
    "dp_sgd": ("Record-level DP-SGD of every silo's local training (Opacus; Abadi et al. 2016): Poisson batches of "
               "rate `sample_rate` (default 0.1365), per-record L2 clip `clip` (default 0.1), Gaussian noise "
               "`noise_multiplier` or calibrated per silo from `target_epsilon` over the whole run, `local_steps` "
               "steps a round. Each silo's accountant (dp-accounting PLD) covers every step it took; metrics.json "
               "states its epsilon under replace-one and add-remove. Needs `perturbation` none; default lr under it: "
               "4."),
    "target_epsilon": ("`dp_sgd`: each silo's epsilon over the whole run (at `delta`, under `neighbours`); sigma is "
                       "calibrated for it. A resumed run may not go past it."),
    "noise_multiplier": "`dp_sgd`: sigma, the noise std over the clip C (instead of `target_epsilon`).",
    "neighbours": ("`dp_sgd`: the relation `target_epsilon` is stated under (the project's replace-one, or the "
                   "DP-SGD literature's add-remove); both figures are reported."),
    "eval_epsilon": ("`dp_sgd`: each silo's epsilon for its test records (at `delta`): its evaluation replies "
                     "leave with Gaussian noise calibrated for one per evaluated round (`eval_every`), per-record "
                     "loss clipped to 10 nats. Default: `target_epsilon`; with `noise_multiplier`, one reply costs "
                     "one DP-SGD round (the run may go on); inf: in clear (test records NOT protected)."),
    "eval_every": ("K: evaluate the global model after every K-th round and after the last only, "
                   "ceil(`rounds`/K) evaluations (the other rounds' test figures are empty). Under `dp_sgd` each "
                   "evaluation reply then carries less noise at the same `eval_epsilon`."),
    "local_steps": "`dp_sgd`: DP-SGD steps of each silo per round (they replace `local_epochs`).",
    "server_momentum": "Server momentum beta (FedAvgM, Hsu et al. 2019): v <- beta v + (aggregate - W), W <- W + v.",
    "server_params": ("NAME=VALUE: a parameter of `server_optimizer` (repeat for each); see `server_optimizer` for "
                      "the names and defaults."),
    "max_update_norm": ("The server refuses a silo's upload whose update (upload - global model, or the uploaded "
                        "update) has an L2 norm above this; the silo is named in the round's 'rejected' and left out "
                        "of the round. Default: 10 x the lower median update norm of the round's uploads (scaled up "
                        "for a silo whose perturbation adds more noise, or with more training rows, than the median "
                        "silo)."),
    "max_client_weight": ("Cap on any silo's normalized aggregation weight (e.g. 0.3); the excess is shared by the "
                          "others in proportion to their weights. Below 1/n the weights are equal."),
    "trim_fraction": ("trimmed-mean: the fraction beta of the values dropped at each end of every coordinate "
                      "(floor(beta*n) silos; default 0.2). A beta that trims no silo at the run's clients per "
                      "round is refused, naming the smallest that trims one."),
    "outlier_report": ("fedavg and the other non-robust rules: record each round each upload's distance from the "
                       "round's coordinate-wise median, in units of the typical silo's, and flag a silo past 3 "
                       "(docs/cross-silo.md); the robust rules always report the silos they discount or clip."),
})

def export_help() -> dict[str, str]:
    """Return the text of each ``ExportConfig`` field: ``EXPORT_HELP``, and the extractors' and mechanisms'."""
    paper = ", ".join(f"{extractor} for {'/'.join(names)}" for extractor, names in paper_extractors().items()
                      if extractor != cnn.NO_EXTRACTOR)
    takes: dict[str, list[str]] = {}
    for name, kind in RELEASES.items():
        if name != FLATTEN:
            takes.setdefault(takes_text(kind.domains), []).append(kind.usage)
    others = ", ".join(f"{' and '.join(kinds)} {'take' if len(kinds) > 1 else 'takes'} {text}"
                       for text, kinds in takes.items())
    return {**EXPORT_HELP, "extractor": (
        "Feature extractor: mnist-cnn (Fig. 3), cifar-cnn (Fig. 4), none (raw inputs), scatter (weight-free wavelet "
        "scattering + GroupNorm, Tramèr and Boneh 2021: the same for every silo, learned from no record). auto: the "
        f"paper's choice ({paper}, none otherwise); under `cnn_epsilon`, dp-cnn wherever it would be a CNN. DP-SGD "
        "variants: mnist-cnn-gn, cifar-cnn-gn (GroupNorm for BatchNorm) and dp-cnn (small tanh net), each a "
        "labelled deviation from the paper."),
        "mechanism": ("Randomization: a bit mechanism over the fixed-point encoding, a float mechanism over the "
                      f"features, or none (NOT private). `release` {others}.")}


def federation_help() -> dict[str, str]:
    """Return the text of each ``FederationConfig`` field: ``FEDERATION_HELP``, and the registries' own."""
    wirings = {name: perturbation_wiring(name) for name in perturbation_names()}
    perturbations = "; ".join(f"{name}: {w.summary} [perturbs the {w.target}]" for name, w in wirings.items())
    strategies = "; ".join(f"{name}: {strategy_class(name).SUMMARY}" for name in strategy_names())
    return {**FEDERATION_HELP, **{name: option_help(name) for name in FEDERATION_OPTIONS},
            "server_optimizer": server_optimizers_help(),
            "aggregation": strategies + " (P_i sums to 1, so one uniform omega could select nobody: omega is drawn "
                           "uniformly below the largest P_i, the same as redrawing it until someone is selected).",
            "perturbation": f"Model perturbation of each client's upload. {perturbations}."}


def server_optimizers_help() -> str:
    """Return the text of ``server_optimizer``: each registered optimizer, its ``server_params`` and defaults."""
    parts = []
    for name in server_optimizer_names():
        cls = server_optimizer_class(name)
        takes = ", ".join(f"{key}={spec.default:g} in {spec.interval()}" for key, spec in cls.PARAMETERS.items())
        parts.append(f"{name}: {cls.SUMMARY}" + (f" [`server_params` {takes}]" if takes else ""))
    return ("The server's step along each round's aggregate, with its state kept across rounds (in the "
            f"checkpoint). {'; '.join(parts)}.")


def describe(table: Mapping[str, str], name: str, spell: Callable[[str], str] = str) -> str:
    """Return field ``name``'s text in ``table`` with each field it names spelled by ``spell`` (default: as is)."""
    return _MARKED.sub(lambda match: spell(match.group(1)), table[name])


__all__ = ["EXPORT_HELP", "FEDERATION_HELP", "describe", "export_help", "federation_help"]
