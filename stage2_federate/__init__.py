"""Stage 2 of ldpfl: offline federated learning over the randomized HDF5 feature files.

The package follows LDPFL Algorithm 1 lines 11-25 (server initializes, broadcasts, k-of-N clients train
``el`` local epochs, the server aggregates) with the model perturbations and aggregation rules of
Wu et al. (Gaussian, ldpsign; weighted and probability-based aggregation), PLDP-FL (PDPM, γ·N
selection) and DP-FedAW (cosine-similarity weights, Gaussian noise on updates).

Modules (one concern each):

* ``aggregation``  - the aggregation math as pure functions over numpy arrays;
* ``strategies``   - a registry of strategies (client selection + aggregation), one class per paper rule;
* ``perturbation`` - a mechanism per client, with its own budget and Generator, wired to the upload;
* ``budgets``      - personalized ε / safe-range presets and list parsing;
* ``data``         - validated client data in memory, packed bits unpacked per batch in torch;
* ``model``        - the fully-connected model and local training;
* ``federation``   - ``FederationConfig``, ``run_federation``, checkpoint and resume;
* ``outputs``      - metrics CSV/JSON, the accuracy plot, atomic writes;
* ``runtime``      - torch process settings the CLI applies before torch loads;
* ``cli``          - ``ldpfl federate``.

Importing this package imports nothing heavy; torch loads in ``data``, ``model`` and ``federation``.
"""
