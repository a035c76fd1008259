"""A silo's own model after a federation: fine-tuned or interpolated on its machine, from its own records (issue 41).

Personalization is a silo-side job beside ``ldpfl predict``: it reads the federation's global model
(``RUN/federation/model.pt``) and the silo's own client file, and its result stays on the silo unless its
method lets it travel. Three methods:

* ``clear``: fine-tuning of the global model on the silo's clean training records, without DP. The model is a
  function of those records in clear: it is **local-only** (ε = ∞ if shipped), marked so in its ``model.pt``.
* ``dp``: DP fine-tuning that continues the silo's own training and accountant (``silo_training.continuation``:
  the federation's σ, q and clip over the same records): the silo's guarantee covers the federation's steps and
  the fine-tuning's, composed by the one accountant (``ldpfl.mechanisms.accounting``), so the model may be
  released. With ``proximal`` λ > 0 each step is tied to the global model (Ditto's λ/2·‖θ − θ_global‖², a
  proximal step that uses no record), which keeps more of what the other silos taught.
* ``interpolate``: θ = w·θ_global + (1 − w)·θ_alone of a linear head, where θ_alone is the silo's own model
  trained in house on every training record and w is chosen on those records by cross-fitting (each scored by an
  alone model trained without its fold), never on the test records.
  Local-only, like ``clear``.

Every method reports the silo's own held-out accuracy (overall and per class) of the global and the personalized
model. Those figures are computed from the silo's clear test records and are kept on the silo: not released.

Modules, bottom up: ``records`` (the silo's clean records; errors), ``base_model`` (the global model, checked
against the file; the local-only mark), ``settings`` (the job's parameters), ``own_accuracy`` (the own held-out
figures, per class, and their text; torch-free), ``proximal`` (Ditto's tie), ``training`` and ``evaluation``
(torch), ``outputs`` (``model.pt`` and ``personalization.json``), ``run`` (the job).

A randomized or ``stats:K`` client file holds no clean training records: the app (``ldpfl.api.personalize_job``)
then reruns the silo's export pipeline on its own data and passes the rows in (``records.from_rows``). DP
fine-tuning of a ``stats:K`` file is refused: its federation trained on synthetic records, so no training accountant
covers the silo's own. The silo's accountant, continued, is the training component's (``silo_training.accountant``).
"""
