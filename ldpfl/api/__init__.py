"""The typed Python API of ldpfl's jobs: one function per job, each returning a frozen result.

The functions are reached from the top-level package, which imports each one on first use (``import ldpfl``
stays light; TensorFlow and torch load only inside the jobs that need them)::

    import ldpfl

    export = ldpfl.export(dataset="mnist5k", clients=2, extractor="none", limit=300, seed=1, out="runs/api")
    federation = ldpfl.federate("runs/api", rounds=2, hidden=(16,), seed=1)

* ``export_job``   - :func:`~ldpfl.api.export_job.export`: stage 1 (LDPFL Algorithm 1 lines 1-10);
* ``plan_job``     - :func:`~ldpfl.api.plan_job.plan`: the shared plan of a cross-silo federation;
* ``gather_job``   - :func:`~ldpfl.api.gather_job.gather`: the silos' exports into one run directory;
* ``federate_job`` - :func:`~ldpfl.api.federate_job.federate`: stage 2 on the local or the Flower engine;
* ``predict_job``  - :func:`~ldpfl.api.predict_job.predict`: a silo's records through the federated model;
* ``inspect_job``  - :func:`~ldpfl.api.inspect_job.inspect`: what the files hold and whether they verify;
* ``demo_job``     - :func:`~ldpfl.api.demo_job.demo`: export, federate and inspect on MNIST-5k, summarized;
* ``mechanism_reports`` - the registered mechanisms and the privacy report of one (``ldpfl mechanisms``);
* ``fields``       - the keyword arguments of the export and federation configs, typed, with their defaults;
* ``field_help``   - what each of those arguments means (``--help`` shows the same texts);
* ``text``         - the text summaries of the results, as the command line prints them;
* ``progress``     - the optional progress callback every job takes.

The ``ldpfl`` commands call these functions: a command maps its flags to the arguments, and the
``ParameterError`` a function raises names its parameter, which the command line shows as the flag. Every
check is made here, so the API refuses what the command line refuses, with the same message.
"""
