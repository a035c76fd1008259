"""``ldpfl export``, one module per step of the job (Algorithm 1 lines 1-10), errors at the bottom.

* ``errors``       - ``ExportError``: a run that cannot start or resume as asked;
* ``config``       - ``ExportConfig``: everything the export takes, validated;
* ``silo``         - the records an export reads (a registered dataset or a silo's own data) and a silo's share;
* ``partition``    - how the pooled records are split among clients (iid, Dirichlet, shards) and held out;
* ``plan``         - ``ExportPlan``: config, records, partition and mechanism checked before any work;
* ``from_models``  - planning a re-release from the CNNs an earlier export saved (``--from-models``);
* ``release``      - the release points and the mechanisms each takes;
* ``write``        - encode → randomize → pack → write, one row batch at a time;
* ``worker``       - one client's job: hold-out, CNN training, features, release, its file;
* ``worker_guard`` - parallel workers that die with the export;
* ``ray_task``     - one client as a Ray task on some node, its files returned as bytes;
* ``ray_executor`` - the clients as Ray tasks (``ray_address``), their files written by the driver;
* ``stored``       - what the run directory keeps for later runs: the partition, the saved CNNs' names;
* ``run_dir``      - one export at a time, stale temporaries, and resuming;
* ``manifest``     - the manifest's view of the export and each client's release guarantee;
* ``results``      - ``ExportResult`` and ``ClientSummary``;
* ``run``          - ``run_export``: the steps in order, clients in parallel or on Ray.
"""
