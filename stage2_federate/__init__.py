"""Stage 2 of ldpfl: offline federated learning over the randomized HDF5 feature files.

The package follows LDPFL Algorithm 1 lines 11-25 (server initializes, broadcasts, k-of-N clients train
``el`` local epochs, the server aggregates) with the model perturbations and aggregation rules of
Wu et al. (Gaussian, ldpsign; weighted and probability-based aggregation), PLDP-FL (PDPM, γ·N
selection) and DP-FedAW (cosine-similarity weights, Gaussian noise on updates).

Modules (one concern each):

* ``aggregation``  - the aggregation math as pure functions over numpy arrays;
* ``strategies``   - a registry of strategies (client selection + aggregation), one class per paper rule;
* ``perturbation`` - a mechanism per client, wired by the mechanism's declared ``FEDERATION``, and the
  server rule;
* ``options``      - the scalar federation options (clip, δ, sensitivity, sample rate) the wirings take;
* ``budgets``      - personalized ε / safe-range presets and list parsing;
* ``config``       - ``FederationConfig`` (no torch);
* ``data``         - validated client data in memory, packed bits unpacked per batch in torch;
* ``model``        - the fully-connected model and local training;
* ``streams``      - every random stream of a run, with exact save and restore;
* ``plan``         - everything a run fixes before round 1 (model, perturbations, strategy, records);
* ``rounds``       - one round as a client step and a server step, pure of I/O (shared by engines);
* ``silo_training`` - how a silo trains, one component per way (plain, record-level noisy): its step, reply bound,
  accountant and resume rule, asked by the loop, the reply checks, the ledger and the guarantee;
* ``server_optimizers`` - the server's step after the strategy, with state kept across rounds (FedAvgM, FedAdam);
* ``loop``, ``driver`` - the round loop behind a ``Transport`` and the run around it, one for both engines;
* ``checkpoint``   - the checkpoint and the resume checks;
* ``federation``   - the local engine: ``run_federation``, rounds in one process (``in_process``);
* ``flower_engine`` - the Flower engine: the same loop, its messages as the transport;
* ``outputs``, ``run_outputs`` - metrics CSV/JSON, the accuracy plot, and what a run writes when;
* ``outdir``, ``console`` - one run per output directory, and the warning line on the terminal;
* ``runtime``      - torch process settings the CLI applies before torch loads;
* ``closed_form``  - the closed-form LDA head over ``stats:K`` files' pooled released statistics (no rounds);
* ``clean_files``  - the silos' local-only clean test files (``--eval-clean``);
* ``outliers``, ``upload_hashes``, ``rule_checks`` - outliers named, stale and copied uploads refused, robust
  rules that cannot act refused (issue 42);
* ``personalize``  - a silo's personalization of the global model on its own records (issue 41).

The command ``ldpfl federate`` lives in ``ldpfl.commands.federate``, on top of this package; docs/stage2-map.md
draws the rooms and follows one round through them.

Importing this package imports nothing heavy; torch loads in ``data``, ``model``, ``streams``,
``plan``, ``rounds``, ``checkpoint`` and ``federation``.
"""
